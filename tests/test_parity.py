"""The engine against a plain hand-written PyTorch loop: bit-identical with every technique off, and
within a stated tolerance with mixed precision on."""
import random

import numpy as np
import torch
from conftest import tiny_resnet
from torch import nn
from torch.utils.data import DataLoader

from trainfast import Recipe, Session, train
from trainfast.data.datasets import HostNormalized

EPOCHS = 2


def plain_loop(split, recipe: Recipe, adopt: bool = False) -> tuple[nn.Module, list[float]]:
    """What a user writes by hand: seed, build, AdamW, shuffled DataLoader, zero_grad/forward/backward/step.
    adopt=True: the same loop adopted by trainfast.Session's three lines (Session, setup, tf.backward)."""
    tf = Session(recipe, device="cpu") if adopt else None
    random.seed(recipe.seed)
    np.random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    model = tiny_resnet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    loader = DataLoader(HostNormalized(split.train, split.mean, split.std), batch_size=recipe.batch_size,
                        shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(recipe.seed))
    if adopt:
        model, optimizer, loader = tf.setup(model, optimizer, loader)
    backward = tf.backward if adopt else torch.Tensor.backward
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    model.train()
    for _ in range(recipe.epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            backward(loss)
            optimizer.step()
            losses.append(loss.item())
    return model, losses


def engine_losses(result) -> list[float]:
    return [loss for record in result.history for loss in record["train_losses"]]


def test_all_off_is_bit_identical_to_plain_loop(digits16):
    recipe = Recipe(epochs=EPOCHS, batch_size=64, log_every=5)
    reference, reference_losses = plain_loop(digits16, recipe)
    result = train(tiny_resnet, digits16, recipe=recipe, device="cpu")
    ours = result.model.state_dict()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, ours[name]), f"{name} differs from the plain loop"
    assert engine_losses(result) == reference_losses
    assert result.history[-1]["step"] == len(reference_losses)


# Stated tolerance for bf16 autocast vs fp32 on this model and data (tests/test_parity.py, README):
# the mean absolute gap between the two per-step training-loss curves stays under 0.05, and the loss of
# the last 10 steps is within 15% of fp32's. bf16 keeps fp32's exponent range, so no loss scaling.
BF16_MEAN_ABS_GAP = 0.05
BF16_FINAL_REL = 0.15


def test_bf16_loss_curve_within_tolerance_of_fp32(digits16):
    recipe = Recipe(epochs=EPOCHS, batch_size=64, log_every=5)
    fp32 = engine_losses(train(tiny_resnet, digits16, recipe=recipe, device="cpu"))
    bf16 = engine_losses(train(tiny_resnet, digits16, recipe=recipe.replace(precision="bf16"), device="cpu"))
    assert len(fp32) == len(bf16)
    gap = sum(abs(a - b) for a, b in zip(fp32, bf16)) / len(fp32)
    assert gap < BF16_MEAN_ABS_GAP, f"mean |loss_bf16 - loss_fp32| = {gap:.4f}"
    final32, final16 = np.mean(fp32[-10:]), np.mean(bf16[-10:])
    assert abs(final16 - final32) <= BF16_FINAL_REL * final32
    assert fp32 != bf16, "bf16 autocast changed nothing: autocast is not active"


def test_fp16_with_grad_scaler_runs_on_cpu_and_reports_scaler_state(digits16):
    recipe = Recipe(epochs=1, batch_size=64, log_every=5, precision="fp16")
    result = train(tiny_resnet, digits16, recipe=recipe, device="cpu")
    record = result.history[-1]
    assert record["loss_scale"] > 0 and record["skipped_steps"] >= 0
    state = result.state.precision.state_dict()
    assert state["scaler"]["scale"] == record["loss_scale"]
    assert np.isfinite(record["train_loss"]) and record["val_accuracy"] > 0.2


def test_training_reaches_real_accuracy(digits16):
    result = train(tiny_resnet, digits16, recipe=Recipe(epochs=2, batch_size=32), device="cpu")
    assert result.history[-1]["val_accuracy"] > 0.6, result.history  # chance is 0.1
