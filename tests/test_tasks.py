"""The Task base: every task's declarations, the rule that rules out a switch on data a task does not offer, and the
neutral metric and unit every run record and results.json carry (an older run folder still resumes)."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from trainfast.ablation.ladders import LADDERS, plan_rungs
from trainfast.recipe import Recipe, RecipeError
from trainfast.results import EffectLabel, Status
from trainfast.tasks import TASKS, Metric, Task, TaskDeclaration, as_task, build_task
from trainfast.tasks.classification import Classification
from trainfast.techniques import owners, rung_table
from trainfast.techniques.switch import DATA_KINDS

CPU = torch.device("cpu")
# An ablation folder's plan.json and the baseline's record in its runs/, as `ablate --task lm --switches amp` wrote
# them before `metric` and `unit` (kept out of a folder named runs/, which git ignores)
OLD_LM_RUN = Path(__file__).parent / "data" / "old_lm_run"


def test_every_task_declares_what_the_rest_reads():
    for name in TASKS:
        task = build_task(name)
        assert isinstance(task, Task) and task.name == name and task.ladder in LADDERS
        assert task.metric.goal in ("max", "min") and task.metric.name and task.metric.label
        assert task.rate_unit in ("samples", "images", "tokens") and task.batches
        assert "" in task.offers and task.offers <= set(DATA_KINDS)
        assert task.default_model and task.default_data and isinstance(task.default_recipe, Recipe)
    assert build_task("lm").metric.goal == "min" and build_task("lm").rate_unit == "tokens"
    assert build_task("detection").rate_unit == "images" and build_task("detection").loss_terms
    loss = nn.CrossEntropyLoss()
    assert isinstance(as_task(loss), Classification) and as_task(loss).loss_fn is loss     # a bare loss function
    task = build_task("lm")
    assert as_task(task) is task


def test_each_task_is_its_declaration_registered_by_name():
    """The declarations the command line reads before torch are the ones the task objects answer with."""
    from trainfast.tasks import declared, task_class

    for name in TASKS:
        declaration = declared(name)
        assert task_class(name).declaration is declaration and build_task(name).metric is declaration.metric
        assert task_class(name).rate_unit == declaration.rate_unit          # on the class as on its objects
        assert build_task(name).default_recipe is declaration.default_recipe
    with pytest.raises(RecipeError, match="--task 'speech' is not one of classification, detection, lm"):
        build_task("speech")


def test_a_task_must_implement_what_tasks_differ_in():
    """Task is abstract: a task that leaves out one of the points where tasks differ cannot be made, and the
    methods every caller uses are declared on the base."""
    with pytest.raises(TypeError, match="abstract"):
        Task()
    methods = {"forward", "score", "probe_batch", "evaluate", "judged", "rung_metrics", "train_metrics",
               "val_metrics", "summary", "load_data", "build_model", "resolve_workers", "build_loaders",
               "flops_per_sample"}
    assert Task.__abstractmethods__ == methods
    partial = {name: getattr(Classification, name) for name in methods - {"summary"}}
    with pytest.raises(TypeError, match="summary"):
        type("NoSummary", (Task,), {"declaration": Classification.declaration, **partial})()
    for shared in ("validate", "rules_out", "data_reason", "task_effect", "check_model", "count_batch",
                   "tokens_per_sample", "apply_schedule"):
        assert callable(getattr(Task, shared))


# A task outside trainfast: its declaration names its implementation by module, which build_task imports.
SPEECH = TaskDeclaration(
    name="speech", metric=Metric("word error rate", "WER", "min"), rate_unit="seconds", offers=frozenset({""}),
    batches="audio frames", implementation=f"{__name__}:Speech", default_model="tiny-asr", default_data="synthetic",
    models=("tiny-asr",), image_size="audio has no images",
    refusals=(lambda recipe: "no dp for speech" if recipe.strategy == "dp" else None,))


class Speech(Classification):
    declaration = SPEECH

    def __init__(self, loss_fn=None, dist=None, recipe=None) -> None:
        super().__init__(loss_fn, dist, recipe)
        self.recipe = recipe


def test_a_new_task_is_its_declaration_and_its_implementation():
    """Registered by name: build_task finds it (made with the run's loss, Dist and recipe), the command line's checks
    read its declaration, and its own refusals are refused in a recipe."""
    from trainfast.tasks import declared, infer_task, register
    from trainfast.tasks.declarations import REGISTRY

    register(SPEECH)
    try:
        assert declared("speech") is SPEECH and infer_task(None, "tiny-asr") == "speech"
        assert SPEECH.rules_out({"channels_last": True}) is not None and SPEECH.rules_out({"epochs": 2}) is None
        with pytest.raises(RecipeError, match="no dp for speech"):
            SPEECH.validate(Recipe(strategy="dp"))
        with pytest.raises(RecipeError, match="--image-size 32: audio has no images"):
            SPEECH.check_image_size(32)
        loss, recipe = nn.MSELoss(), Recipe(epochs=2)
        task = build_task("speech", loss, recipe=recipe)
        assert isinstance(task, Speech) and task.name == "speech" and task.loss_fn is loss and task.recipe is recipe
        with pytest.raises(LookupError, match="registered twice"):
            register(SPEECH)
    finally:
        REGISTRY.pop("speech", None)


def test_a_task_rules_out_every_rung_whose_data_it_does_not_offer():
    """Every rung any ladder can name, for every task: a switch declared on a kind of data the task does not offer is
    ruled out (not applicable, with the declaration's reason) before any run, and refused in a single run's recipe;
    a rung whose every switch's data the task offers is not ruled out by it."""
    for name in TASKS:
        task = build_task(name)
        nameable = rung_table(name)
        for rung, changes in rung_table(None).items():
            missing = {f: owners()[f].data for f in changes if owners()[f].data not in task.offers}
            why = task.rules_out(changes)
            if not missing:
                assert why is None, (name, rung, why)
                continue
            assert why is not None, f"the {name} task accepts {rung}, whose data ({missing}) it does not offer"
            for field, kind in missing.items():
                assert DATA_KINDS[kind] in why and task.batches in why
                effect = task.task_effect(field, CPU, None, None, changes[field])
                assert not effect.acts and effect.label == EffectLabel.NOT_APPLICABLE and effect.reason in why
            with pytest.raises(RecipeError, match="acts on"):
                task.validate(Recipe().replace(**{f: v for f, v in changes.items() if f in missing}))
            if rung in nameable:
                planned = {r.name: r for r in plan_rungs(Recipe(), [rung], "each", "bf16", CPU, name)}[rung]
                assert planned.status == Status.NO_EFFECT and planned.effect == EffectLabel.NOT_APPLICABLE
                assert planned.reason == why


@pytest.mark.parametrize("name, ruled_out", [
    ("classification", {"group_aspect_ratio", "padding_free", "group_by_length", "pad_to_multiple", "batch_tokens"}),
    ("detection", {"prefetch", "decode_cache", "device_decode", "padding_free", "group_by_length", "pad_to_multiple",
                   "batch_tokens"}),
    ("lm", {"prefetch", "channels_last", "decode_cache", "device_decode", "group_aspect_ratio"}),
])
def test_the_switches_declare_the_data_each_task_lacks(name, ruled_out):
    """The declarations behind the rule above: what each task's data has nothing for."""
    task = build_task(name)
    assert {f for f in owners() if task.data_reason(f)} == ruled_out


def test_a_cumulative_ladder_does_not_carry_a_ruled_out_switch():
    base, channels, fused = plan_rungs(Recipe(), ["channels_last", "fused"], "cumulative", "bf16", CPU, "lm")
    assert channels.effect == EffectLabel.NOT_APPLICABLE and "token ids" in channels.reason
    assert not fused.recipe.channels_last and fused.recipe.optimizer_impl == "fused"


def test_the_tasks_count_a_batch_in_their_rate_unit():
    from trainfast.text.batching import PadCollate

    images = (torch.zeros(8, 3, 4, 4), torch.zeros(8, dtype=torch.long))
    assert build_task("classification").count_batch(images) == 8
    detection = ([torch.zeros(3, 4, 5), torch.zeros(3, 6, 4)], [{}, {}])
    assert build_task("detection").count_batch(detection) == 2
    documents = [torch.arange(2, 7), torch.arange(2, 5)]          # 5 and 3 tokens, padded to 5
    batch = PadCollate(0)(documents)
    assert build_task("lm").count_batch(batch) == 8                # real tokens, never padding


# --- an older run folder: its records say `accuracy` and still resume ---------------------------------------------
class ResumedWork:
    """The built-in work's protocol around a fake launch: the run folder holds the baseline's old record; the amp
    rung's run is "launched" here and returns a record of today's shape."""
    dev, base, learned, flops_per_sample = CPU, Recipe(), {}, None

    def __init__(self, settings, record) -> None:
        self.settings, self.record, self.launched = settings, record, []

    def mark_effects(self, plan) -> None:
        return None

    def launcher(self, measure):
        def launch(rung, recipe, budget, run_dir, display, limit):
            self.launched.append(rung.name)
            return self.record
        return launch

    def metric(self, measure):
        from trainfast.ablation.metric import TASK_METRIC

        return TASK_METRIC, build_task("lm").metric.goal

    def after_run(self, plan):
        return None


def test_an_old_run_folder_whose_records_say_accuracy_resumes(tmp_path):
    from trainfast.ablation.loop import LadderOptions, run_ladder
    from trainfast.ablation.rung import TimingBudget
    from trainfast.ablation.store import comparable_plan
    from trainfast.results import Rung

    out = tmp_path / "old"
    (out / "runs").mkdir(parents=True)
    shutil.copy(OLD_LM_RUN / "plan.json", out)
    shutil.copy(OLD_LM_RUN / "baseline-r0.json", out / "runs")
    plan_json = json.loads((out / "plan.json").read_text())
    old = json.loads((out / "runs" / "baseline-r0.json").read_text())
    assert "metric" not in old and old["accuracy"] == old["loss"] and old["rate_unit"] == "samples/s"
    # Today's planning of the same command (ablate --task lm --switches amp on bf16) gives the plan in the folder.
    lm = build_task("lm")
    plan = plan_rungs(lm.default_recipe, ["amp"], "cumulative", "bf16", CPU, "lm")
    # (less the Recipe fields added since, at their defaults: they change nothing that runs, store.comparable_plan)
    today = {r.name: json.loads(json.dumps(r.recipe.to_dict())) for r in plan}
    assert comparable_plan(plan_json, {"rungs": today})["rungs"] == plan_json["rungs"]
    new = {k: v for k, v in old.items() if k != "accuracy"} | {
        "metric": lm.metric.value(old["loss"] + 0.01), "unit": "tokens", "rate_unit": "tokens/s", "seed": 0}
    settings = dict(plan_json, rate_unit="tokens/s")
    work = ResumedWork(settings, new)
    budget = TimingBudget(**plan_json["budget"])
    options = LadderOptions(repeats=1, noise_seeds=1, budget=budget, resume=True, show=False, settle_within_s=0)
    result = run_ladder([Rung(r.name, r.changes, r.recipe) for r in plan], work, settings, out, options)
    base, amp = result.rungs
    assert work.launched == ["amp"] and base.repeats[0]["reused"]            # the old record read back, not rerun
    assert base.result.metric == old["accuracy"] and amp.result.metric == old["loss"] + 0.01
    # read back in today's names (store.current_record): the value moved to `metric`, named as the plan names it
    assert base.repeats[0]["metric"] == {"name": "validation loss", "goal": None, "value": old["accuracy"]}
    assert "accuracy" not in base.repeats[0]
    assert amp.result.unit == "tokens" and base.result.unit is None          # an old record never said its unit
    data = json.loads((out / "results.json").read_text())
    assert data["metric"]["name"] == "validation loss" and "lower is better" in data["metric"]["why"]
    rungs = {r["name"]: r for r in data["rungs"]}
    assert rungs["baseline"]["metric"] == {"name": "validation loss", "goal": "min", "value": old["accuracy"]}
    assert rungs["amp"]["metric"]["value"] == old["loss"] + 0.01 and rungs["amp"]["runs"][0]["unit"] == "tokens"
    report = (out / "report.md").read_text()
    assert "val loss" in report and "tokens/s" in report


def test_a_folder_whose_only_differences_name_the_metric_or_unit_resumes(tmp_path):
    """Detection's rate was once said in samples/s, now images/s: the same runs, so the folder resumes; a setting
    that changes what runs is still refused."""
    from trainfast.ablation.store import RunStore

    settings = {"task": "detection", "rate_unit": "samples/s", "metric_name": "mAP", "repeats": 3}
    RunStore(tmp_path, settings, resume=False)
    RunStore(tmp_path, dict(settings, rate_unit="images/s"), resume=True)
    with pytest.raises(RecipeError, match="repeats"):
        RunStore(tmp_path, dict(settings, repeats=4), resume=True)
