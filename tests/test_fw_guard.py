"""The accuracy guard on a framework script, end to end: `trainfast ablate --measure full` on a Trainer script
(tests/scripts/fw_hurt.py) whose bf16 rung is faster but never learns. The run's metric is the one the Trainer
computed (its metric_for_best_model), named as the script logs it; the rung is measured faster, flagged outside
the baseline's noise band, and not recommended; the report says which metric was judged and why.

One framework end to end: the guard (the band, the flag, the recommendation) is the same code whatever framework
ran the script. What differs per framework, how its metric is read and which one is chosen, is proven in
test_fw_metrics.py without an ablation: the Trainer's compute_metrics, Lightning's logged val_loss and
accelerator.log, each recorded as logged, and choose_metric's order (declared metric, then the validation loss).
fw_hurt.py --framework lightning or accelerate runs the same ablation by hand."""
from __future__ import annotations

import math
import sys

import pytest
from fwkit import ROOT
from test_ablate_command import ablate, rungs

SCRIPT = str(ROOT / "tests" / "scripts" / "fw_hurt.py")


@pytest.mark.slow
@pytest.mark.alone
def test_a_faster_rung_that_ruins_the_trainers_metric_is_not_recommended(tmp_path):
    pytest.importorskip("transformers")
    metric, why = "eval_accuracy", "metric_for_best_model='accuracy'"
    out = tmp_path / "ab"
    _, results = ablate(out, "--switches", "amp", "--measure", "full", "--repeats", "2", "--noise-seeds", "2",
                        "--settle-within", "0", command=[sys.executable, SCRIPT, "--framework", "hf"])
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
