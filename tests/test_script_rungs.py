"""A script's own flags as rungs (`ablate --rung NAME='ARGS or ENV=VALUE' -- COMMAND`): the words of a rung merged
into the command (every flag form, replaced not duplicated, variables), the refusals, a ladder file, the rungs in a
plan (cumulative and each), what one run starts, the note for a rung observed doing what the rung above did, and
the rungs in results.json and the report. All in this process, on hand-built records; one slow test ablates a
small plain loop with its own flags end to end."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trainfast.ablation.script_rungs import add_script_rungs, note_unchanged, rung_command, rung_env
from trainfast.launch import Command
from trainfast.recipe import Recipe
from trainfast.results import AblationResult, Rung, Status
from trainfast.scriptargs import (UNCHANGED, CommandChange, RungError, check_rungs, merge_args, parse_rung,
                                  read_ladder, script_start)

ROOT = Path(__file__).resolve().parents[1]
BASE = ["python", "-u", "train.py", "DATA", "--amp", "--lr", "0.1", "--dtype=fp16", "-b", "64", "--layers", "1",
        "2"]


# --- the words merged into the command ------------------------------------------------------------------------

@pytest.mark.parametrize("args, expected", [
    # a bare flag the command has: kept once, its positional neighbour untouched
    (["--amp"], BASE),
    # `--flag value` replaced where it stands
    (["--lr", "0.2"], [*BASE[:6], "0.2", *BASE[7:]]),
    # `--flag=value` in the command, `--flag value` in the rung (and the other way round)
    (["--dtype", "bf16"], [*BASE[:7], "--dtype", "bf16", *BASE[8:]]),
    (["--lr=0.3"], [*BASE[:5], "--lr=0.3", *BASE[7:]]),
    # a short flag as given; a negative number is a value, not a flag
    (["-b", "-1"], [*BASE[:8], "-b", "-1", *BASE[10:]]),
    # a new flag appended, bare or with values
    (["--compile"], [*BASE, "--compile"]),
    (["--workers", "8", "--pin"], [*BASE, "--workers", "8", "--pin"]),
    # a flag of several values: as many of the command's as the rung gives are replaced
    (["--layers", "3", "4"], [*BASE[:10], "--layers", "3", "4"]),
])
def test_a_rungs_flags_replace_the_commands_own_or_are_appended(args, expected):
    assert merge_args(list(BASE), args) == expected


def test_the_interpreters_own_flags_and_a_trailing_separator_are_left_alone():
    # `-u` before the script is python's, never the script's: a rung's -u is the script's own
    assert merge_args(["python", "-u", "t.py", "--x"], ["-u"]) == ["python", "-u", "t.py", "--x", "-u"]
    assert merge_args(["python", "t.py", "--", "rest"], ["--amp"]) == ["python", "t.py", "--amp", "--", "rest"]
    assert script_start(["python", "-m", "pkg.train", "--a"]) == 3
    assert script_start(["python", "-X", "dev", "t.py"]) == 4
    assert script_start(["torchrun", "--nproc-per-node", "2", "train.py", "--a"]) == 4
    assert script_start(["./train.sh", "--a"]) == 1


def test_variables_lead_the_rung_and_a_later_rung_replaces_an_earlier_ones_flags():
    change = parse_rung("tf32=NVIDIA_TF32_OVERRIDE=1 A_B='x y' --amp --amp-dtype bfloat16")
    assert change == CommandChange("tf32", ("--amp", "--amp-dtype", "bfloat16"),
                                   {"NVIDIA_TF32_OVERRIDE": "1", "A_B": "x y"})
    both = parse_rung("a=X=1 --lr 1 --amp").then(parse_rung("b=X=2 --lr 2 --compile"))
    assert both == CommandChange("b", ("--lr", "2", "--amp", "--compile"), {"X": "2"})


@pytest.mark.parametrize("text, message", [
    ("compile", "give NAME='ARGS or ENV=VALUE ...'"),
    ("compile=", "the rung changes nothing"),
    ("compile=  ", "the rung changes nothing"),
    ("2x=--a", "the rung name '2x' must start with a letter"),
    ("a/b=--a", "the rung name 'a/b' must start with a letter"),
    ("x=MY-VAR=1", "'MY-VAR' is not an environment variable name"),
    ("x=1X=1 --a", "'1X' is not an environment variable name"),
    ("x=TRAINFAST_RECIPE={}", "TRAINFAST_RECIPE is set by trainfast in every run"),
    ("x=data --a", "'data' is neither a flag nor ENV=VALUE"),
    ("x=--a 'open", "No closing quotation"),
])
def test_a_rung_that_cannot_work_is_refused_naming_it(text, message):
    with pytest.raises(RungError) as refused:
        parse_rung(text)
    assert f"--rung {text!r}" in str(refused.value) and message in str(refused.value)


def test_a_rung_named_as_a_switch_is_measured_beside_it_and_one_named_twice_is_refused():
    named = check_rungs([parse_rung("compile=--torchcompile"), parse_rung("cl=--channels-last")],
                        ["baseline", "compile"])
    assert [(r.name, r.args) for r in named] == [("own_compile", ("--torchcompile",)), ("cl", ("--channels-last",))]
    with pytest.raises(RungError, match="--rung a: two rungs have this name"):
        check_rungs([parse_rung("a=--x"), parse_rung("a=--y")], [])
    with pytest.raises(RungError, match="--rung own_amp: two rungs have this name"):
        check_rungs([parse_rung("amp=--amp"), parse_rung("own_amp=--bf16")], ["amp"])


def test_a_ladder_file_gives_rungs_and_its_mistakes_are_named(tmp_path):
    good = tmp_path / "ladder.yaml"
    good.write_text("- {name: bf16, args: --amp --amp-dtype bfloat16}\n"
                    "- {name: cl, args: [--channels-last], env: {OMP_NUM_THREADS: 2}}\n")
    assert read_ladder(str(good)) == [CommandChange("bf16", ("--amp", "--amp-dtype", "bfloat16")),
                                      CommandChange("cl", ("--channels-last",), {"OMP_NUM_THREADS": "2"})]
    for text, message in [("name: x", "must be a list of rungs"), ("- {name: x}", "rung 1: the rung changes nothing"),
                          ("- {name: x, flags: --a}", "rung 1: unknown key(s) flags"),
                          ("- {name: x, args: --a}\n- {name: 'y z', args: --b}", "rung 2: the rung name 'y z'"),
                          ("- [unclosed", "not YAML")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(RungError) as refused:
            read_ladder(str(bad))
        assert f"--ladder {bad}" in str(refused.value) and message in str(refused.value), refused.value


# --- the rungs in a plan, and what a run starts ----------------------------------------------------------------

def plan_with(mode: str) -> list[Rung]:
    base = Recipe()
    plan = [Rung("baseline", {}, base), Rung("amp", {"precision": "bf16"}, base.replace(precision="bf16"))]
    add_script_rungs(plan, [parse_rung("own=X=1 --lr 0.5 --amp"), parse_rung("cl=--channels-last --lr 0.2")],
                     ["python", "t.py", "--lr", "0.1"], mode)
    return plan


def test_cumulative_script_rungs_carry_the_switches_and_the_flags_above():
    plan = plan_with("cumulative")
    own, cl = plan[2], plan[3]
    assert own.changes == {} and own.recipe.precision == "bf16"        # on top of the amp rung
    assert own.script["args"] == ["--lr", "0.5", "--amp"] and own.script["env"] == {"X": "1"}
    assert own.script["command"] == ["python", "t.py", "--lr", "0.5", "--amp"]
    assert cl.script["args"] == ["--channels-last", "--lr", "0.2"]      # its own words, as given
    assert cl.script["command"] == ["python", "t.py", "--lr", "0.2", "--amp", "--channels-last"]
    assert cl.script["command_env"] == {"X": "1"} and cl.script["switches"] == 4
    command = rung_command(cl, Command(("python", "t.py", "--lr", "0.1"), nproc=2))
    assert command.launch_argv()[-5:] == ["t.py", "--lr", "0.2", "--amp", "--channels-last"] and command.nproc == 2
    assert rung_env(cl) == {"X": "1"} and rung_env(plan[1]) == {}
    assert rung_command(plan[1], command) is command                  # a switch's rung: the command as it is


def test_each_script_rung_starts_from_the_baseline():
    plan = plan_with("each")
    own, cl = plan[2], plan[3]
    assert own.recipe.precision == "fp32" and cl.script["command"] == ["python", "t.py", "--lr", "0.2",
                                                                       "--channels-last"]
    assert cl.script["command_env"] == {} and cl.script["on"] == "baseline"


# --- observed changing nothing --------------------------------------------------------------------------------

def seen(precision: str = "fp32", memory_format: str | None = "contiguous") -> dict:
    """A run's record with the `observed` section a script's run writes (probe/), built by hand."""
    return {"throughput": 100.0, "observed": {
        "precision": precision, "autocast": precision != "fp32", "compiled": False, "recompiles": 0,
        "optimizer": "SGD", "optimizer_implementation": "foreach", "loader": None, "memory_format": memory_format,
        "by": {"precision": "script"} if precision != "fp32" else {}}}


def test_a_flag_whose_runs_were_observed_doing_what_the_rung_above_did_says_so():
    plan = plan_with("cumulative")
    plan[0].repeats, plan[1].repeats = [seen()], [seen("bf16")]
    plan[2].repeats = [seen("bf16")]                                   # --amp on top of trainfast's amp: nothing new
    plan[1].repeats[0]["observed"]["by"] = {"precision": "trainfast"}  # (who turned it on is not what it does)
    plan[3].repeats = [seen("bf16", "channels_last")]                  # --channels-last: seen
    note_unchanged(plan)
    assert UNCHANGED in plan[2].script["unchanged"] and "as amp's (bf16 autocast" in plan[2].reason
    assert "unchanged" not in plan[3].script and not plan[3].reason
    note_unchanged(plan)                                                 # said once, however many runs come after
    assert plan[2].reason.count(UNCHANGED) == 1


def test_records_without_observations_give_no_note():
    plan = plan_with("each")
    plan[0].repeats, plan[2].repeats = [{"throughput": 1.0}], [seen()]   # an older record: nothing observed
    plan[3].repeats = [{"throughput": 1.0}]
    note_unchanged(plan)
    assert not plan[2].script.get("unchanged") and not plan[3].script.get("unchanged")
    plan[0].repeats = [seen()]                                           # each: compared with the baseline
    note_unchanged(plan)
    assert plan[2].script.get("unchanged") and not plan[3].script.get("unchanged")


def test_results_json_and_the_report_carry_the_rungs_args_and_the_note(tmp_path):
    from trainfast.report.format import rung_label
    from trainfast.report.results_json import results_dict
    from trainfast.report.summary import best_line
    from trainfast.report.table import Columns, table_rows

    plan = plan_with("each")
    for rung in plan:
        rung.status = Status.DONE
    plan[0].repeats, plan[2].repeats = [seen()], [seen()]
    note_unchanged(plan)
    r = plan[2].result
    r.verdict, r.speedup, r.throughput, r.repeats = "no measurable difference", 1.0, 1.0, 1
    result = AblationResult(plan, {}, tmp_path, plan[3].recipe, "cl", {})
    data = results_dict(result)
    own = data["rungs"][2]
    assert own["script"]["args"] == ["--lr", "0.5", "--amp"] and own["script"]["env"] == {"X": "1"}
    assert UNCHANGED in own["script"]["unchanged"] and UNCHANGED in own["effect_reason"]
    assert data["best"]["command"] == ["python", "t.py", "--lr", "0.2", "--channels-last"]
    assert "script" not in data["rungs"][1]                            # a switch's rung: as before
    assert rung_label(plan[2]) == "+own (X=1 --lr 0.5 --amp)"
    row = next(r for r in table_rows(plan, Columns(cumulative=False, step_alone=False)) if r[0].startswith("+own"))
    assert UNCHANGED in row[3]                                           # beside its verdict
    assert "run: `python t.py --lr 0.2 --channels-last`" in best_line(result)


def test_the_built_in_run_refuses_a_scripts_rung():
    from trainfast.ablation import ablate
    from trainfast.recipe import RecipeError

    with pytest.raises(RecipeError, match="needs the script"):
        ablate(script_rungs=[parse_rung("own=--amp")])


# --- end to end -------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_plain_loops_own_flags_are_ablated_as_rungs(tmp_path):
    """Two rungs of a plain loop's own flags, one repeat each: measured like switches' rungs, their args and
    variables in results.json, the command lines their runs started, the report naming them. In this process,
    through the API the command line calls with its --rung texts (the command line passing them:
    test_the_cli_passes_the_rungs_and_the_ladder_file_to_ablate_and_tune), a plain loop's millisecond steps timed
    over 8 steps, not stretched to the 2 s the command line's timing budget gives each of the five runs."""
    from trainfast.ablation import TimingBudget, ablate_command

    out = tmp_path / "own"
    script = str(ROOT / "tests" / "scripts" / "own_flags_loop.py")
    ablate_command([sys.executable, script, "--steps", "100000", "--lr", "0.05"], device="cpu", out=out, repeats=1,
                   show=False, settle_within_s=0, mode="each", rungs=["amp"], amp_dtype="bf16",
                   script_rungs=["bf16=--amp", "dtype=--dtype bf16", "cl=OWN_FLAGS_NOTE=seen --channels-last"],
                   budget=TimingBudget(steps=8, min_seconds=0.0))
    results = json.loads((out / "results.json").read_text())
    by_name = {r["name"]: r for r in results["rungs"]}
    assert list(by_name) == ["baseline", "amp", "bf16", "dtype", "cl"]
    for name in ("amp", "bf16", "dtype", "cl"):
        assert by_name[name]["status"] == "done" and by_name[name]["throughput"] > 0
        assert by_name[name]["verdict"], by_name[name]
    assert by_name["bf16"]["script"]["args"] == ["--amp"]
    assert by_name["cl"]["script"]["env"] == {"OWN_FLAGS_NOTE": "seen"}
    # What each run did, observed: the script's --amp and trainfast's amp run bf16; its --dtype bf16 is entered only
    # on CUDA, so on this CPU its rung runs fp32 and says the flag changed nothing.
    observed = {name: by_name[name]["observed"] for name in by_name}
    assert observed["amp"]["precision"] == "bf16" and observed["amp"]["by"]["precision"] == "trainfast"
    assert observed["bf16"]["precision"] == "bf16" and observed["bf16"]["by"]["precision"] == "script"
    assert observed["dtype"]["precision"] == "fp32" and observed["baseline"]["precision"] == "fp32"
    assert "changed nothing trainfast could see" in by_name["dtype"]["script"]["unchanged"]
    assert "unchanged" not in by_name["bf16"]["script"] and "unchanged" not in by_name["cl"]["script"]
    started = json.loads((out / "rungs" / "cl-r0" / "command.json").read_text())
    assert started["argv"][-3:] == ["--lr", "0.05", "--channels-last"]                 # each: on the baseline
    assert started["env"]["OWN_FLAGS_NOTE"] == "seen"
    assert "note: seen" in (out / "rungs" / "cl-r0" / "log.txt").read_text()
    baseline = json.loads((out / "rungs" / "baseline-r0" / "command.json").read_text())
    assert baseline["argv"][-4:] == ["--steps", "100000", "--lr", "0.05"] and "OWN_FLAGS_NOTE" not in baseline["env"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["rungs"]["bf16"]["args"] == ["--amp"]                 # a resume must ask for the same flags
    report = (out / "report.md").read_text()
    assert "+bf16 (--amp)" in report and "+cl (OWN_FLAGS_NOTE=seen --channels-last)" in report


# --- tune: the script's rungs that gain, combined with the switches -------------------------------------------

def test_tune_combines_the_script_rungs_that_gain_with_the_switches_and_names_the_command(tmp_path):
    from conftest import scored_rung

    from trainfast.ablation.scoring import score_rungs
    from trainfast.tune import combine, combine_stage, decide
    from trainfast.tune.combine import Decision
    from trainfast.tune.outputs import tune_md
    from trainfast.tune.script import command_line, merged_script, stamp_stage

    command = ["python", "t.py", "--lr", "0.1", "--workers", "2"]
    own = [parse_rung("fast=--amp --workers 4"), parse_rung("noop=--quiet"), parse_rung("more=X=1 --workers 8")]
    planned = [Rung("baseline", {}, Recipe())]
    add_script_rungs(planned, own, command, "each")

    def scored(rates: dict[str, float], scripts: dict[str, dict]) -> list[Rung]:
        rungs = [scored_rung(name, [rate * 0.99, rate, rate * 1.01], 0.95,
                             **({"channels_last": True} if "channels_last" in name else {}))
                 for name, rate in rates.items()]
        for rung in rungs:
            rung.script = dict(scripts.get(rung.name, {}))
        score_rungs(rungs, {"fp32": 1e12}, [0.95, 0.951, 0.949], mode="each")
        return rungs

    singles = scored({"baseline": 100, "channels_last": 130, "fast": 170, "noop": 101, "more": 150},
                     {r.name: r.script for r in planned})
    recipe, names, dropped = combine(Recipe(), singles, planned_steps=None)
    assert names == ["channels_last", "fast", "more"] and "no firm gain" in dropped["noop"]
    together = merged_script(singles, names, command)
    # the later rung's --workers replaces the earlier's, which replaced the command's own; variables joined
    assert together["command"] == ["python", "t.py", "--lr", "0.1", "--workers", "8", "--amp"]
    assert together["command_env"] == {"X": "1"} and merged_script(singles, ["channels_last"], command) == {}
    stage = combine_stage(Recipe(), singles, recipe, names)
    stamp_stage(stage, singles, names, command)
    by_name = {r.name: r for r in stage}
    assert by_name["single-fast"].script["command"][-3:] == ["--workers", "4", "--amp"]
    assert by_name["combined"].script == together and by_name["combined"].recipe.channels_last
    assert by_name["without-fast"].script["command"] == ["python", "t.py", "--lr", "0.1", "--workers", "8"]
    assert by_name["without-more"].script["command_env"] == {} and not by_name["baseline"].script
    measured = scored({"baseline": 100, "single-fast": 170, "combined": 260, "without-channels_last": 200,
                       "without-fast": 190, "without-more": 220}, {r.name: r.script for r in stage})
    for made, got in zip(stage, measured):
        got.recipe = made.recipe
    decision = decide(measured)
    assert decision.name == "combined" and decision.script == together and decision.recipe.channels_last
    assert command_line(decision.script) == "X=1 python t.py --lr 0.1 --workers 8 --amp"
    lines = tune_md(Decision(Recipe(), "combined", script=together), AblationResult(singles, {}, tmp_path, None,
                    None, {}), None, 1.0, 60.0, None, None, None, [])
    assert any("run `X=1 python t.py --lr 0.1 --workers 8 --amp`" in line for line in lines)


def test_tune_refuses_a_scripts_rung_without_the_script():
    from trainfast.recipe import RecipeError
    from trainfast.tune.options import tune_options

    with pytest.raises(RecipeError, match="needs the script"):
        tune_options({"script_rungs": [parse_rung("own=--amp")]})


def test_the_cli_passes_the_rungs_and_the_ladder_file_to_ablate_and_tune(monkeypatch, tmp_path):
    import importlib

    from trainfast.cli import main

    class Captured(Exception):
        pass

    def stand_in(*args, **kwargs):
        raise Captured(kwargs)
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text("- {name: cl, args: --channels-last}\n")
    for module, name in (("trainfast.ablation", "ablate_command"), ("trainfast.tune", "tune")):
        monkeypatch.setattr(importlib.import_module(module), name, stand_in)
        command = "ablate" if name == "ablate_command" else "tune"
        with pytest.raises(Captured) as info:
            main([command, "--rung", "bf16=--amp --amp-dtype bfloat16", "--ladder", str(ladder), "--",
                  "python", "t.py"])
        assert info.value.args[0]["script_rungs"] == [CommandChange("bf16", ("--amp", "--amp-dtype", "bfloat16")),
                                                      CommandChange("cl", ("--channels-last",))]
