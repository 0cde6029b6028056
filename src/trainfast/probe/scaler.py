"""fp16 in a plain loop: the loss scaler a Session's fp16 carries (techniques/precision.py's Autocast, its
torch.amp.GradScaler and skipped-step count), put around the script's own `loss.backward()` and `optimizer.step()`.

fp16 gradients underflow unless the loss is scaled before the backward and the gradients unscaled before the update,
so fp16 autocast is only switched on where both are reached:
  - the backward: `torch.Tensor.backward` on a one-element loss, between the first training forward and the end of
    the run, is the scaled loss's backward (several per step, accumulation, are fine: the scaler unscales once);
  - the step: the trained model's optimizer's `step`, wrapped on the instance (over whatever the script or its
    LR scheduler put there), runs through the Precision's step: unscale, skip on inf/NaN, update the scale, count
    the skip; `torch.nn.utils.clip_grad_norm_` / `clip_grad_value_` unscale first, as a Session's clip does;
  - refused where the scaler could not be proven to hold: two optimizers (which step unscales which gradients),
    and, found as the run goes, a step whose gradients no scaled backward made (`torch.autograd.grad`, a backward
    outside the step) or a closure step (GradScaler refuses closures): from there on the scaler stands aside (the
    step is the script's own, unscaled) and its read-back says why, so the rung is reported "not applied", never
    timed with gradients off by the scale.
A skipped step runs no optimizer step, so the probe's clock counts its time into the next one (at fp16's first steps,
while the scale backs off: warm-up).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

TWO_OPTIMIZERS = ("two optimizers: fp16's loss scaler unscales the gradients each optimizer steps, and which "
                  "backward fed which step cannot be told in a loop trainfast does not own")
NO_SCALED_BACKWARD = ("an optimizer step whose gradients no loss.backward() in the training step made "
                      "(torch.autograd.grad, or a backward outside the step): the loss scaler stood aside from there")
CLOSURE = "an optimizer step with a closure, which torch.amp.GradScaler refuses: the loss scaler stood aside"
CLIPS = ("clip_grad_norm_", "clip_grad_value_")


class LossScaling:
    """The scaler in a plain loop's backward and step (the module docstring). `install()` patches the backward and
    the clipping functions (before the script imports them), `arm(optimizer)` wraps the step at the first training
    forward; `close()` undoes all of it (a test's loop)."""

    def __init__(self) -> None:
        self.precision: Any = None          # techniques.precision.Autocast in fp16 (its scaler, its skips), once armed
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaled = 0                     # scaled backwards since the last step
        self.steps = 0                      # optimizer steps taken through the scaler
        self.unscaled = False               # this step's gradients unscaled already (a clip)
        self.inside = False                 # the scaler's own step is running
        self.refused: str | None = None     # why it stood aside during the run
        self._undo: list[Callable[[], None]] = []

    @property
    def armed(self) -> bool:
        return self.optimizer is not None and self.refused is None

    def install(self) -> "LossScaling":
        backward = torch.Tensor.backward
        scaling = self

        @functools.wraps(backward)
        def scaled_backward(tensor, *args, **kwargs):
            if scaling.armed and not scaling.inside and tensor.numel() == 1 and tensor.is_floating_point():
                scaling.scaled += 1
                return backward(scaling.precision.scaler.scale(tensor), *args, **kwargs)
            return backward(tensor, *args, **kwargs)

        torch.Tensor.backward = scaled_backward
        self._undo.append(lambda: setattr(torch.Tensor, "backward", backward))
        for name in CLIPS:
            self.wrap_clip(name)
        return self

    def wrap_clip(self, name: str) -> None:
        utils, clip = torch.nn.utils, getattr(torch.nn.utils, name)
        scaling = self

        @functools.wraps(clip)
        def unscaled_clip(*args, **kwargs):
            if scaling.armed and scaling.scaled and not scaling.unscaled:
                scaling.precision.unscale_(scaling.optimizer)
                scaling.unscaled = True
            return clip(*args, **kwargs)

        setattr(utils, name, unscaled_clip)
        self._undo.append(lambda: setattr(utils, name, clip))

    def arm(self, precision: Any, optimizer: torch.optim.Optimizer) -> None:
        """The trained model's optimizer: its step from now on through `precision`'s scaler."""
        inner, scaling = optimizer.step, self
        self.precision, self.optimizer = precision, optimizer

        @functools.wraps(inner)
        def step(*args, **kwargs):
            if scaling.inside or not scaling.armed:
                return inner(*args, **kwargs)
            if args or kwargs.get("closure") is not None:
                scaling.refused = CLOSURE
                return inner(*args, **kwargs)
            if not scaling.scaled:
                scaling.refused = NO_SCALED_BACKWARD
                return inner(*args, **kwargs)
            scaling.inside = True
            try:
                scaling.precision.step(optimizer)        # unscale (unless a clip did), step or skip, update
            finally:
                scaling.inside = False
            scaling.scaled, scaling.unscaled = 0, False
            scaling.steps += 1
            return None

        own = "step" in vars(optimizer)         # an LR scheduler's wrapper, or the script's own
        optimizer.step = step
        self._undo.append(lambda: setattr(optimizer, "step", inner) if own else delattr(optimizer, "step"))

    def read_back(self) -> str:
        """What the scaler did, read from it: the steps it took, the skips it counted, the scale now; or why it
        stood aside. The numbers are the run record's too (precision_state, scaler_skips: record.run_state)."""
        if self.refused is not None:
            return f"stood aside after {self.steps} step(s): {self.refused}"
        if not self.steps:
            return "no optimizer step went through it"
        metrics = self.precision.metrics()
        return (f"{self.steps} steps scaled, {metrics.get('skipped_steps', 0)} skipped, loss scale "
                f"{metrics.get('loss_scale', 0):g}")

    def close(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []
