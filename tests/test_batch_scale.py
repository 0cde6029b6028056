"""Batch size as a switch (techniques/batch_scale.py): the arithmetic of the scaled recipe, its validation, the
built-in run that trains with it (loaders, optimizer and schedule agreeing), accumulation's equivalence with the
bigger batch, a Session that says it cannot scale a script's own loop, and the Trainer's arguments."""
from __future__ import annotations

import math
from itertools import islice

import pytest
import torch
from torch import nn

from trainfast import techniques
from trainfast.engine import train_one_epoch
from trainfast.recipe import Recipe, RecipeError
from trainfast.run import assemble_run
from trainfast.session import Session
from trainfast.techniques.batch_scale import apply_batch_scale, lr_factor, scale_warmup


def test_the_learning_rate_follows_the_batch_by_the_chosen_rule():
    assert lr_factor(4, "linear") == 4.0 and lr_factor(4, "sqrt") == 2.0 and lr_factor(4, "none") == 1.0
    assert lr_factor(2, "sqrt") == pytest.approx(math.sqrt(2))
    with pytest.raises(RecipeError, match="lr_scaling='cube'"):
        lr_factor(2, "cube")


def test_the_scaled_recipe_multiplies_the_batch_and_scales_lr_and_warmup():
    base = Recipe(batch_size=32, lr=1e-3, warmup_steps=20, grad_accum_steps=2)
    two = apply_batch_scale(base.replace(batch_scale=2))
    assert (two.batch_size, two.grad_accum_steps, two.warmup_steps) == (64, 2, 10)
    assert two.lr == pytest.approx(1e-3 * math.sqrt(2)) and two.batch_scale == 1
    linear = apply_batch_scale(base.replace(batch_scale=4, lr_scaling="linear"))
    assert linear.lr == pytest.approx(4e-3) and linear.batch_size == 128 and linear.warmup_steps == 5
    assert apply_batch_scale(base.replace(batch_scale=8, lr_scaling="none")).lr == 1e-3
    accum = apply_batch_scale(base.replace(batch_scale=4, scale_by="accumulation"))
    assert (accum.batch_size, accum.grad_accum_steps, accum.lr) == (32, 8, pytest.approx(2e-3))


def test_the_warmup_covers_the_same_samples_and_is_never_lost():
    assert [scale_warmup(s, 4) for s in (0, 1, 2, 3, 5, 6, 20)] == [0, 1, 1, 1, 1, 2, 5]
    assert apply_batch_scale(Recipe(warmup_steps=3, batch_scale=8)).warmup_steps == 1
    assert apply_batch_scale(Recipe(warmup_steps=0, batch_scale=8)).warmup_steps == 0


def test_applying_it_twice_changes_nothing():
    once = apply_batch_scale(Recipe(batch_size=16, warmup_steps=9, batch_scale=4))
    assert apply_batch_scale(once) is once
    plain = Recipe()
    assert apply_batch_scale(plain) is plain


@pytest.mark.parametrize("field,value,says", [("batch_scale", 0, "must be a positive integer"),
                                              ("batch_scale", 1.5, "must be a positive integer"),
                                              ("lr_scaling", "cube", "is not one of linear, sqrt, none"),
                                              ("scale_by", "memory", "is not one of batch, accumulation")])
def test_bad_values_are_refused_naming_the_field_and_value(field, value, says):
    with pytest.raises(RecipeError, match=f"{field}={value!r} {says}"):
        Recipe(**{field: value})


def test_its_rungs_are_opt_in_late_and_change_the_math():
    table = techniques.rung_table("classification")
    assert table["batch_2x"] == {"batch_scale": 2} and table["batch_4x"] == {"batch_scale": 4}
    assert table["accum_4x"] == {"batch_scale": 4, "scale_by": "accumulation"}
    assert list(table)[-3:] == ["batch_2x", "batch_4x", "accum_4x"]
    for task in ("classification", "detection", "lm"):
        assert not {"batch_2x", "batch_4x", "accum_4x"} & set(techniques.default_ladder(task))
        assert "batch_2x" not in techniques.tune_priority(task)
    assert {"batch_scale", "lr_scaling", "scale_by", "optimizer_state", "padding_free", "group_by_length",
            "precision_level"} <= techniques.math_fields()
    assert not {"chunked_loss", "compile", "channels_last"} & techniques.math_fields()


def linear_model() -> nn.Module:
    """No BatchNorm: a micro-batch and the big batch must see the same function (BN's statistics would not)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10))


def test_the_builtin_run_trains_with_the_scaled_batch_lr_and_warmup(digits16):
    run = assemble_run(linear_model, digits16, Recipe(batch_size=16, lr=1e-3, warmup_steps=6, batch_scale=2),
                       device="cpu", env=False)
    try:
        inputs, _ = next(iter(run.train_batches))
        assert inputs.shape[0] == 32 and run.recipe.batch_size == 32 and run.recipe.batch_scale == 1
        group = run.state.optimizer.param_groups[0]
        assert group["initial_lr"] == pytest.approx(1e-3 * math.sqrt(2))
        assert run.state.scheduler.lr_lambdas[0](2) == pytest.approx(1.0)        # warm-up 3 steps, not 6
        assert run.recipe.warmup_steps == 3
        assert run.session.unsupported() == {}          # the built-in run scaled it: nothing to rule out
    finally:
        run.close()


def test_a_scaled_batch_bigger_than_the_data_is_refused_naming_batch_scale(digits16):
    with pytest.raises(ValueError, match=r"--batch-size 512 x batch_scale=8 = 4096 is larger .*batch_scale of at"):
        assemble_run(linear_model, digits16, Recipe(batch_size=512, batch_scale=8), device="cpu", env=False)


def trained(split, recipe: Recipe, batches: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The model's weights before and after `batches` training batches (3 optimizer updates)."""
    run = assemble_run(linear_model, split, recipe, device="cpu", env=False)
    try:
        start = [p.detach().clone() for p in run.state.model.parameters()]
        train_one_epoch(run.state, list(islice(run.train_batches, batches)), run.task, run.meter())
        assert run.state.step == 3                      # optimizer updates, however many micro-batches
        return start, [p.detach().clone() for p in run.state.model.parameters()]
    finally:
        run.close()


def test_accumulation_reaches_the_same_weights_as_the_bigger_batch(digits16):
    """4 micro-batches of 8 accumulated are one batch of 32: the same samples in the same order (one shuffled
    order, cut into batches), the same mean gradient, the same scaled lr and warm-up; equal up to float rounding."""
    base = Recipe(batch_size=8, lr=1e-2, warmup_steps=4, batch_scale=4)
    start, big = trained(digits16, base, 3)
    _, accumulated = trained(digits16, base.replace(scale_by="accumulation"), 12)
    for a, b in zip(big, accumulated):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(start[0], big[0], rtol=1e-3, atol=1e-4)           # it trained
    _, unscaled = trained(digits16, base.replace(lr_scaling="none"), 3)         # and the check can fail
    assert not torch.allclose(unscaled[0], big[0], rtol=1e-5, atol=1e-6)


def test_a_session_says_it_cannot_scale_a_scripts_own_loop():
    session = Session(Recipe(batch_scale=2), device="cpu", env=False)
    try:
        model = nn.Linear(4, 2)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.zeros(8)),
                                             batch_size=4)
        session.setup(model, torch.optim.AdamW(model.parameters()), loader)
        why = session.unsupported()["batch_scale"]
        assert "DataLoader, optimizer and scheduler" in why and session.recipe.batch_size == Recipe().batch_size
    finally:
        session.close()


def test_the_builtin_runs_session_makes_the_recipe_concrete_once_as_it_starts():
    """The rewrite is applied where the recipe becomes concrete, the built-in run's Session, keeping the recipe as
    asked beside it; a Session adopting a script's loop keeps the recipe as asked (and says so in unsupported())."""
    from trainfast import techniques

    asked = Recipe(batch_size=16, warmup_steps=8, batch_scale=4, scale_by="accumulation")
    session = Session(asked, device="cpu", env=False, builtin=True)
    try:
        assert session.asked is asked and session.recipe == apply_batch_scale(asked)
        assert session.recipe.grad_accum_steps == 4 and session.recipe.batch_scale == 1
        session.setup(nn.Linear(4, 2))
        assert session.unsupported() == {}
    finally:
        session.close()
    assert techniques.apply_recipe_rewrites(asked) == apply_batch_scale(asked)
    assert techniques.unapplied_rewrites(asked) == {"batch_scale": techniques.owner("batch_scale").rewrite.own_loop}
    assert techniques.unapplied_rewrites(apply_batch_scale(asked)) == {}


def test_a_frameworks_own_settings_are_scaled_by_the_declaration():
    from trainfast import techniques

    current = {"batch_size": 8, "grad_accum_steps": 1, "lr": 1e-3, "warmup_steps": 10}
    assert techniques.rewritten_settings({"precision": "bf16"}, current) == {}
    assert techniques.rewritten_settings({"batch_scale": 4, "lr_scaling": "linear"}, current) == {
        "batch_size": (32, "batch_scale"), "lr": (pytest.approx(4e-3), "lr_scaling"),
        "warmup_steps": (3, "batch_scale")}
    ratio = {**current, "warmup_steps": None}          # a warm-up the framework keeps as a ratio: left alone
    kept = techniques.rewritten_settings({"batch_scale": 2, "scale_by": "accumulation"}, ratio)
    assert kept == {"grad_accum_steps": (2, "scale_by"), "lr": (pytest.approx(1e-3 * math.sqrt(2)), "batch_scale")}


def test_lightning_and_accelerate_say_why_they_cannot_scale_it():
    from trainfast.frameworks.board import FrameworkRecord
    from trainfast.frameworks.common import mark_shared_switches

    for adapter in ("lightning", "accelerate"):
        record = FrameworkRecord(adapter, "x")
        mark_shared_switches(record, {"batch_scale": 2, "scale_by": "accumulation"})
        assert "does not rebuild" in record.unsupported["batch_scale"]
        assert "scale_by" in record.unsupported
    record = FrameworkRecord("transformers", "x")
    mark_shared_switches(record, {"batch_scale": 2})
    assert record.unsupported == {}
