"""The Task base: every task's declarations, and the rule that rules out a switch on data a task does not offer."""
import pytest
import torch
from torch import nn

from trainfast.ablation.ladders import LADDERS, plan_rungs
from trainfast.recipe import Recipe, RecipeError
from trainfast.results import Effect, Status
from trainfast.tasks import TASKS, Task, as_task, build_task
from trainfast.tasks.classification import Classification
from trainfast.techniques import owners, rung_table
from trainfast.techniques.switch import DATA_KINDS

CPU = torch.device("cpu")


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
                effect = task.field_effect(field, CPU, None, None, changes[field])
                assert not effect.acts and effect.label == Effect.NOT_APPLICABLE and effect.reason in why
            with pytest.raises(RecipeError, match="acts on"):
                task.validate(Recipe().replace(**{f: v for f, v in changes.items() if f in missing}))
            if rung in nameable:
                planned = {r.name: r for r in plan_rungs(Recipe(), [rung], "each", "bf16", CPU, name)}[rung]
                assert planned.status == Status.NO_EFFECT and planned.effect == Effect.NOT_APPLICABLE
                assert planned.reason == why


@pytest.mark.parametrize("name, ruled_out", [
    ("classification", {"group_aspect_ratio", "padding_free", "group_by_length"}),
    ("detection", {"prefetch", "decode_cache", "device_decode", "padding_free", "group_by_length"}),
    ("lm", {"prefetch", "channels_last", "decode_cache", "device_decode", "group_aspect_ratio"}),
])
def test_the_switches_declare_the_data_each_task_lacks(name, ruled_out):
    """The declarations behind the rule above: what each task's data has nothing for."""
    task = build_task(name)
    assert {f for f in owners() if task.data_reason(f)} == ruled_out


def test_a_cumulative_ladder_does_not_carry_a_ruled_out_switch():
    base, channels, fused = plan_rungs(Recipe(), ["channels_last", "fused"], "cumulative", "bf16", CPU, "lm")
    assert channels.effect == Effect.NOT_APPLICABLE and "token ids" in channels.reason
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
