"""The built-in loop: `train_one_epoch` and `evaluate`, shared by `train`, `ablate` and the benchmarks.

The loop is a Session loop (session.py): it is written exactly as a user's own loop adopted with
`trainfast.Session` is, on the same objects, so both get every technique from the same code. It reads top to
bottom with no `if technique:` branch: a switched-off technique is a no-op object (fp32 `Precision`,
`Clipper(None)`, the eager module instead of a compiled one, an optimizer step that acts on every batch
without accumulation)."""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from .measure import EpochStats, Meter
from .session import TrainState
from .techniques.precision import Precision


def no_op(state: TrainState) -> None:
    pass


def train_one_epoch(state: TrainState, batches: Iterable, loss_fn: Callable, meter: Meter,
                    after_step: Callable[[TrainState], None] = no_op) -> EpochStats:
    forward, optimizer, scheduler = state.forward, state.optimizer, state.scheduler
    state.model.train()
    for inputs, targets in meter.iterate(state.batches(batches)):   # timed; accumulation ends with the epoch
        with state.autocast():
            outputs = forward(inputs)
            loss = loss_fn(outputs, targets)
        state.backward(loss)                     # / grad_accum_steps, fp16 scaling, nonfinite=skip's check
        optimizer.step()                         # once per accumulation: unscale, clip, step (fp16: skipped
        scheduler.step()                         # on inf/NaN grads), O2's masters; the schedule follows it
        optimizer.zero_grad(set_to_none=False)   # the seeds' baseline; recipe.set_to_none=True frees instead
        meter.update(loss, outputs, targets)     # on the device; read every log_every steps
        after_step(state)                        # checkpoint cadence (checkpoint.Checkpointer); no-op by default
    state.epoch += 1
    return meter.stats


def evaluate(model: nn.Module, batches: Iterable, loss_fn: Callable, precision: Precision) -> dict[str, float]:
    """Held-out loss and accuracy. eval() switches dropout/BN to inference behaviour; inference_mode()
    additionally skips autograd bookkeeping. Sums stay on the device and are read once."""
    model.eval()
    device = precision.device
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    count = 0
    with torch.inference_mode():
        for inputs, targets in batches:
            with precision.forward_context():
                outputs = model(inputs)
                loss = loss_fn(outputs, targets)
            loss_sum += loss.double() * targets.shape[0]
            correct += (outputs.argmax(dim=-1) == targets).sum()
            count += targets.shape[0]
    model.train()
    return {"loss": float(loss_sum) / max(1, count), "accuracy": int(correct) / max(1, count), "samples": count}
