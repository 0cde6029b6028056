"""trainfast tune: the combination logic on synthetic measurements (independent gains combine, a harmful
interaction is dropped, a switch that loses accuracy is excluded, compile's break-even), best.yaml, and a
real search on the built-in data that resumes where it stopped."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from conftest import scored_rung

from trainfast import Recipe
from trainfast.ablation import plan_rungs
from trainfast.ablation.scoring import score_rungs
from trainfast.results import EffectLabel, Rung, Status
from trainfast.tune import (batch_finding, batch_rungs, break_even_steps, combine, combine_stage, decide, parse_budget,
                            tune)

ROOT = Path(__file__).resolve().parents[1]
O1 = {"precision": "bf16", "precision_level": "autocast"}
O2 = {"precision": "bf16", "precision_level": "master"}


def rung(name: str, rate: float, accuracy: float = 0.95, **changes) -> Rung:
    return scored_rung(name, [rate * 0.99, rate, rate * 1.01], accuracy, **changes)


def scored(rungs: list[Rung]) -> list[Rung]:
    score_rungs(rungs, {"fp32": 1e12, "bf16": 1e12}, [0.95, 0.951, 0.949], mode="each")
    return rungs


class Launching:
    """The work run_ladder is given, its runs made by `launch` (no process started); the rest (device, metric,
    what a run reveals) is `work`'s, or a built-in run's on a CPU."""

    def __init__(self, launch, work=None):
        import torch

        self.launch, self.work = launch, work
        self.dev = work.dev if work is not None else torch.device("cpu")
        self.flops_per_sample = work.flops_per_sample if work is not None else None
        self.settings = dict(work.settings) if work is not None else {}
        self.learned = work.learned if work is not None else {}

    def launcher(self, measure):
        return self.launch

    def metric(self, measure):
        return self.work.metric(measure) if self.work is not None else ("accuracy", "max")

    def after_run(self, plan):
        return self.work.after_run(plan) if self.work is not None else None


def test_batch_size_search_climbs_while_firmly_faster_with_accuracy_kept_and_is_reported_apart():
    from trainfast.ablation.scoring import pick_best
    from trainfast.results import AblationResult

    base = Recipe(batch_size=64, precision="bf16")
    assert [r.recipe.batch_size for r in batch_rungs(base, train_size=1000)] == [64, 128, 256]   # 2 steps an epoch
    assert [r.recipe.batch_size for r in batch_rungs(base, train_size=100)] == [64]
    assert all(r.recipe.precision == "bf16" for r in batch_rungs(base, train_size=10_000))   # the recipe, rescaled

    def search(rates: list[float], accuracies: list[float]) -> dict:
        rungs = [scored_rung(f"batch-{b}", [rate * 0.99, rate, rate * 1.01], acc,
                             **({"batch_size": b} if b != 64 else {}))
                 for b, rate, acc in zip((64, 128, 256, 512), rates, accuracies)]
        score_rungs(rungs, {"fp32": 1e12}, [0.95, 0.951, 0.949], mode="cumulative")
        best, tie, odds = pick_best(rungs)
        return batch_finding(AblationResult(rungs, {}, Path("."), best.recipe, best.name, {}, tie=tie))

    # 128 firmly faster than 64, 256 and 512 not firmly faster than 128: 128
    assert search([100, 150, 152, 151], [0.95] * 4)["batch_size"] == 128
    # a size that does not gain is passed over when a larger one gains against the size chosen so far
    assert search([100, 150, 152, 300], [0.95] * 4)["batch_size"] == 512
    # 256 gains, but loses accuracy outside the band: it is not a candidate, 128 is kept
    found = search([100, 150, 200, 210], [0.95, 0.95, 0.80, 0.80])
    assert found["batch_size"] == 128 and found["sizes"]["batch-256"]["metric_worse"]
    assert search([100, 101, 99, 100], [0.95] * 4)["batch_size"] == 64          # nothing gains: the size stays


def test_independent_gains_combine_and_the_rest_is_dropped_with_the_reason():
    singles = scored([rung("baseline", 100), rung("autocast-bf16", 170, **O1), rung("master-bf16", 200, **O2),
                      rung("set_to_none", 101, set_to_none=True), rung("channels_last", 130, channels_last=True),
                      rung("fused", 160, accuracy=0.80, optimizer_impl="fused")])
    recipe, names, dropped = combine(Recipe(), singles, planned_steps=1000)
    assert names == ["master-bf16", "channels_last"]       # one precision level: O2, firmly faster than O1 here
    assert recipe.precision_level == "master" and recipe.channels_last and not recipe.set_to_none
    assert recipe.optimizer_impl == "default"                          # fused lost accuracy: excluded
    assert "lost accuracy" in dropped["fused"] and "no firm gain" in dropped["set_to_none"]
    assert "not firmly faster than master-bf16" in dropped["autocast-bf16"]
    # two levels within each other's noise: O1, the safer numerics, is kept
    close = scored([rung("baseline", 100), rung("autocast-bf16", 175, **O1), rung("master-bf16", 178, **O2)])
    recipe, names, dropped = combine(Recipe(), close, planned_steps=None)
    assert names == ["autocast-bf16"] and "not firmly faster than autocast-bf16" in dropped["master-bf16"]


def test_without_time_for_stage_2_the_best_switch_on_top_of_the_level_is_recommended_with_it():
    from trainfast.tune import Decision, on_level_decision

    singles = scored([rung("baseline", 100), rung("autocast-bf16", 200, **O1)])
    on_level = scored([rung("on-autocast-bf16", 200, **O1), rung("set_to_none", 201, **O1, set_to_none=True),
                       rung("channels_last", 260, **O1, channels_last=True),
                       rung("decode_cache", 240, **O1, decode_cache=True)])
    fallback = Decision(singles[1].recipe, "autocast-bf16", gainers=["autocast-bf16", "channels_last"],
                        speedup=singles[1].result.speedup)
    best = max((r for r in on_level[1:] if r.result.verdict == "faster"), key=lambda r: r.result.speedup)
    decision = on_level_decision(singles[1], best, fallback)
    assert decision.name == "autocast-bf16 + channels_last" and decision.combined == ["autocast-bf16", "channels_last"]
    assert decision.recipe.precision == "bf16" and decision.recipe.channels_last and not decision.recipe.decode_cache
    assert decision.speedup == pytest.approx(2.0 * 1.3, rel=0.02)                   # level x switch-over-level
    low, high = decision.speedup_interval
    assert low < decision.speedup < high and decision.gainers == fallback.gainers


def test_a_switch_that_hurts_in_combination_is_dropped():
    base = Recipe()
    singles = scored([rung("baseline", 100), rung("master-bf16", 180, **O2),
                      rung("channels_last", 130, channels_last=True)])
    combined, names, _ = combine(base, singles, planned_steps=None)
    stage = combine_stage(base, singles, combined, names)
    assert [r.name for r in stage] == ["baseline", "single-master-bf16", "combined", "without-master-bf16",
                                       "without-channels_last"]
    # measured: together they are slower than O2 alone would suggest; without channels_last it is fastest
    rates = {"baseline": 100, "single-master-bf16": 180, "combined": 150, "without-master-bf16": 130,
             "without-channels_last": 181}
    measured = scored([rung(r.name, rates[r.name], **r.changes) for r in stage])
    for made, got in zip(stage, measured):
        got.recipe = made.recipe
    decision = decide(measured)
    assert "channels_last" in decision.dropped and "hurts in combination" in decision.dropped["channels_last"]
    # the combination without channels_last is O2 alone again: not firmly faster than the best single switch
    assert decision.name == "single-master-bf16" and decision.recipe.precision_level == "master"
    assert any("is not firmly faster than the best single switch" in n for n in decision.notes)


def test_a_combination_that_beats_the_best_single_is_recommended_and_one_that_loses_accuracy_is_not():
    base = Recipe()
    singles = scored([rung("baseline", 100), rung("master-bf16", 180, **O2),
                      rung("channels_last", 130, channels_last=True)])
    combined, names, _ = combine(base, singles, planned_steps=None)
    stage = combine_stage(base, singles, combined, names)
    for accuracy, expected in ((0.95, "combined"), (0.70, "single-master-bf16")):
        rates = {"baseline": 100, "single-master-bf16": 180, "combined": 230, "without-master-bf16": 130,
                 "without-channels_last": 180}
        measured = scored([rung(r.name, rates[r.name], accuracy if r.name == "combined" else 0.95, **r.changes)
                           for r in stage])
        for made, got in zip(stage, measured):
            got.recipe = made.recipe
        decision = decide(measured)
        assert decision.name == expected
        if expected == "combined":
            assert decision.recipe.channels_last and decision.speedup == pytest.approx(2.3, rel=0.06)
        else:
            assert "loses accuracy" in decision.dropped["combined"]


def _timed(rung: Rung, warmup: list[float], step: float) -> Rung:
    for run in rung.repeats:
        run["timing"].update(warmup_seconds=warmup, timed_seconds=step * 100, timed_steps=100)
    return rung


def test_compile_joins_only_when_the_planned_run_repays_its_compilation():
    eager = _timed(rung("baseline", 100), [0.5], 0.10)
    compiled = _timed(rung("compile", 125, compile=True), [20.0, 0.3], 0.08)
    # 20.3 s of warm-up is 20.14 s beyond two steady steps, the eager warm-up 0.4 s: 19.74 s / 0.02 s per step
    assert break_even_steps(compiled, eager) == pytest.approx(987, rel=0.01)
    assert break_even_steps(eager, compiled) == math.inf           # slower per step: never repays
    singles = scored([eager, compiled])
    for steps, joins in ((500, False), (5000, True)):
        recipe, names, dropped = combine(Recipe(), singles, planned_steps=steps)
        assert recipe.compile is joins and (("compile" in names) is joins)
        if not joins:
            assert "repays its compilation after ~987 steps" in dropped["compile"]


def test_best_yaml_round_trips_and_budgets_parse(tmp_path):
    from trainfast.tune import Decision, write_outputs

    recipe = Recipe(precision="bf16", precision_level="master", channels_last=True, epochs=3)
    singles = scored([rung("baseline", 100), rung("master-bf16", 180, **O2)])

    class Stage:
        rungs = singles
    write_outputs(tmp_path, Decision(recipe, "combined", speedup=1.8), Stage, None, 12.0, 600.0, 66)
    assert Recipe.from_file(tmp_path / "best.yaml") == recipe
    assert "master-bf16" in (tmp_path / "tune.md").read_text()
    assert [parse_budget(t) for t in ("600", "90s", "10m", "1h")] == [600, 90, 600, 3600]
    with pytest.raises(ValueError, match="--budget"):
        parse_budget("ten minutes")


@pytest.mark.slow
def test_a_real_search_writes_best_yaml_resumes_and_trains_with_it(tmp_path):
    import torch

    from trainfast.ablation import TimingBudget
    from trainfast.techniques.precision import auto_amp_dtype, slow_half_reason

    cpu = torch.device("cpu")
    amp = auto_amp_dtype(cpu)           # bf16 where it is fast; on a CPU without half hardware, not run at all
    level = f"autocast-{amp}"
    out = tmp_path / "tune"
    # a level and one switch (stage 1b has one to judge again), each speed run timed over 8 steps, not 16
    kwargs = dict(data="digits", image_size=16, out=out, repeats=1, show=False, recipe=Recipe(batch_size=128),
                  switches=[level, "fused"], device="cpu", settle=False,
                  timing=TimingBudget(steps=8, min_seconds=1.0))
    first = tune("resnet9", **kwargs)
    assert (out / "best.yaml").exists() and (out / "tune.md").exists() and (out / "singles" / "results.json").exists()
    import json
    singles = json.loads((out / "tune.json").read_text())["singles"]
    if slow_half_reason(cpu, amp):
        assert first.recipe.precision == "fp32" and f"not run: {amp} matmuls run at" in (out / "tune.md").read_text()
        assert not (out / "on-level").exists()
    elif singles[level]["verdict"] == "faster" and singles[level]["firm"]:
        # bf16 gained: the other switches were judged again on top of it
        on_level = json.loads((out / "on-level" / "results.json").read_text())
        names = [r["name"] for r in on_level["rungs"]]
        assert names == [f"on-{level}", "fused"]
        assert all(r["recipe"]["precision"] == amp for r in on_level["rungs"])
    again = tune("resnet9", resume=True, batch_size_search=True, **kwargs)    # stages 1-2 reused, then batch/
    assert again.name == first.name and again.recipe == first.recipe
    found = json.loads((out / "tune.json").read_text())["batch_search"]
    assert set(found["sizes"]) == {"batch-128", "batch-256", "batch-512"} and found["from"] == 128
    assert found["batch_size"] in (128, 256, 512) and Recipe.from_file(out / "best.yaml").batch_size == 128
    assert "Larger batches (reported apart" in (out / "tune.md").read_text()
    runs = list((out / "singles" / "runs").glob("*.json"))
    assert runs and all('"reused"' not in p.read_text() for p in runs)
    from trainfast.cli import main      # in this process: an interpreter's start saved, the same command line

    assert main(["train", "--recipe", str(out / "best.yaml"), "--image-size", "16",
                 "--out", str(tmp_path / "train")]) == 0
    with pytest.raises(ValueError, match="already holds a search"):
        tune("resnet9", **kwargs)


@pytest.mark.slow
@pytest.mark.alone
def test_a_search_on_a_users_own_command_finds_both_gains_and_guards_with_its_metric(tmp_path):
    # tune -- COMMAND: the singles are timed in speed mode (stopped once timed), stage 2 runs every candidate to
    # the script's end and reads the metric it reports; the recipe reaches the script through the environment.
    from trainfast.ablation import TimingBudget

    out = tmp_path / "tune-cmd"
    script = str(ROOT / "tests" / "scripts" / "paced_loop.py")
    decision = tune(command=[sys.executable, script, "--steps", "120"], out=out, repeats=1, show=False,
                    switches=["autocast-bf16", "set_to_none"], timing=TimingBudget(steps=16, min_seconds=1.2),
                    planned_steps=120, amp_dtype="bf16", settle=False)   # bf16 asked for: measured on any CPU
    assert decision.name == "combined", decision
    assert decision.recipe.precision == "bf16" and decision.recipe.set_to_none
    assert Recipe.from_file(out / "best.yaml") == decision.recipe
    import json

    singles = json.loads((out / "singles" / "results.json").read_text())
    for rung_result in singles["rungs"]:
        assert all(run["mode"] == "speed" and run["stopped"] != "script ended" for run in rung_result["runs"])
    combined = json.loads((out / "combine" / "results.json").read_text())
    for rung_result in combined["rungs"]:
        assert rung_result["status"] == "done"
        assert all(run["stopped"] == "script ended" and "val_accuracy" in run["reported"]
                   for run in rung_result["runs"])
    env = json.loads((out / "combine" / "rungs" / "combined-r0" / "command.json").read_text())["env"]
    fields = json.loads(env["TRAINFAST_RECIPE"])
    assert set(fields) == {"precision", "precision_level", "set_to_none", "seed"}       # the script's own rest stands
    assert fields["precision"] == "bf16" and fields["set_to_none"] is True


def test_with_a_precision_level_to_try_stage_1_keeps_half_the_budget_for_the_switches_on_top_of_it():
    import torch

    from trainfast.tune import SINGLES_SHARE, singles_share

    cpu = torch.device("cpu")
    both = plan_rungs(Recipe(), ["autocast-bf16", "master-bf16", "channels_last", "decode_cache"], "each", "bf16", cpu)
    assert singles_share(both) == SINGLES_SHARE == 0.5
    levels_only = plan_rungs(Recipe(), ["autocast-bf16", "master-bf16"], "each", "bf16", cpu)
    switches_only = plan_rungs(Recipe(), ["channels_last", "fused"], "each", "bf16", cpu)
    assert singles_share(levels_only) == singles_share(switches_only) == 1.0   # no stage 1b can follow
    for rung in both[1:3]:                     # a CPU without fast bf16: the levels are shown, not run
        rung.rule_out(EffectLabel.SLOW_HALF, "bf16 is slow here")
    assert singles_share(both) == 1.0


def test_the_budget_cuts_repeats_first_then_the_last_rungs():
    from trainfast.ablation.spending import fit_to_budget

    assert fit_to_budget(5, 3, 10.0, 1000.0) == (5, 3)           # room for all 15 runs
    assert fit_to_budget(5, 3, 10.0, 100.0) == (5, 2)            # 11 runs: 2 repeats of all 5
    assert fit_to_budget(5, 3, 10.0, 50.0) == (3, 2)             # 6 runs: 2 repeats of the first 3
    assert fit_to_budget(5, 3, 10.0, -30.0) == (2, 3)            # over already: a baseline and one rung, 3 times
    assert fit_to_budget(9, 3, 79.0, 281.0) == (2, 3)            # 4.5 runs: 2 x 2 would leave 1 df, no verdict
    assert fit_to_budget(9, 2, 79.0, 281.0) == (2, 2)            # --repeats 2 asked: 2
    assert fit_to_budget(5, 1, 10.0, 0.0) == (2, 1)              # --repeats 1 stays 1


def test_a_ladder_with_a_time_budget_runs_what_fits_and_says_what_it_skipped(tmp_path):
    # Runs priced at 100 s by the first one, 350 s allowed: 4.5 runs -> baseline and the first rung, 3 times (2
    # would leave no degree of freedom for a verdict); the other two rungs are skipped, named in the table, the
    # report and the result's settings.
    import dataclasses

    from trainfast.ablation import LadderOptions, TimingBudget, run_ladder

    template = scored_rung("x", [500.0], 0.95).repeats[0]
    launched = []

    def launch(rung, recipe, budget, run_dir, display, limit):
        launched.append(f"{rung.name}-s{recipe.seed}")
        return {**template, "seed": recipe.seed, "wall_time_s": 100.0}

    plan = [Rung("baseline", {}, Recipe()), Rung("set_to_none", {"set_to_none": True}, Recipe(set_to_none=True)),
            Rung("prefetch", {"prefetch": True}, Recipe(prefetch=True)),
            Rung("fused", {"optimizer_impl": "fused"}, Recipe(optimizer_impl="fused"))]
    settings = {"stage": "test", "repeats": 3, "budget": dataclasses.asdict(TimingBudget()), "min_effect": 0.05}
    options = LadderOptions(mode="each", repeats=3, noise_seeds=3, budget=TimingBudget(), min_effect=0.05,
                            resume=False, rung_timeout=None, show=False, settle_within_s=None, time_budget_s=350.0)
    result = run_ladder(plan, Launching(launch), settings, tmp_path / "ladder", options)
    assert launched == ["baseline-s0", "set_to_none-s0", "baseline-s1", "set_to_none-s1", "baseline-s2",
                        "set_to_none-s2"]
    assert [r.status for r in plan] == [Status.DONE, Status.DONE, Status.SKIPPED, Status.SKIPPED]
    cut = result.settings["budget_cut"]
    assert (cut["rungs"], cut["repeats"], cut["skipped"], cut["asked"]) == (2, 3, ["prefetch", "fused"],
                                                                            {"rungs": 4, "repeats": 3})
    report = (tmp_path / "ladder" / "report.md").read_text()
    assert "skipped: not in the time budget" in report and "would not fit the time budget (350 s" in report


def test_when_no_precision_level_gains_stage_1_goes_on_with_the_budget_kept_for_stage_1b(tmp_path, monkeypatch):
    # Runs priced at 100 s, an 800 s budget: stage 1 may spend half, which fits the baseline and O1 three times.
    # O1 gains nothing here, so no stage 1b follows: stage 1 is re-planned with the whole budget, its runs so
    # far reused, and the switches it had cut are judged (fused gains 1.5x and is recommended).
    import torch

    import trainfast.tune.search as search_module
    from trainfast.ablation import run_ladder

    launched = []

    def launch(rung, recipe, budget, run_dir, display, limit):
        launched.append(f"{rung.name}-s{recipe.seed}")
        wobble = 1 + 0.01 * (recipe.seed % 3 - 1)           # deterministic, small: every verdict is clear
        rate = 500.0 * (1.5 if recipe.optimizer_impl == "fused" else 1.0) * wobble
        return {**scored_rung("x", [rate], 0.95).repeats[0], "seed": recipe.seed, "wall_time_s": 100.0}

    stages = []

    def faked(rungs, work, settings, out, options, measure="speed"):
        stages.append((settings["stage"], options.resume, round(options.time_budget_s)))
        return run_ladder(rungs, Launching(launch, work), settings, out, options, measure)

    monkeypatch.setattr(search_module, "run_ladder", faked)
    out = tmp_path / "tune"
    decision = tune("resnet9", data="digits", image_size=16, out=out, show=False, device="cpu", amp_dtype="bf16",
                    switches=["autocast-bf16", "fused", "channels_last"], budget_s=800.0)
    assert [(name, resume) for name, resume, _ in stages] == [("singles", False), ("singles", True)]
    assert stages[0][2] <= 400 < 750 <= stages[1][2]
    assert launched[:6] == ["baseline-s0", "autocast-bf16-s0", "baseline-s1", "autocast-bf16-s1", "baseline-s2",
                            "autocast-bf16-s2"]
    assert {"fused-s0", "fused-s1", "channels_last-s0", "channels_last-s1"} <= set(launched[6:])
    assert "baseline-s0" not in launched[6:]                # reused, not run again
    assert decision.name == "fused" and decision.recipe.precision == "fp32"
    assert "stage 1 went on with the budget kept for stage 1b" in (out / "tune.md").read_text()
    assert not (out / "on-level").exists()
    assert torch.isfinite(torch.tensor(decision.speedup)) and decision.speedup > 1.4


def test_the_search_tries_first_what_gained_or_was_not_measured_and_cuts_the_rest():
    import torch

    from trainfast.tune import PRIORITY, on_level_order, single_names

    from trainfast.techniques import tune_priority

    assert single_names("bf16", image_folder=True) == ["autocast-bf16", "master-bf16",
                                                       *tune_priority("classification")]
    assert set(tune_priority("classification")) < set(PRIORITY)        # PRIORITY: every task's
    assert "decode_cache" not in single_names("bf16", image_folder=False)
    # a language model: packing and length grouping first, nothing its task refuses (the image prefetcher)
    lm = single_names("bf16", image_folder=False, task="lm")
    assert lm[2:4] == ["padding_free", "group_by_length"] and "prefetch" not in lm
    cpu = torch.device("cpu")
    stage1 = scored([rung("baseline", 100), rung("set_to_none", 130, set_to_none=True),
                     rung("fused", 104, optimizer_impl="fused"), rung("prefetch", 101, prefetch=True)])
    cut = plan_rungs(Recipe(), ["channels_last", "compile"], "each", "bf16", cpu)[1:]
    for r in cut:
        r.status = Status.SKIPPED               # not in stage 1's budget: no estimate
    order = [r.name for r in on_level_order([*stage1[1:], *cut])]
    # the firm gain first, then the unmeasured in PRIORITY order, then the rest by their estimate
    assert order == ["set_to_none", "channels_last", "compile", "fused", "prefetch"]


# Slow: two searches of three stages each (faked runs on a fixed clock: the budget's shares, whatever the machine).
# Fast: the budget split itself, test_with_a_precision_level_to_try_stage_1_keeps_half_the_budget_for_the_switches_
# on_top_of_it, and settling within a budget, test_verdicts.py's test_a_time_budget_that_fits_the_plan_...
@pytest.mark.slow
@pytest.mark.alone
def test_each_stage_settles_its_verdicts_only_with_the_time_it_leaves_the_stages_after_it(tmp_path, monkeypatch):
    # Extra passes (run_ladder's settling) may take a stage to half the budget left when it starts, the last
    # stage to all of it; settle=False runs exactly the repeats asked for. bf16 gains 1.5x, and on top of it
    # fused and channels_last 1.3x each: all three stages run.
    import trainfast.tune.search as search_module
    from trainfast.ablation import run_ladder
    from trainfast.tune.budget import SearchBudget

    def launch(rung, recipe, budget, run_dir, display, limit):
        wobble = 1 + 0.01 * (recipe.seed % 3 - 1)
        rate = 500.0 * wobble * (1.5 if recipe.precision == "bf16" else 1.0)
        rate *= (1.3 if recipe.optimizer_impl == "fused" else 1.0) * (1.3 if recipe.channels_last else 1.0)
        return {**scored_rung("x", [rate], 0.95).repeats[0], "seed": recipe.seed, "wall_time_s": 1.0}

    for settle in (True, False):
        stages = {}

        def faked(rungs, work, settings, out, options, measure="speed"):
            stages[settings["stage"]] = (options.time_budget_s, options.settle_within_s)
            return run_ladder(rungs, Launching(launch, work), settings, out, options, measure)

        monkeypatch.setattr(search_module, "run_ladder", faked)
        # A clock only the faked runs' own wall times count on: the shares are the budget's, whatever the machine
        monkeypatch.setattr(search_module, "SearchBudget", lambda total: SearchBudget(total, now=lambda: 0.0))
        decision = tune("resnet9", data="digits", image_size=16, out=tmp_path / f"tune-{settle}", show=False,
                        device="cpu", amp_dtype="bf16", switches=["autocast-bf16", "fused", "channels_last"],
                        budget_s=800.0, settle=settle)
        assert list(stages) == ["singles", "on-level", "combine"]
        assert decision.recipe.precision == "bf16" and decision.recipe.optimizer_impl == "fused" \
            and decision.recipe.channels_last
        (singles, singles_settle), (on_level, on_level_settle), (combine, combine_settle) = stages.values()
        if not settle:
            assert singles_settle == on_level_settle == combine_settle == 0.0
            continue
        assert 390 < singles_settle <= singles <= 400             # stage 1's own share: half
        assert 390 < on_level_settle <= 400 < 790 < on_level       # its budget: all that is left; settling: half
        assert combine_settle == combine > 780                     # the last stage: all that is left


class GuardSearch:
    """A search whose guard stage returns runs made here: the recipe's metric `delta` from the baseline's."""

    def __init__(self, delta: float, fits: bool = True) -> None:
        from types import SimpleNamespace

        self.base = Recipe()
        self.options = SimpleNamespace(command=["python", "train.py"], repeats=3)
        self.budget = SimpleNamespace(fits_runs=lambda runs, per_run, left=None: fits)
        self.delta, self.asked = delta, []

    def repeats_that_fit(self, runs_per_pass, per_run, left=None):
        from trainfast.tune.search import Search

        return Search.repeats_that_fit(self, runs_per_pass, per_run, left)       # the search's own pricing

    def stage(self, name, rungs, repeats, measure="speed", last=False, **kwargs):
        from conftest import scored_rung

        from trainfast.ablation.scoring import score_rungs
        from trainfast.results import AblationResult

        self.asked.append((name, [r.name for r in rungs], repeats, measure))
        base = scored_rung("baseline", [100.0] * repeats, 0.0)
        rung = scored_rung(rungs[1].name, [130.0] * repeats, 0.0, precision="bf16")
        for i, run in enumerate(base.repeats):
            run["reported"] = {"eval_accuracy": 0.80 + 0.01 * (i % 2)}
        for i, run in enumerate(rung.repeats):
            run["reported"] = {"eval_accuracy": 0.80 + 0.01 * (i % 2) + self.delta}
        metric = ("eval_accuracy", "max")
        score_rungs([base, rung], {"fp32": 1e12, "bf16": 1e12}, metric=metric)
        return AblationResult([base, rung], {}, Path("."), None, None, {},
                              settings={"command": ["python"], "measure": "full"},
                              metric={"name": "eval_accuracy", "goal": "max",
                                      "why": "the script's metric_for_best_model"})


def test_a_scripts_single_switch_recipe_is_run_in_full_and_guarded_before_it_is_recommended():
    """Stage 1 of a script's search only times its runs; when one switch gained (no stage 2), the recipe is run to
    its end against the baseline: kept when its metric is inside the band (the note names the metric), replaced by
    the baseline when it lost accuracy, and the guard said to be missing when it cannot fit the budget."""
    from trainfast.tune.combine import Decision
    from trainfast.tune.search import guard_measured

    bf16 = Recipe(precision="bf16")
    kept = guard_measured(search := GuardSearch(0.0), Decision(bf16, "autocast-bf16"), 5.0)
    assert kept.name == "autocast-bf16" and search.asked == [("guard", ["baseline", "autocast-bf16"], 3, "full")]
    assert any("accuracy guard" in n and "eval_accuracy" in n for n in kept.notes)
    lost = guard_measured(GuardSearch(-0.3), Decision(bf16, "autocast-bf16"), 5.0)
    assert lost.name == "baseline" and lost.recipe == Recipe() and "loses accuracy" in lost.dropped["autocast-bf16"]
    unfit = guard_measured(search := GuardSearch(-0.3, fits=False), Decision(bf16, "autocast-bf16"), 5.0)
    assert unfit.name == "autocast-bf16" and not search.asked and any("no accuracy guard" in n for n in unfit.notes)


def test_a_recipe_held_by_its_input_gets_the_input_switches_on_top_until_the_step_holds_it(tmp_path, monkeypatch):
    # A step of 500 samples/s in fp32 and 1,000 in bf16; the loader delivers 600 with no workers, 900 with two and
    # 1,300 with four. fp32 is not held by its input (no wait), so more workers alone would gain nothing; bf16 is
    # (600 of its 1,000: 40% of each step waiting). Stage 3 tries the workers on top of bf16: four gain most and
    # leave no wait, so no second round follows.
    import json

    import trainfast.tune.inputs as inputs_module
    import trainfast.tune.search as search_module
    from trainfast.ablation import run_ladder

    def launch(rung, recipe, budget, run_dir, display, limit):
        wobble = 1 + 0.01 * (recipe.seed % 3 - 1)
        step = 500.0 * (2.0 if recipe.precision == "bf16" else 1.0)
        feed = {0: 600.0, 2: 900.0, 4: 1300.0}[recipe.num_workers]
        rate = min(step, feed)
        record = scored_rung("x", [rate * wobble], 0.95).repeats[0]
        return {**record, "seed": recipe.seed, "wall_time_s": 1.0, "data_wait_fraction": 1 - rate / step}

    stages = []

    def faked(rungs, work, settings, out, options, measure="speed"):
        stages.append(settings["stage"])
        return run_ladder(rungs, Launching(launch, work), settings, out, options, measure)

    monkeypatch.setattr(search_module, "run_ladder", faked)
    monkeypatch.setattr(inputs_module, "usable_cpus", lambda: 4)
    out = tmp_path / "tune"
    decision = tune("resnet9", data="digits", image_size=16, out=out, show=False, device="cpu", amp_dtype="bf16",
                    switches=["autocast-bf16", "workers", "device_decode"], budget_s=800.0)
    assert stages == ["singles", "input"]
    assert decision.name == "autocast-bf16 + workers-4"
    assert decision.recipe == Recipe(precision="bf16", precision_level="autocast", num_workers=4)
    assert 1.9 < decision.speedup < 2.1                  # 1.2x (bf16 alone) x 1.67x (four workers on top of it)
    md = (out / "tune.md").read_text()
    assert "Held by its input" in md and "autocast-bf16 waited for its batches 40% of each step" in md
    found = json.loads((out / "tune.json").read_text())["input"][0]
    assert found["device_decode"]["status"] == "no-effect"      # a CPU, and data already in memory
    assert found["workers-2"]["verdict"] == found["workers-4"]["verdict"] == "faster"
    assert (out / "best.yaml").read_text().count("num_workers: 4") == 1

    # Not held (the loader outruns the bf16 step): no stage 3.
    stages.clear()
    monkeypatch.setattr(search_module, "run_ladder", faked)
    launch_fast = launch

    def launch(rung, recipe, budget, run_dir, display, limit):        # noqa: F811 - the same runs, fed faster
        record = launch_fast(rung, recipe.replace(num_workers=4), budget, run_dir, display, limit)
        return {**record, "seed": recipe.seed}

    decision = tune("resnet9", data="digits", image_size=16, out=tmp_path / "fed", show=False, device="cpu",
                    amp_dtype="bf16", switches=["autocast-bf16", "workers"], budget_s=800.0)
    assert stages == ["singles"] and decision.name == "autocast-bf16" and decision.recipe.num_workers == 0
