"""The built-in loop: `train_one_epoch`, shared by `train`, `ablate` and the benchmarks, for every task.

The loop is a Session loop (session/): it is written exactly as a user's own loop adopted with
`trainfast.Session` is, on the same objects, so both get every technique from the same code. It reads top to
bottom with no `if technique:` branch: a switched-off technique is a no-op object (fp32 `Precision`,
`Clipper(None)`, the eager module instead of a compiled one, an optimizer step that acts on every batch
without accumulation). What differs between tasks (the forward and its loss, what is counted, how it is
evaluated) is the task object's (tasks/): classification's loss is one tensor, a detector's a dict of terms,
which backward sums and the Meter logs term by term."""
from __future__ import annotations

from typing import Callable, Iterable

from .measure import EpochStats, Meter
from .session import TrainState
from .tasks import as_task

# The built-in loop zeroes the gradients as a stock PyTorch 2.x loop does: optimizer.zero_grad(), whose default
# (set_to_none=True) frees them instead of writing zeros, so the baseline is what a user would otherwise run.
# recipe.set_to_none changes nothing here (its declaration says so: techniques/optimizer.py); it acts on a user's
# loop that zeroes in place, through the Session.


def no_step_hook(state: TrainState) -> None:
    """train_one_epoch's default `after_step`: nothing runs after a training step (the trainer's checkpoint
    cadence replaces it)."""


def train_one_epoch(state: TrainState, batches: Iterable, task, meter: Meter,
                    after_step: Callable[[TrainState], None] = no_step_hook) -> EpochStats:
    """One pass over `batches`. `task`: the run's task (tasks/), or a classification loss function."""
    task = as_task(task)
    forward, optimizer, scheduler = state.forward, state.optimizer, state.scheduler
    state.model.train()
    for inputs, targets in meter.iterate(state.batches(batches)):   # timed; accumulation ends with the epoch
        with state.autocast():
            outputs, loss = task.forward(forward, inputs, targets)   # loss: a tensor, or a dict of terms
        state.backward(loss)                     # sums a dict; / grad_accum_steps, fp16 scaling, nonfinite=skip
        optimizer.step()                         # once per accumulation: unscale, clip, step (fp16: skipped
        scheduler.step()                         # on inf/NaN grads), O2's masters; the schedule follows it
        optimizer.zero_grad()                    # a stock loop's: PyTorch's default frees them (set_to_none=True)
        meter.update(loss, outputs, targets)     # on the device (every term of a dict); read every log_every steps
        after_step(state)                        # checkpoint cadence (checkpoint.Checkpointer); no-op by default
    state.epoch += 1
    return meter.stats
