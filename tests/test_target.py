"""Time to target: the target as written, the curves' arithmetic, and each rung's judgement, on faked curves whose
answers are known; the built-in run's and a script's curves recorded as they train."""
from __future__ import annotations

import math
import sys

import pytest
import torch

from trainfast.ablation.target import (MISSED, SAME, SOONER, inside_band, ratio_interval, score_targets, seed_band,
                                       to_target)
from trainfast.recipe import Recipe
from trainfast.results import Rung, Status
from trainfast.target import Target, TargetError, first_reach, metric_key, parse_target, time_at, value_at


def curve(values, per_eval=100, seconds_per_sample=0.01, name="val_loss", offset=0.0):
    """Evaluations every `per_eval` samples at a steady rate; `values` the metric at each."""
    return [{"step": i + 1, "seen": (i + 1) * per_eval, "train_s": offset + (i + 1) * per_eval * seconds_per_sample,
             "metrics": {name: v}} for i, v in enumerate(values)]


def run(values, seed=0, **kw):
    return {"seed": seed, "curve": curve(values, **kw)}


def rung(name, runs):
    r = Rung(name, {}, Recipe())
    r.repeats, r.status = runs, Status.DONE
    return r


LOSS = Target("val_loss", "min", 2.0)


# --- the target as written ---------------------------------------------------------------------------------------

def test_targets_parse_with_their_goal_and_bad_ones_are_refused_by_name():
    assert parse_target("val_loss<=3.2") == Target("val_loss", "min", 3.2)
    assert parse_target(" val_acc >= 0.95 ") == Target("val_acc", "max", 0.95)
    auto = parse_target("auto")
    assert auto.auto and not auto.known
    assert auto.resolve("val_loss", "min", 2.5).reached(2.4)
    for bad in ("val_loss<3", "val_loss<=fast", "<=3", "val_loss<=inf"):
        with pytest.raises(TargetError, match="--target"):
            parse_target(bad)


def test_a_metric_is_found_under_the_names_frameworks_give_it():
    assert metric_key("val_loss", ["eval_loss", "eval_accuracy"]) == "eval_loss"
    assert metric_key("val_acc", ["val/loss", "val/acc"]) == "val/acc"
    assert metric_key("val_acc", ["val_accuracy", "val_loss"]) == "val_accuracy"
    assert metric_key("val_loss", ["train_loss_x"]) is None


# --- a curve's arithmetic ----------------------------------------------------------------------------------------

def test_a_run_that_never_reaches_the_target_has_no_reach_and_is_counted_as_missing():
    never = run([3.0, 2.6, 2.3, 2.2])
    assert first_reach(never["curve"], LOSS) is None
    base = rung("baseline", [run([3.0, 2.5, 1.9, 1.8], seed=s) for s in range(3)])
    slow = rung("slow", [run([3.5, 3.2, 3.0, 2.9], seed=s) for s in range(3)])
    score_targets([base, slow], LOSS)
    summary = slow.result.to_target
    assert summary["reached"] == 0 and math.isinf(summary["time_s"])
    assert summary["samples_from"] == "measured" and summary["verdict"] == MISSED
    # The table shows no ratio for it (its median run has none), and says it did not reach
    from trainfast.report.target import target_rows
    from trainfast.results import AblationResult

    row = target_rows(AblationResult([base, slow], {}, "", None, None, {}))[1]
    assert row[1:5] == ["not reached", "—", "not reached", "—"] and row[6] == "0 of 3" and row[7] == MISSED


def test_a_target_reached_between_evaluations_counts_at_the_evaluation_after_it():
    # The loss crosses 2.0 between the evaluations at 200 and 300 samples: the run knew it at 300, not before.
    c = curve([2.5, 2.1, 1.7])
    point = first_reach(c, LOSS)
    assert (point["seen"], point["train_s"]) == (300, 3.0)
    assert value_at(c, 250, "val_loss") == pytest.approx(1.9)          # interpolated, for the band, not the reach
    assert time_at(c, 250) == pytest.approx(2.5)
    assert time_at(c, 400) == pytest.approx(4.0)                       # past the last point: its last rate


def test_a_same_math_rung_takes_the_baseline_samples_only_inside_the_band():
    base = rung("baseline", [run([3.0, 2.4, 1.95, 1.7], seed=0), run([3.1, 2.5, 2.05, 1.8], seed=1),
                             run([2.9, 2.45, 1.9, 1.75], seed=2)])
    # Twice the rate, the same curve over samples (inside the band): the baseline's samples, its own time.
    fast = rung("fast", [run([3.0, 2.45, 1.98, 1.72], seed=s, seconds_per_sample=0.005) for s in range(3)])
    # Twice the rate and a curve outside the band (better per sample): its own samples, measured.
    better = rung("better", [run([2.5, 1.9, 1.6, 1.4], seed=s, seconds_per_sample=0.005) for s in range(5)])
    score_targets([base, fast, better], LOSS)
    b, f, g = (r.result.to_target for r in (base, fast, better))
    assert b["samples"] == 300
    assert f["inside_band"] and f["samples_from"] == "baseline" and f["samples"] == 300
    assert f["time_s"] == pytest.approx(1.5) and f["speedup"] == pytest.approx(2.0)
    assert not g["inside_band"] and g["samples_from"] == "measured"
    assert g["samples"] == 200 and g["samples_ratio"] == pytest.approx(200 / 300)
    assert g["time_s"] == pytest.approx(1.0) and g["speedup"] == pytest.approx(3.0) and g["verdict"] == SOONER
    band = seed_band(base.repeats, "val_loss")
    assert inside_band(fast.repeats, band, "val_loss") and not inside_band(better.repeats, band, "val_loss")


def test_the_interval_is_the_same_for_the_same_runs_and_wide_for_a_noisy_rung():
    a, b = [1.0, 1.1, 0.9, 1.05, 0.95], [1.0, 1.3, 0.7, 1.2, 0.8]
    assert ratio_interval(a, b) == ratio_interval(a, b)
    point, (low, high) = ratio_interval(a, b)
    assert point == pytest.approx(1.0) and low < 1 < high
    assert ratio_interval([1.0, 1.1], [2.0, 2.1, 2.2]) == (pytest.approx(1.05 / 2.1), None)   # 2 runs: none
    point, interval = ratio_interval([1.0, 1.1, 1.2], [math.inf, math.inf, 2.0])
    assert point == 0 and interval[0] == 0


def test_no_verdict_without_an_interval():
    base = rung("baseline", [run([3.0, 1.9], seed=0)])
    other = rung("other", [run([3.0, 1.9], seed=0, seconds_per_sample=0.005)])
    assert to_target(other, base, LOSS, [])["verdict"] == SAME


# --- the curves recorded as runs train ---------------------------------------------------------------------------

def test_the_built_in_run_stops_at_its_target_and_leaves_evaluation_out_of_its_time(digits16):
    from tests.conftest import tiny_resnet
    from trainfast.curves import BuiltinCurve, CurvePlan
    from trainfast.engine import train_one_epoch
    from trainfast.run import assemble_run

    run_ = assemble_run(tiny_resnet, digits16, Recipe(batch_size=32, epochs=2, log_every=4), device="cpu",
                        env=False)
    curve_ = BuiltinCurve(run_, CurvePlan(evals=8, target=Target("val_loss", "min", 2.2)))
    while curve_.more():
        train_one_epoch(run_.state, curve_.batches(run_.train_batches), run_.task, run_.meter(),
                        after_step=curve_.hooked(lambda s: None))
    points = curve_.record()["curve"]
    assert curve_.stopped == "reached" and points[-1]["metrics"]["val_loss"] <= 2.2
    assert all(p["metrics"]["val_loss"] > 2.2 for p in points[:-1])
    assert run_.state.step == points[-1]["step"]                       # no step trained after the reach
    steps = run_.state.timer.steps
    assert points[-1]["train_s"] == pytest.approx(sum(s.seconds for s in steps))
    assert [p["seen"] for p in points] == [32 * p["step"] for p in points]
    run_.close()


def test_a_scripts_reports_become_its_curve_and_its_evaluation_belongs_to_no_step():
    import time

    from trainfast.instruments.curve import ScriptCurve

    from trainfast.measure import StepTimer

    class Probe:
        timer, batches, world_size = StepTimer(torch.device("cpu")), None, 1

        def samples_per_step(self):
            return 8

    probe = Probe()
    curve_ = ScriptCurve(Target("val_acc", "max", 0.9).to_dict(), cap_seen=None)
    assert not curve_.add(probe, {"val_acc": 0.1})                     # before a step: nothing trained, no point
    for _ in range(3):
        probe.timer.step()
    time.sleep(0.05)                                                   # the script's evaluation
    assert not curve_.add(probe, {"val_acc": 0.5, "note": "text"})
    assert not curve_.add(probe, {"val_loss": 1.0})                    # the same step: joins the point
    time.sleep(0.02)
    probe.timer.step()
    assert not curve_.add(probe, {"val_acc": 0.95})                   # reached: the script runs on to its end
    assert curve_.record()["curve_stopped"] == "reached"
    first, second = curve_.points
    assert first["metrics"] == {"val_acc": 0.5, "val_loss": 1.0} and first["seen"] == 24
    # The 50 ms between the last step and the report (the evaluation) are in no point's time; the 20 ms between the
    # report and the next step (the script's loop) are.
    assert first["train_s"] < 0.02
    assert second["train_s"] - first["train_s"] == pytest.approx(0.02, abs=0.015)


# --- where a script's evaluations come from ------------------------------------------------------------------------

def test_a_frameworks_evaluation_and_a_session_report_reach_the_probe():
    from trainfast.frameworks.board import Board
    from trainfast.session import Session

    seen = []
    board = Board({}, on_metrics=seen.append)
    board.record_metrics({"eval_loss": torch.tensor(2.5), "epoch": 1.0, "note": "x"})
    assert seen == [{"eval_loss": 2.5, "epoch": 1.0}]

    class Observer:
        def attach(self, session):
            pass

        def watch(self, state, workers):
            pass

        def reported(self, metrics):
            seen.append(metrics)

    tf = Session(env=False)
    tf.observers = [Observer()]
    tf.report(val_accuracy=torch.tensor(0.5))
    assert seen[-1] == {"val_accuracy": 0.5} and tf.reported == {"val_accuracy": 0.5}
    tf.close()


# --- the ladder's order, its target and its seeds ------------------------------------------------------------------

class Work:
    def __init__(self):
        self.aimed = []

    def aim(self, target, cap_seen):
        self.aimed.append((target, cap_seen))

    def curve_metric(self):
        return "val_loss", "min"


def test_the_baseline_runs_first_then_auto_is_its_median_final_level_and_the_cap_six_times_its_samples():
    from trainfast.ablation.aim import Aim

    base, other = rung("baseline", []), rung("other", [])
    work = Work()
    aim = Aim(parse_target("auto"), [base, other], work, choice=lambda: None)
    queue = [(base, 0, "b"), (other, 0, "b"), (base, 1, "b"), (other, 1, "b"), (base, 2, None)]
    assert [e[0].name for e in aim.order(queue)] == ["baseline"] * 3 + ["other"] * 2
    assert work.aimed == [(aim.target, None)]                  # from the start: curves, no stop yet
    base.repeats = [run([3.0, 2.2, 2.05], seed=0), run([3.0, 2.1, 1.95], seed=1), run([3.0, 2.3, 2.0], seed=2)]
    aim.after_run([(base, 2, None)])                           # a baseline run still queued: nothing yet
    assert len(work.aimed) == 1
    aim.after_run([(other, 0, "b")])
    target, cap = work.aimed[-1]
    assert target.known and target.value == pytest.approx(2.0) and target.goal == "min"
    # its median samples to target: 300 (seeds 1 and 2 reach at 300, seed 0 never)
    assert cap == pytest.approx(6 * 300)


def test_a_rung_that_changes_the_math_gets_seeds_up_to_five_and_the_soonest_firm_rung_is_recommended():
    from trainfast.ablation.aim import Aim
    from trainfast.ablation.target import pick_soonest

    base = rung("baseline", [run([3.0, 2.4, 1.95], seed=s) for s in range(5)])
    same = rung("same", [run([3.0, 2.4, 1.95], seed=s, seconds_per_sample=0.008) for s in range(3)])
    better = rung("better", [run([2.5, 1.9, 1.6], seed=s, seconds_per_sample=0.005) for s in range(3)])
    aim = Aim(LOSS, [base, same, better], Work(), choice=lambda: None)
    aim.score()
    seeds = aim.seeds(10)
    assert [(r.name, i, b) for r, i, b in seeds] == [("better", 10, None), ("better", 11, None)]
    assert aim.seeds(12) == []                                 # queued already: not again
    assert pick_soonest([base, same, better]) is better
    better.result.to_target["verdict"] = SAME
    assert pick_soonest([base, same, better]) is same


def test_train_stops_at_its_target_and_says_when(digits16, tmp_path):
    import json

    from tests.conftest import tiny_resnet
    from trainfast import train

    result = train(tiny_resnet, digits16, recipe=Recipe(batch_size=32, epochs=3, log_every=4), device="cpu",
                   out=tmp_path, target="val_loss<=2.25")
    points = result.curve["curve"]
    assert result.curve["curve_stopped"] == "reached" and points[-1]["metrics"]["val_loss"] <= 2.25
    assert json.loads((tmp_path / "curve.json").read_text()) == result.curve
    with pytest.raises(TargetError, match="auto"):
        train(tiny_resnet, digits16, recipe=Recipe(batch_size=32), device="cpu", target="auto")


# --- end to end: a script's own evaluations, the built-in run's batch rung -----------------------------------------

@pytest.mark.slow
def test_a_session_script_is_judged_on_its_time_to_target_from_its_own_reports(tmp_path):
    from tests.test_ablate_command import ADOPTED, ablate

    out = tmp_path / "out"
    # one timed repeat: the baseline's runs are its seeds' (five whatever the repeats). The rung is passive_threads,
    # whose math is the baseline's bit for bit (test_passive_threads): its curve is the baseline's first seed's, inside
    # their band, so it takes the baseline's samples and runs no seeds of its own (amp here left the band and ran four
    # more, each a whole process). A rung that leaves the band and gets its seeds:
    # test_a_batch_rung_that_leaves_the_band_is_measured_over_five_seeds, and the seeds of Aim in
    # test_a_rung_that_changes_the_math_gets_seeds_up_to_five_and_the_soonest_firm_rung_is_recommended.
    _, results = ablate(out, "--target", "auto", "--switches", "passive_threads", "--repeats", "1",
                        "--settle-within", "0", command=[sys.executable, ADOPTED, "--epochs", "2", "--eval-every", "5"])
    target = results["settings"]["target"]
    assert target["auto"] and target["name"] == "val_accuracy" and target["goal"] == "max" and target["cap_seen"] > 0
    base, same = results["rungs"]
    runs = base["runs"] + base["seed_runs"]
    assert len(base["runs"]) == 1 and len(runs) == 5                       # 1 repeat and 4 seeds
    assert all(len(r["curve"]) >= 8 for r in runs)                         # every 5 of 44 steps, each seed
    assert all(r["curve_stopped"] == "end" for r in runs)                   # auto: the baseline sets the level
    assert {r["curve_stopped"] for r in same["runs"]} <= {"reached", "cap", "end"}
    assert all(len(r["curve"]) == len(runs[0]["curve"]) for r in same["runs"] if r["curve_stopped"] != "cap")
    assert same["to_target"]["samples_from"] == "baseline" and not same.get("seed_runs"), same["to_target"]
    for rung in (base, same):
        summary = rung["to_target"]
        assert summary["runs"] == len(rung["runs"]) + len(rung.get("seed_runs", []))
        assert summary["verdict"] in ("reference", "sooner", "later", "no measurable difference",
                                      "did not reach the target")
    report = (out / "report.md").read_text()
    assert "## Time to target" in report and (out / "target_curves.png").exists()


@pytest.mark.slow
def test_a_batch_rung_that_leaves_the_band_is_measured_over_five_seeds(digits16, tmp_path):
    from tests.conftest import tiny_resnet
    from trainfast import ablate
    from trainfast.ablation.rung import TimingBudget

    # one epoch: 66 steps of the baseline, 16 of batch_4x, each of the up to ten runs half of two epochs' (its curve's
    # evaluations and the ladder's verdicts need no more)
    result = ablate(tiny_resnet, digits16.train, digits16.val, recipe=Recipe(batch_size=32, epochs=1), out=tmp_path,
                    rungs=["batch_4x"], repeats=2, show=False, mean=digits16.mean, std=digits16.std,
                    settle_within_s=0, target="auto", budget=TimingBudget(steps=4, seconds=1.0, floor=2,
                                                                          min_seconds=0.0))
    base, batch = result.rungs
    summary = batch.result.to_target
    assert summary is not None and base.result.to_target["runs"] == 5
    if summary["samples_from"] == "measured":
        assert summary["runs"] == 5 and len(batch.seed_runs) == 3
        assert summary["samples_ratio"] is not None
    else:
        assert summary["runs"] == 2 and not batch.seed_runs
    assert result.best_name in ("baseline", "batch_4x")


def test_tune_weighs_the_rate_pick_and_its_batch_sizes_and_keeps_the_pick_unless_another_is_measurably_sooner():
    from trainfast.results import AblationResult
    from trainfast.tune.combine import Decision
    from trainfast.tune.target import PICK, choose, halved, lost_accuracy, target_candidates

    base, picked = Recipe(batch_size=16, lr=1e-3, warmup_steps=20), Recipe(batch_size=16, lr=1e-3, warmup_steps=20,
                                                                         precision="bf16")
    names = [r.name for r in target_candidates(base, picked, train_samples=1000)]
    assert names == ["baseline", PICK, "batch_half", "batch_2x", "batch_4x"]
    # A single the rate search left out for its accuracy at the planned step gets its hearing on the rate pick;
    # one that kept its accuracy, or was never run, does not.
    grouped, fused, failed = rung("+group_by_length", []), rung("+fused", []), rung("+compile", [])
    grouped.changes, fused.changes, failed.changes = {"group_by_length": True}, {"optimizer_impl": "fused"}, \
        {"compile": True}
    grouped.result.metric_worse, fused.result.metric_worse, failed.result.metric_worse = True, False, True
    failed.status = Status.FAILED
    dropped = lost_accuracy([rung("baseline", []), grouped, fused, failed])
    assert dropped == [grouped]
    extra = target_candidates(base, picked, train_samples=1000, accuracy_dropped=dropped)[-1]
    assert extra.name == "group_by_length" and extra.recipe == picked.replace(group_by_length=True)
    assert extra.changes == {"precision": "bf16", "group_by_length": True}
    assert [r.name for r in target_candidates(base, picked, train_samples=200)][-1] == "batch_2x"   # 64 x 4 > 200
    half = halved(picked)
    assert (half.batch_size, half.warmup_steps) == (8, 40) and half.lr == pytest.approx(1e-3 / 2 ** 0.5)

    def stage(times: dict[str, list[float]]) -> AblationResult:
        rungs = [rung(name, []) for name in times]
        for r in rungs:
            t = times[r.name]
            speedup, interval = ratio_interval(times["baseline"], t)
            interval = interval or [1.0, 1.0]
            r.result.to_target = {"time_s": sorted(t)[len(t) // 2], "times": t, "speedup": speedup,
                                  "interval": interval, "samples_from": "measured", "reached": len(t),
                                  "runs": len(t), "verdict": "reference" if r.name == "baseline"
                                  else SOONER if interval[0] > 1 else SAME}
        return AblationResult(rungs, {}, "", None, None, {})

    decision = Decision(picked, "bf16")
    clear = stage({"baseline": [10, 10.5, 9.5, 10.2, 9.8], PICK: [8, 8.2, 7.9], "batch_half": [5, 5.2, 4.9, 5.1, 5]})
    chosen = choose(clear, decision, 0.05)
    assert chosen.name == "bf16 + batch_half" and chosen.recipe is clear.rungs[2].recipe
    assert chosen.speedup == pytest.approx(2) and chosen.headline().startswith("2.00x sooner than the baseline")
    close = stage({"baseline": [10, 10.5, 9.5, 10.2, 9.8], PICK: [8, 8.2, 7.9], "batch_half": [7.9, 8.3, 7.8]})
    stands = choose(close, Decision(picked, "bf16", speedup=1.4), 0.05)
    assert stands.recipe is picked and stands.speedup == pytest.approx(10 / 8)     # the pick's time, not its rate
