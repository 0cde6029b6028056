"""Non-finite loss policies (a detection reference loop stops on a NaN loss; skipping is offered too).

The engine asks `state.nonfinite.allows(loss, step)` before the backward pass:
- "stop" (default) always allows and reads nothing: the Meter finds the NaN/inf at its next read (every
  log_every steps) and raises NonFiniteLossError; a checkpoint save reads the Meter first, so no
  checkpoint ever holds a step after the bad one and the last good one is left intact.
- "skip" reads isfinite(loss) on the host every step. That read is a sync: the host waits for the
  forward to finish before it can queue the backward, losing the overlap of host and device for one
  forward per step (the same kind of per-step read GradScaler does for its inf check under fp16). The
  bad step gets no backward and no optimizer update (parameters and optimizer state unchanged); step
  counter and LR schedule advance, since the batch was consumed. Forward-time buffers such as BatchNorm
  running statistics have already been updated by then. Abort after `max_consecutive` in a row.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .measure import NonFiniteLossError


class StopOnNonFinite:
    name = "stop"

    def allows(self, loss: torch.Tensor, step: int) -> bool:
        return True

    def take_update(self) -> bool:
        """At an optimizer update: may it be applied? (Always, under "stop".)"""
        return True

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _local(flag: torch.Tensor) -> torch.Tensor:
    return flag


class SkipNonFinite(StopOnNonFinite):
    """`agree` combines the finite flag across ranks (an all-reduce MIN under DDP) so every rank skips
    the same steps; identity in a single process."""

    name = "skip"

    def __init__(self, max_consecutive: int, agree: Callable[[torch.Tensor], torch.Tensor] = _local) -> None:
        self.max_consecutive = max_consecutive
        self.agree = agree
        self.skipped = 0
        self.consecutive = 0
        self._window_bad = False     # a micro-batch of the pending (accumulated) update was skipped

    def take_update(self) -> bool:
        """An update whose accumulation contains a skipped micro-batch is dropped whole, so a skipped step
        leaves parameters and optimizer state exactly as they were."""
        ok, self._window_bad = not self._window_bad, False
        return ok

    def allows(self, loss: torch.Tensor, step: int) -> bool:
        finite = bool(self.agree(torch.isfinite(loss.detach()).all().to(torch.int32)))   # the one sync per step
        if finite:
            self.consecutive = 0
            return True
        self.skipped += 1
        self.consecutive += 1
        self._window_bad = True
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteLossError(
                f"loss was non-finite on {self.consecutive} consecutive steps (last: step {step}; policy "
                f"nonfinite=skip, max_consecutive_skips={self.max_consecutive}); {self.skipped} skipped in all. "
                f"Lower the learning rate, add --warmup-steps or --grad-clip, or use bf16 instead of fp16.")
        return False

    def metrics(self) -> dict[str, float]:
        return {"nonfinite_skipped": self.skipped}

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped = int(state.get("skipped", 0))
        self.consecutive = int(state.get("consecutive", 0))


def build_nonfinite_policy(recipe, agree: Callable[[torch.Tensor], torch.Tensor] = _local) -> StopOnNonFinite:
    if recipe.nonfinite == "skip":
        return SkipNonFinite(recipe.max_consecutive_skips, agree)
    return StopOnNonFinite()
