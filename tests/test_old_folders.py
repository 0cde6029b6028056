"""A results folder an earlier version wrote still opens, reports and resumes: the folder in data/old_ablation is
what `trainfast ablate --image-size 16 --batch-size 32 --epochs 1 --rungs fused --repeats 1 --noise-seeds 2
--timing-steps 20 --settle-within 0` wrote at results.json schema 4, when the judged metric's numbers were named
`accuracy*` (its plan.json, its three run records, and its results.json less the records it repeats; kept out of a
folder named runs/, which git ignores)."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from trainfast import Recipe

OLD = Path(__file__).parent / "data" / "old_ablation"


class OldFolderWork:
    """The built-in work's protocol around a fake launch: the folder holds the baseline's two runs; the fused rung's
    run is "launched" here and returns the record the old version wrote for it."""
    dev, base, learned = torch.device("cpu"), Recipe(), {}

    def __init__(self, settings, record, flops_per_sample) -> None:
        self.settings, self.record, self.flops_per_sample, self.launched = settings, record, flops_per_sample, []

    def mark_effects(self, plan) -> None:
        return None

    def launcher(self, measure):
        def launch(rung, recipe, budget, run_dir, display, limit):
            self.launched.append(rung.name)
            return dict(self.record)
        return launch

    def metric(self, measure):
        from trainfast.ablation.metric import TASK_METRIC

        return TASK_METRIC, "max"

    def after_run(self, plan):
        return None


def test_a_schema_4_folder_opens_reports_and_resumes_in_metric_names(tmp_path):
    from trainfast.ablation.loop import LadderOptions, run_ladder
    from trainfast.ablation.rung import TimingBudget
    from trainfast.results import SCHEMA_VERSION, Rung

    old = json.loads((OLD / "results.json").read_text())
    assert old["schema_version"] == 4 and "accuracy_band" in old["rungs"][0] and "accuracy" in old["baseline_seeds"][0]
    out = tmp_path / "old"
    (out / "runs").mkdir(parents=True)
    shutil.copy(OLD / "plan.json", out)
    for key in ("baseline-r0", "baseline-r1"):          # the fused rung's run is left to the resume
        shutil.copy(OLD / f"{key}.json", out / "runs")
    plan_json = json.loads((out / "plan.json").read_text())
    changes = {"baseline": {}, "fused": {"optimizer_impl": "fused"}}
    plan = [Rung(name, changes[name], Recipe.from_dict(recipe)) for name, recipe in plan_json["rungs"].items()]
    work = OldFolderWork(plan_json, json.loads((OLD / "fused-r0.json").read_text()),
                         old["rungs"][0]["flops_per_sample"])
    options = LadderOptions(mode=plan_json["mode"], repeats=plan_json["repeats"],
                            noise_seeds=plan_json["noise_seeds"], budget=TimingBudget(**plan_json["budget"]),
                            min_effect=plan_json["min_effect"], resume=True, show=False, settle_within_s=0)
    result = run_ladder(plan, work, plan_json, out, options)

    # resumed: the baseline's runs read back, the missing one run
    assert work.launched == ["fused"] and all(r["reused"] for r in result.rungs[0].repeats + result.rungs[0].seed_runs)
    data = json.loads((out / "results.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 6
    assert data["metric"]["name"] == "accuracy" and data["metric"]["goal"] == "max"
    # the same numbers as the old version's, under the metric's names, and no field named accuracy left
    for new, was in zip(data["rungs"], old["rungs"]):
        assert not [k for k in new if k.startswith("accuracy")], new["name"]
        assert new["metric"] == was["metric"] and new["metric"]["value"] == was["accuracy"]
        assert new["metric_values"] == was["accuracies"]
        for key in ("reference", "delta", "band", "flag", "worse"):
            assert new[f"metric_{key}"] == pytest.approx(was[f"accuracy_{key}"]), key
        assert new["verdict"] == was["verdict"] and new["status"] == was["status"] == "done"
    assert [s["metric"] for s in data["baseline_seeds"]] == [s["accuracy"] for s in old["baseline_seeds"]]
    # reported: the band in words, and the metric's chart
    report = (out / "report.md").read_text()
    assert "Accuracy noise band: ±0.029" in report and "(0.967, 0.983)" in report
    assert (out / "metric.png").exists() and not (out / "accuracy.png").exists()


def test_a_scripts_run_recorded_before_its_optimizer_was_observed_by_another_key_resumes_in_todays(tmp_path):
    """A schema-5 run record of a script keyed its optimizer's implementation `optimizer_impl`, the switch's field
    (in the observed section and its `by`): a resume reads it back as today's run records write it, so the report
    says what the script's optimizer ran and who set it."""
    from trainfast.ablation.store import RunStore
    from trainfast.report.observed import describe

    seen = {"precision": "bf16", "autocast": True, "compiled": False, "recompiles": 0, "optimizer": "AdamW",
            "optimizer_impl": "fused", "loader": None, "memory_format": None,
            "by": {"precision": "trainfast", "optimizer_impl": "script"}}
    settings = {"metric_name": "eval_loss"}
    store = RunStore(tmp_path, settings, resume=False)
    store.save("baseline-r0", {"metric": {"name": "eval_loss", "goal": "min", "value": 0.5}, "observed": seen})
    read = RunStore(tmp_path, settings, resume=True).load("baseline-r0")
    assert read["observed"]["optimizer_implementation"] == "fused" and "optimizer_impl" not in read["observed"]
    assert read["observed"]["by"] == {"precision": "trainfast", "optimizer_implementation": "script"}
    assert read["metric"]["value"] == 0.5 and read["reused"]
    assert "AdamW fused (script)" in describe(read["observed"])
