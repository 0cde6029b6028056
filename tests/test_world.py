"""World size as a rung (`ablate --nproc 1,2`): the list as written and refused, the efficiency and its interval, the
time to target per size against the smallest, and the report, results.json and console rendered from faked records;
one small end-to-end ablation at 1 and 2 processes with --target auto."""
from __future__ import annotations

import json
import math

import pytest

from tests.conftest import scored_rung
from trainfast.ablation.scaling import efficiency, scaling
from trainfast.ablation.scoring import score_rungs
from trainfast.cli import build_parser, main
from trainfast.defaults import parse_world_sizes
from trainfast.results import AblationResult
from trainfast.target import Target


# --- --nproc as written --------------------------------------------------------------------------------------------

def test_a_list_parses_ascending_and_one_count_stays_an_int():
    assert parse_world_sizes("2,1") == (1, 2)
    assert parse_world_sizes(" 1 , 2 ") == (1, 2)
    assert parse_world_sizes("2") == 2 and parse_world_sizes([2]) == 2 and parse_world_sizes((2, 1)) == (1, 2)
    parser = build_parser()
    assert parser.parse_args(["ablate", "--nproc", "1,2"]).nproc == (1, 2)
    assert parser.parse_args(["ablate", "--nproc", "2"]).nproc == 2           # one count: exactly as before


@pytest.mark.parametrize("value, words", [("1,1", "1 is given twice"),
                                          ("1,0", "'0' is not a positive process count"),
                                          ("1,x", "'x' is not a positive process count"),
                                          ("0,2", "'0' is not a positive process count"),
                                          ("1,2,", "'' is not a positive process count")])
def test_a_duplicate_a_zero_or_a_word_is_refused_naming_the_flag_and_value(value, words, capsys):
    with pytest.raises(ValueError, match="--nproc") as info:
        parse_world_sizes(value)
    assert words in str(info.value) and repr(value) in str(info.value)
    with pytest.raises(SystemExit) as code:
        main(["ablate", "--nproc", value])
    assert code.value.code == 2 and "argument --nproc" in capsys.readouterr().err


def test_more_processes_than_cores_is_refused_before_torch(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert parse_world_sizes("1,2") == (1, 2)
    with pytest.raises(ValueError, match=r"--nproc '1,4': 4 processes need at least 4 cores .* gives this process 2"):
        parse_world_sizes("1,4")


def test_a_list_with_a_command_is_refused_before_any_run(capsys):
    assert main(["ablate", "--nproc", "1,2", "--", "python", "train.py"]) == 2
    assert "--nproc 1,2: a list of process counts measures the built-in run" in capsys.readouterr().err


def test_the_python_api_refuses_a_duplicate_before_any_work():
    from trainfast import ablate
    from trainfast.recipe import RecipeError

    with pytest.raises(RecipeError, match="--nproc .*given twice"):
        ablate("no-such-model", nproc=[2, 2])


# --- the efficiency and its interval -------------------------------------------------------------------------------

def test_efficiency_is_the_rate_ratio_over_the_size_ratio_with_its_interval_scaled():
    assert efficiency(1.6, [1.4, 1.8], 2.0) == (0.8, [0.7, 0.9])
    assert efficiency(3.0, None, 4.0) == (0.75, None)


def ladder(nproc: int, job_rates: dict[str, list[float]]):
    """A scored ladder at `nproc` processes whose rungs' jobs run at the given rates, one per repeat."""
    rungs = []
    for name, rates in job_rates.items():
        rung = scored_rung(name, [r / nproc for r in rates], 0.9)
        for record in rung.repeats:
            record["world_size"] = nproc
        rungs.append(rung)
    score_rungs(rungs, {}, None)
    return rungs


def test_each_rung_at_each_size_is_judged_against_itself_at_the_smallest():
    world = scaling({1: ladder(1, {"baseline": [100, 101, 99], "amp": [150, 149, 151]}),
                     2: ladder(2, {"baseline": [160, 161, 159], "amp": [300, 298, 302]})})
    assert world["sizes"] == [1, 2] and world["reference"] == 1
    one, two = world["by_size"]
    assert [r["efficiency"] for r in one["rungs"]] == [1.0, 1.0]
    base, amp = two["rungs"]
    assert base["efficiency"] == pytest.approx(0.8, rel=0.03) and amp["efficiency"] == pytest.approx(1.0, rel=0.03)
    low, high = base["efficiency_interval"]
    assert low < base["efficiency"] < high and high - low < 0.15
    assert base["per_rank"] == pytest.approx(base["throughput"] / 2)
    assert base["verdict"] == "faster" and amp["verdict"] == "faster"


def test_a_noisy_size_gets_a_wider_interval():
    calm = scaling({1: ladder(1, {"baseline": [100, 101, 99]}), 2: ladder(2, {"baseline": [160, 161, 159]})})
    shaky = scaling({1: ladder(1, {"baseline": [100, 101, 99]}), 2: ladder(2, {"baseline": [120, 200, 160]})})

    def width(world):
        low, high = world["by_size"][1]["rungs"][0]["efficiency_interval"]
        return high - low
    assert width(shaky) > 2 * width(calm)


def curve(values, seconds_per_sample, per_eval=100):
    return [{"step": i + 1, "seen": (i + 1) * per_eval, "train_s": (i + 1) * per_eval * seconds_per_sample,
             "metrics": {"val_loss": v}} for i, v in enumerate(values)]


def test_time_to_target_at_each_size_against_the_smallest():
    target = Target("val_loss", "min", 2.0)
    sizes = {1: ladder(1, {"baseline": [100, 101, 99]}), 2: ladder(2, {"baseline": [180, 181, 179]})}
    # two processes: the same curve over samples (same math), seen at 1.8x the pace
    for nproc, pace in ((1, 0.01), (2, 0.01 / 1.8)):
        base = sizes[nproc][0]
        for k, record in enumerate(base.repeats):
            record["curve"] = curve([3.0, 2.5, 2.1 + 0.01 * k, 1.9, 1.8], pace * (1 + 0.01 * k))
    world = scaling(sizes, target)
    row = world["by_size"][1]["rungs"][0]
    versus = row["vs_reference_target"]
    assert versus["samples_from"] == "baseline" and versus["speedup"] == pytest.approx(1.8, rel=0.03)
    assert versus["verdict"] == "sooner" and versus["interval"][0] > 1
    assert world["target"]["value"] == 2.0 and "vs_reference_target" not in world["by_size"][0]["rungs"][0]


# --- the ladders of the sizes, interleaved -------------------------------------------------------------------------

def test_the_sizes_ladders_run_interleaved_a_run_of_each_in_turn(tmp_path, monkeypatch):
    """Two sizes of a two-rung ladder on a fake launch: the runs alternate between the sizes, every size gets its
    folder and the report folder's result carries the sizes side by side."""
    import dataclasses

    import torch

    import trainfast.ablation.loop as loop
    from trainfast.ablation import LadderOptions, TimingBudget
    from trainfast.ablation.world import ablate_sizes
    from trainfast.recipe import Recipe
    from trainfast.results import Rung

    # the machine's roof and reference workload are measured per ladder for real elsewhere: faked here, for speed
    monkeypatch.setattr(loop, "ceiling", lambda work, precision: 1e11)
    monkeypatch.setattr(loop, "reference_check", lambda dev: {"median_s": 0.01, "min_s": 0.01, "max_s": 0.01})
    launched = []

    class Work:
        dev, settings, learned, flops_per_sample = torch.device("cpu"), {}, {}, None

        def __init__(self, nproc):
            self.nproc = nproc

        def launcher(self, measure):
            def launch(rung, recipe, budget, run_dir, display, limit):
                launched.append((self.nproc, rung.name))
                rate = (100.0 if rung.name == "baseline" else 120.0) * (0.8 * self.nproc if self.nproc > 1 else 1)
                record = scored_rung("x", [rate / self.nproc], 0.9).repeats[0]
                return {**record, "seed": recipe.seed, "world_size": self.nproc, "wall_time_s": 1.0}
            return launch

        def metric(self, measure):
            return ("accuracy", "max")

        def after_run(self, plan):
            return None

    def ladder_at(nproc):
        plan = [Rung("baseline", {}, Recipe()), Rung("fused", {"optimizer_impl": "fused"},
                                                     Recipe(optimizer_impl="fused"))]
        return plan, Work(nproc), {"nproc": nproc, "budget": dataclasses.asdict(TimingBudget())}

    opts = LadderOptions(repeats=2, noise_seeds=2, show=False, settle_within_s=None)
    result = ablate_sizes((1, 2), ladder_at, tmp_path, opts)
    assert launched == [(1, "baseline"), (2, "baseline"), (1, "fused"), (2, "fused")] * 2
    assert (tmp_path / "results.json").exists() and (tmp_path / "nproc-2" / "results.json").exists()
    two = result.settings["world"]["by_size"][1]
    assert two["folder"] == "nproc-2" and [r["rung"] for r in two["rungs"]] == ["baseline", "fused"]
    assert two["rungs"][0]["efficiency"] == pytest.approx(0.8, rel=0.05)
    assert "## World size" in (tmp_path / "report.md").read_text()


# --- the report, results.json and the console, from faked records ---------------------------------------------------

def world_result(tmp_path):
    world = scaling({1: ladder(1, {"baseline": [100, 101, 99]}), 2: ladder(2, {"baseline": [160, 161, 159]})})
    world["by_size"][0]["folder"], world["by_size"][1]["folder"] = ".", "nproc-2"
    world["not_run"] = []
    rungs = ladder(1, {"baseline": [100, 101, 99]})
    return AblationResult(rungs, {"device_name": "cpu", "device": "cpu"}, tmp_path, None, "baseline", {},
                          settings={"world": world, "world_sizes": [1, 2]})


def test_the_report_has_a_table_per_size_with_efficiency(tmp_path):
    from trainfast.report.world import world_section

    text = "\n".join(world_section(world_result(tmp_path)))
    assert "## World size" in text and "### 1 process (this folder)" in text
    assert "### 2 processes ([nproc-2/report.md](nproc-2/report.md))" in text
    two = text.split("### 2 processes")[1]
    assert "| baseline | 160 | 80." in two and "80% (" in two and "| reference |" in text.split("### 2")[0]
    assert world_section(AblationResult([], {}, tmp_path, None, None, {})) == []


def test_results_json_and_the_console_carry_the_sizes(tmp_path):
    from rich.console import Console

    from trainfast.report import results_dict
    from trainfast.report.world import console_table

    result = world_result(tmp_path)
    data = json.loads(json.dumps(results_dict(result), default=str))
    sizes = data["settings"]["world"]["by_size"]
    assert [s["nproc"] for s in sizes] == [1, 2] and math.isclose(sizes[1]["rungs"][0]["efficiency"],
                                                                  result.settings["world"]["by_size"][1]["rungs"][0]
                                                                  ["efficiency"])
    console = Console(record=True, width=200)
    console.print(console_table(result))
    shown = console.export_text()
    assert "world size" in shown and "80%" in shown and "reference" in shown


def test_a_sizes_lines_are_prefixed_with_its_size():
    import io

    from trainfast.ablation.world import Prefixed

    out = io.StringIO()
    stream = Prefixed(out, "[nproc 2] ")
    stream.write("running baseline")
    stream.write(" … done\nnext\n")
    assert out.getvalue() == "[nproc 2] running baseline … done\n[nproc 2] next\n" and not stream.isatty()


# --- end to end: the built-in run at 1 and 2 processes, with --target auto -------------------------------------------

@pytest.mark.slow
def test_ablate_at_one_and_two_processes_gives_rates_efficiency_and_time_to_target(tmp_path, monkeypatch):
    """The baseline alone, one repeat, two seeds a size (the fewest a seed band takes), 2 gloo ranks of
    one thread: the smallest ablation that shows every figure per size."""
    import trainfast.ablation.aim as aim
    import trainfast.ablation.loop as loop
    from tests.dist_common import make_model, make_split
    from trainfast.ablation import TimingBudget, ablate
    from trainfast.recipe import Recipe

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(loop, "TARGET_SEEDS", 2)
    monkeypatch.setattr(aim, "TARGET_SEEDS", 2)
    result = ablate(make_model, make_split(), recipe=Recipe(optimizer="sgd", lr=0.05, batch_size=8, log_every=2,
                                                            epochs=2),
                    rungs=["baseline"], device="cpu", out=tmp_path, show=False, nproc=(1, 2), repeats=1,
                    noise_seeds=1, settle_within_s=0, target="auto",
                    budget=TimingBudget(steps=4, seconds=1.0, floor=2, min_seconds=0.0))
    world = result.settings["world"]
    assert world["sizes"] == [1, 2] and world["target"]["auto"] and world["target"]["value"] is not None
    one, two = (entry["rungs"][0] for entry in world["by_size"])
    assert one["efficiency"] == 1.0 and one["throughput"] > 0
    assert two["throughput"] > 0 and two["per_rank"] == pytest.approx(two["throughput"] / 2)
    assert two["efficiency"] == pytest.approx(two["throughput"] / (2 * one["throughput"]), rel=0.05)
    assert len([r for r in two["rank_rates"] if r]) == 2 and two["ranks_line"]
    assert one["to_target"]["runs"] == 2 and two["to_target"]["runs"] == 2      # every size aimed at one level
    assert two["vs_reference_target"]["verdict"] in ("sooner", "later", "no measurable difference",
                                                     "did not reach the target")
    # each size its own folder; the report folder's results.json and report.md carry the sizes side by side
    smaller = json.loads((tmp_path / "results.json").read_text())
    larger = json.loads((tmp_path / "nproc-2" / "results.json").read_text())
    assert smaller["settings"]["nproc"] == 1 and larger["settings"]["nproc"] == 2
    assert larger["settings"]["target"]["value"] == smaller["settings"]["target"]["value"]
    assert smaller["settings"]["world"]["by_size"][1]["folder"] == "nproc-2"
    report = (tmp_path / "report.md").read_text()
    assert "## World size" in report and "### 2 processes" in report
