"""The training step and evaluation, shared by `train`, `ablate` and the benchmarks.

The step reads top to bottom with no `if technique:` branch: a switched-off technique is a no-op
object (fp32 `Precision`, `Clipper(None)`, the eager module instead of a compiled one)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from .faults import StopOnNonFinite
from .measure import EpochStats, Meter
from .recipe import Recipe
from .techniques.precision import Precision


class Clipper:
    """Global grad-norm clipping on true-scale gradients (unscaled first under fp16); no-op when unset."""

    def __init__(self, max_norm: float | None, params: Iterable[nn.Parameter]) -> None:
        self.max_norm = max_norm
        self.params = [p for p in params if p.requires_grad]

    def __call__(self, precision: Precision, optimizer: torch.optim.Optimizer) -> None:
        if self.max_norm is None:
            return
        precision.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)


def always_sync(update: bool) -> contextlib.AbstractContextManager:
    """One process (or no accumulation): nothing to hold back."""
    return contextlib.nullcontext()


@dataclass
class TrainState:
    model: nn.Module                      # the eager module: owns the parameters, used for evaluation
    forward: Callable                     # what the training step calls: `model`, or its compiled twin
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    clip: Clipper
    recipe: Recipe
    step: int = 0
    epoch: int = 0
    nonfinite: StopOnNonFinite = field(default_factory=StopOnNonFinite)   # non-finite loss policy (faults.py)
    # gradient accumulation / distributed (issue 5): sync(update) is DDP's no_sync on the micro-steps
    # that do not end in an update; a no-op in one process. micro_step counts batches across epochs.
    sync: Callable[[bool], contextlib.AbstractContextManager] = always_sync
    micro_step: int = 0
    accumulated: int = 0                  # micro-batches whose gradients wait for the next update


def flag_last(batches: Iterable) -> Iterator[tuple[object, bool]]:
    """(batch, is_last) pairs, reading one batch ahead."""
    iterator = iter(batches)
    try:
        batch = next(iterator)
    except StopIteration:
        return
    for upcoming in iterator:
        yield batch, False
        batch = upcoming
    yield batch, True


def no_op(state: TrainState) -> None:
    pass


def train_one_epoch(state: TrainState, batches: Iterable, loss_fn: Callable, meter: Meter,
                    after_step: Callable[[TrainState], None] = no_op) -> EpochStats:
    model, optimizer, precision = state.model, state.optimizer, state.precision
    accum = state.recipe.grad_accum_steps        # 1: every batch is an update (x / 1 is exact in fp)
    # With accumulation, the epoch's last batch always ends an update, a short one (as Lightning and
    # Accelerate do): no gradients are carried into the next epoch, so an epoch-end checkpoint misses
    # nothing. That takes one batch of look-ahead; without accumulation nothing is read ahead.
    flagged = flag_last(batches) if accum > 1 else ((batch, False) for batch in batches)
    model.train()
    for (inputs, targets), last in meter.iterate(flagged):
        state.micro_step += 1
        state.accumulated += 1
        update = state.accumulated == accum or last   # the last micro-batch of an accumulation
        with state.sync(update):                 # DDP all-reduces gradients on the update step only
            with precision.forward_context():
                outputs = state.forward(inputs)
                loss = loss_fn(outputs, targets)
            if state.nonfinite.allows(loss, state.step):   # "stop": always, no sync; "skip": one host read
                precision.backward(loss / accum)           # scales the loss first under fp16
        if update:
            if state.nonfinite.take_update():    # "skip": an update with a non-finite micro-batch is dropped
                state.clip(precision, optimizer)     # unscale, then clip; no-op without grad_clip
                precision.step(optimizer)            # fp16: skipped on inf/NaN grads, scale backs off
            state.scheduler.step()
            optimizer.zero_grad(set_to_none=state.recipe.set_to_none)
            state.step += 1
            state.accumulated = 0
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
