"""`trainfast ablate` end to end on a small configuration: the report folder, the results.json schema,
no-effect rungs not run, every measured rung trained to a real accuracy."""
import json
import subprocess
import sys

import pytest
import torch
from conftest import scored_rung, tiny_resnet

from trainfast import Recipe, RecipeError, ablate
from trainfast.ablation.scoring import metric_band, pick_best, score_rungs
from trainfast.techniques.precision import auto_amp_dtype, slow_half_reason

RUNG_KEYS = {"name", "recipe", "effect", "verdict", "throughput", "throughput_interval", "speedup", "speedup_interval",
             "epoch_time_s", "peak_memory_bytes", "metric", "loss", "flops_per_s", "ceiling_fraction", "runs"}
CPU = torch.device("cpu")
VERDICTS = {"faster", "slower", "no measurable difference"}


@pytest.fixture(scope="module")
def cli_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablate") / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "trainfast", "ablate", "--image-size", "16", "--epochs", "2", "--batch-size", "32",
         "--rungs", "amp,non_blocking,channels_last", "--noise-seeds", "2", "--repeats", "2", "--settle-within", "0",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return out, proc.stdout


@pytest.mark.slow
@pytest.mark.alone
def test_report_folder_has_everything(cli_report):
    out, stdout = cli_report
    for name in ("results.json", "report.md", "throughput.png", "peak_memory.png", "metric.png"):
        assert (out / name).stat().st_size > 0, name
    assert "baseline (fp32)" in stdout and "no effect on this device" in stdout   # the printed table


@pytest.mark.slow
@pytest.mark.alone
def test_results_schema_and_numbers(cli_report):
    out, _ = cli_report
    data = json.loads((out / "results.json").read_text())
    env = data["environment"]
    for key in ("device", "device_name", "cpu_flags", "torch", "timm", "git_sha"):
        assert key in env
    names = [r["name"] for r in data["rungs"]]
    assert names == ["baseline", "amp", "non_blocking", "channels_last"]
    seeds = data["baseline_seeds"]
    assert [s["seed"] for s in seeds] == [0, 1] and all(s["metric"] > 0.5 for s in seeds)
    for rung in data["rungs"]:
        assert RUNG_KEYS <= set(rung), RUNG_KEYS - set(rung)
        assert Recipe.from_dict(rung["recipe"])          # the full recipe, loadable
    measured = [r for r in data["rungs"] if r["effect"] == "measured"]
    for rung in measured:
        assert rung["throughput"] > 0 and rung["epoch_time_s"] > 0 and rung["peak_memory_bytes"] > 2**20
        assert rung["metric"]["value"] > 0.5, rung   # chance is 0.1
        assert 0 < rung["ceiling_fraction"] < 5 and rung["flops_per_s"] > 0
        lo, hi = rung["throughput_interval"]
        assert lo <= rung["throughput"] <= hi
        assert [run["seed"] for run in rung["runs"]] == [0, 1]          # two repeats, seed + i
        for run in rung["runs"]:                                       # each timed over steady steps
            timing = run["timing"]
            assert timing["warmup_steps"] >= 1 and timing["timed_steps"] >= 16
            assert run["steps_run"] >= timing["warmup_steps"] + timing["timed_steps"]
    assert data["rungs"][0]["verdict"] == "reference"
    amp = data["rungs"][1]
    assert amp["recipe"]["precision"] in ("bf16", "fp16")
    if slow_half_reason(CPU, auto_amp_dtype(CPU)):
        # a CPU without half-precision hardware (AVX2 only): the amp rung is not run, its measurement is the
        # reason, and the ladder climbs on in fp32 without it
        assert amp["status"] == "no-effect" and amp["verdict"] == "not run: slower on this device"
        assert "GFLOP/s" in amp["effect_reason"] and amp["runs"] == [] and amp["throughput"] is None
        assert data["rungs"][3]["recipe"]["precision"] == "fp32"
        assert data["rungs"][3]["vs_previous"]["rung"] == "baseline"
        assert "not run: " in (out / "report.md").read_text()
    else:
        assert amp["verdict"] in VERDICTS
        assert amp["speedup_interval"][0] <= amp["speedup"] <= amp["speedup_interval"][1]
        assert data["rungs"][3]["vs_previous"]["rung"] == "amp"        # cumulative: against the rung above
    assert data["best"]["name"] in data["best"]["tie"]
    assert data["settings"]["repeats"] == 2


@pytest.mark.slow
@pytest.mark.alone
def test_no_effect_rung_is_reported_not_measured(cli_report):
    out, _ = cli_report
    data = json.loads((out / "results.json").read_text())
    rung = next(r for r in data["rungs"] if r["name"] == "non_blocking")
    if torch.cuda.is_available():
        pytest.skip("non_blocking acts on CUDA")
    assert rung["effect"] == "no-effect" and rung["throughput"] is None
    assert rung["verdict"] == "no effect on this device"
    assert "only acts on CUDA" in rung["effect_reason"]
    report = (out / "report.md").read_text()
    assert "+non_blocking**: no effect on this device" in report


@pytest.mark.slow
@pytest.mark.alone
def test_python_api_with_own_model_and_datasets(tmp_path, digits16):
    from trainfast.ablation.rung import TimingBudget

    # One pass over a few timed steps (no passes added to settle a noisy verdict): what is checked is the
    # folder, its refusal and its reuse, not the speeds.
    kwargs = dict(mean=digits16.mean, std=digits16.std, recipe=Recipe(epochs=1, batch_size=32), rungs=["fused"],
                  out=tmp_path, show=False, noise_seeds=1, repeats=1, settle_within_s=0,
                  budget=TimingBudget(steps=4, seconds=1.0, floor=2, min_seconds=0.0))
    result = ablate(tiny_resnet, digits16.train, digits16.val, **kwargs)
    assert [r.status for r in result.rungs] == ["done", "done"]
    assert result.best_name in ("baseline", "fused")
    assert (tmp_path / "results.json").exists()
    first = json.loads((tmp_path / "results.json").read_text())
    # every rung's step alone: timed on a resident batch after the epoch, warm-up left out, scored against the
    # baseline's (on the CPU the wait is the host's: no copy figure)
    for rung in first["rungs"]:
        alone = rung["runs"][0]["step_alone"]
        assert len(alone["step_seconds"]) >= 3 and alone["steps"] >= 1 and alone["seconds"] > 0     # disturbed left out
        assert rung["step_alone"] == alone["throughput"]
        assert rung["epoch_of_step"] > 0 and rung["copy_fraction"] is None
    assert first["rungs"][0]["step_alone_speedup"] == 1.0
    # every run says its judged metric by name and goal, and what its rate counts; the rung's metric is their mean
    for rung in first["rungs"]:
        run = rung["runs"][0]
        assert run["metric"]["name"] == "accuracy" and run["metric"]["goal"] == "max" and run["unit"] == "samples"
        assert rung["metric"] == {"name": "accuracy", "goal": "max", "value": run["metric"]["value"]}

    # The same folder again is refused without --resume (nothing is overwritten) ...
    with pytest.raises(RecipeError, match="already holds an ablation"):
        ablate(tiny_resnet, digits16.train, digits16.val, **kwargs)
    # ... reused with it: every finished run is read back, the numbers identical ...
    again = ablate(tiny_resnet, digits16.train, digits16.val, **kwargs, resume=True)
    assert all(run.get("reused") for r in again.rungs for run in r.repeats)
    second = json.loads((tmp_path / "results.json").read_text())
    for a, b in zip(first["rungs"], second["rungs"]):
        assert a["throughput"] == b["throughput"] and a["metric"] == b["metric"] and a["verdict"] == b["verdict"]
    # ... and so are records written before `metric` and `unit`, whose `accuracy` held the judged metric.
    for path in (tmp_path / "runs").glob("*.json"):
        record = json.loads(path.read_text())
        metric = record.pop("metric")
        del record["unit"]
        path.write_text(json.dumps({**record, "accuracy": metric["value"]}))
    third = ablate(tiny_resnet, digits16.train, digits16.val, **kwargs, resume=True)
    assert [r.result.metric for r in third.rungs] == [r["metric"]["value"] for r in first["rungs"]]
    # ... and a different plan is refused with the difference named, never mixed.
    changed = dict(kwargs, rungs=["channels_last"])
    with pytest.raises(RecipeError, match="differs from this command in rungs"):
        ablate(tiny_resnet, digits16.train, digits16.val, **changed, resume=True)


def test_noise_band_and_best_pick():
    band = metric_band(0.9, 400)
    assert 0.03 < band < 0.05            # 2 * sqrt(2 * 0.9 * 0.1 / 400) = 0.042
    # seed-to-seed spread dominates: 2 * stdev(0.8, 0.9, 1.0) * sqrt(1 + 1/3)
    assert metric_band(0.9, 400, [0.8, 0.9, 1.0]) == pytest.approx(2 * 0.1 * (4 / 3) ** 0.5)
    assert metric_band(0.9, 400, [0.9, 0.9, 0.9]) == band
    # a rung measured as the mean of 2 seeds is compared with a narrower band: sqrt(1/2 + 1/3)
    assert metric_band(0.9, 400, [0.8, 0.9, 1.0], runs=2) == pytest.approx(2 * 0.1 * (1 / 2 + 1 / 3) ** 0.5)

    rungs = [scored_rung("baseline", [100, 100], 0.90),
             scored_rung("fast_but_wrong", [300, 300], 0.70, set_to_none=True),
             scored_rung("fast", [200, 200], 0.89, channels_last=True)]
    score_rungs(rungs, {"fp32": 10.0}, [0.90, 0.91, 0.89])
    assert rungs[1].result.metric_flag and not rungs[2].result.metric_flag
    assert rungs[2].result.speedup == pytest.approx(2.0, rel=0.05)
    assert pick_best(rungs)[0].name == "fast"
    # O3 (pure half, no fp32 master) is faster and inside the band, but risky by construction: never picked.
    rungs.append(scored_rung("pure-bf16", [400, 400], 0.90, precision="bf16", precision_level="pure"))
    score_rungs(rungs, {"fp32": 10.0, "bf16": 20.0}, [0.90, 0.91, 0.89])
    assert not rungs[3].result.metric_flag and pick_best(rungs)[0].name == "fast"


@pytest.mark.slow
@pytest.mark.alone
def test_progress_lines_and_the_time_taken_beside_the_planned(cli_report):
    """Off a terminal each run's line says runs done of planned and the time left; the report sets the time the
    ablation took beside the time planned after its first pass (report/progress.py)."""
    import re

    out, stdout = cli_report
    assert "1 of " in stdout and "time left after the first of them" in stdout
    assert re.search(r"\(\d+ of \d+ runs, ~\d+ (s|min) left\)", stdout), stdout
    data = json.loads((out / "results.json").read_text())
    took = data["settings"]["time"]
    measured = [r for r in data["rungs"] if r["effect"] == "measured"]     # amp is not run on a CPU without bf16
    assert took["runs"] >= 2 * len(measured) >= 4 and took["total_s"] > 0 and took["planned_s"] > 0
    assert "The ablation took" in (out / "report.md").read_text()
