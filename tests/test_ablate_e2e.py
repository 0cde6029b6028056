"""`trainfast ablate` end to end on a small configuration: the report folder, the results.json schema,
no-effect rungs not run, every measured rung trained to a real accuracy."""
import json
import subprocess
import sys

import pytest
import torch

from conftest import tiny_resnet
from trainfast import Recipe, ablate
from trainfast.ablate import accuracy_band, pick_best, score_rungs

RUNG_KEYS = {"name", "recipe", "effect", "throughput", "throughput_spread", "epoch_time_s", "peak_memory_bytes",
             "accuracy", "loss", "flops_per_s", "ceiling_fraction"}


@pytest.fixture(scope="module")
def cli_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablate") / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "trainfast", "ablate", "--image-size", "16", "--epochs", "2", "--batch-size", "32",
         "--rungs", "amp,non_blocking,channels_last", "--noise-seeds", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return out, proc.stdout


def test_report_folder_has_everything(cli_report):
    out, stdout = cli_report
    for name in ("results.json", "report.md", "throughput.png", "peak_memory.png", "accuracy.png"):
        assert (out / name).stat().st_size > 0, name
    assert "baseline (fp32)" in stdout and "no effect on this device" in stdout   # the printed table


def test_results_schema_and_numbers(cli_report):
    out, _ = cli_report
    data = json.loads((out / "results.json").read_text())
    env = data["environment"]
    for key in ("device", "device_name", "cpu_flags", "torch", "timm", "git_sha"):
        assert key in env
    names = [r["name"] for r in data["rungs"]]
    assert names == ["baseline", "amp", "non_blocking", "channels_last"]
    seeds = data["baseline_seeds"]
    assert [s["seed"] for s in seeds] == [0, 1] and all(s["accuracy"] > 0.5 for s in seeds)
    for rung in data["rungs"]:
        assert RUNG_KEYS <= set(rung), RUNG_KEYS - set(rung)
        assert Recipe.from_dict(rung["recipe"])          # the full recipe, loadable
    measured = [r for r in data["rungs"] if r["effect"] == "measured"]
    for rung in measured:
        assert rung["throughput"] > 0 and rung["epoch_time_s"] > 0 and rung["peak_memory_bytes"] > 2**20
        assert rung["accuracy"] > 0.5, rung   # chance is 0.1
        assert 0 < rung["ceiling_fraction"] < 5 and rung["flops_per_s"] > 0
    amp = data["rungs"][1]
    assert amp["recipe"]["precision"] in ("bf16", "fp16")


def test_no_effect_rung_is_reported_not_measured(cli_report):
    out, _ = cli_report
    data = json.loads((out / "results.json").read_text())
    rung = next(r for r in data["rungs"] if r["name"] == "non_blocking")
    if torch.cuda.is_available():
        pytest.skip("non_blocking acts on CUDA")
    assert rung["effect"] == "no-effect" and rung["throughput"] is None
    assert "only acts on CUDA" in rung["effect_reason"]
    report = (out / "report.md").read_text()
    assert "+non_blocking**: no effect on this device" in report


def test_python_api_with_own_model_and_datasets(tmp_path, digits16):
    result = ablate(tiny_resnet, digits16.train, digits16.val, mean=digits16.mean, std=digits16.std,
                    recipe=Recipe(epochs=1, batch_size=32), rungs=["set_to_none"], out=tmp_path, show=False,
                    noise_seeds=1)
    assert [r.status for r in result.rungs] == ["done", "done"]
    assert result.best_name in ("baseline", "set_to_none")
    assert (tmp_path / "results.json").exists()


def test_noise_band_and_best_pick():
    band = accuracy_band(0.9, 400)
    assert 0.03 < band < 0.05            # 2 * sqrt(2 * 0.9 * 0.1 / 400) = 0.042
    # seed-to-seed spread dominates: 2 * stdev(0.8, 0.9, 1.0) * sqrt(1 + 1/3)
    assert accuracy_band(0.9, 400, [0.8, 0.9, 1.0]) == pytest.approx(2 * 0.1 * (4 / 3) ** 0.5)
    assert accuracy_band(0.9, 400, [0.9, 0.9, 0.9]) == band

    class R:
        def __init__(self, name, status, **result):
            self.name, self.status, self.result, self.recipe = name, status, result, Recipe()

    rungs = [R("baseline", "done", throughput=100.0, accuracy=0.90, val_samples=400, peak_memory_bytes=10, flops_per_s=1.0),
             R("fast_but_wrong", "done", throughput=300.0, accuracy=0.70, val_samples=400, peak_memory_bytes=10, flops_per_s=1.0),
             R("fast", "done", throughput=200.0, accuracy=0.89, val_samples=400, peak_memory_bytes=10, flops_per_s=1.0)]
    score_rungs(rungs, {"fp32": 10.0}, [0.90, 0.91, 0.89])
    assert rungs[1].result["accuracy_flag"] and not rungs[2].result["accuracy_flag"]
    assert rungs[2].result["speedup"] == 2.0
    assert pick_best(rungs).name == "fast"
    # O3 (pure half, no fp32 master) is faster and inside the band, but risky by construction: never picked.
    pure = R("pure-bf16", "done", throughput=400.0, accuracy=0.90, val_samples=400, peak_memory_bytes=10, flops_per_s=1.0)
    pure.recipe = Recipe(precision="bf16", precision_level="pure")
    rungs.append(pure)
    score_rungs(rungs, {"fp32": 10.0, "bf16": 20.0}, [0.90, 0.91, 0.89])
    assert not pure.result["accuracy_flag"] and pick_best(rungs).name == "fast"
