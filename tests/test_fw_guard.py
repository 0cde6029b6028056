"""The accuracy guard on framework scripts, end to end: `trainfast ablate --measure full` on a Trainer, Lightning
and Accelerate script (tests/scripts/fw_hurt.py) whose bf16 rung is faster but never learns. Each run's metric
is the one the framework computed, named as the script logs it; the rung is measured faster, flagged outside the
baseline's noise band, and not recommended; the report says which metric was judged and why."""
from __future__ import annotations

import math
import sys

import pytest
from fwkit import ROOT
from test_ablate_command import ablate, rungs

SCRIPT = str(ROOT / "tests" / "scripts" / "fw_hurt.py")
# framework -> (the package it needs, the metric judged, what the report gives as the reason)
CASES = {"hf": ("transformers", "eval_accuracy", "metric_for_best_model='accuracy'"),
         "lightning": ("lightning", "val_loss", "the validation loss"),
         "accelerate": ("accelerate", "eval_loss", "the validation loss")}


@pytest.mark.slow
@pytest.mark.parametrize("framework", list(CASES))
def test_a_faster_rung_that_ruins_the_frameworks_metric_is_not_recommended(tmp_path, framework):
    package, metric, why = CASES[framework]
    pytest.importorskip(package)
    out = tmp_path / "ab"
    _, results = ablate(out, "--switches", "amp", "--measure", "full", "--repeats", "3", "--noise-seeds", "3",
                        "--settle-within", "0", command=[sys.executable, SCRIPT, "--framework", framework])
    by_name = rungs(results)
    base, amp = by_name["baseline"], by_name["amp"]
    assert base["status"] == "done" and amp["status"] == "done", (base, amp)
    assert results["metric"]["name"] == metric and why in results["metric"]["why"], results["metric"]
    for rung in (base, amp):
        for run in rung["runs"]:
            assert math.isfinite(run["reported"][metric]), run["reported"]
    assert amp["verdict"] == "faster", amp
    assert amp["metric_worse"] is True and amp["metric_flag"] is True, amp
    assert results["best"]["name"] == "baseline"
    report = (out / "report.md").read_text()
    assert f"Judged on {metric}" in report and "recommended: baseline" in report
