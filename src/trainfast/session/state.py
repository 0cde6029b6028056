"""The training step a Recipe builds (session/build.py): TrainState, its counters, backward and update, and
what it hands out for the model, the optimizer and the scheduler (SessionModule, SessionOptimizer,
SessionScheduler), whose training calls go through it. Shared by the built-in loop (engine.py) and a user's
loop adopted with a Session."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from ..measure import StepTimer
from ..recipe import Recipe
from ..techniques.clip import Clipper
from ..techniques.precision import Precision
from ..techniques.transfer import tensors_in


def no_update_hook() -> None:
    """TrainState.after_update's default: nothing runs after an optimizer update (the ablation's probe
    replaces it when it measures the run)."""


class BackwardOutsideSession(RuntimeError):
    """A backward or optimizer step that bypassed the Session where the recipe needs it; the message says why."""



class TrainState:
    """The step machinery a Recipe builds (`build_state`), shared by the built-in loop and a user's loop.
    Counters: `step` counts optimizer updates, `micro_step` backward passes (batches) across epochs,
    `accumulated` the micro-batches whose gradients wait for the next update."""

    def __init__(self, model: nn.Module, trained: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                 precision: Precision, clip: Clipper, recipe: Recipe, nonfinite, sync: Callable[[bool], None],
                 guard_optimizer: bool) -> None:
        self.model = model                    # the eager module: owns the parameters, evaluation, saving
        self.timer = StepTimer(precision.device)   # one step = one optimizer update (measure.StepTimer)
        self.after_update: Callable[[], None] = no_update_hook   # the ablation's probe, when it measures this run
        self.memory = None                    # measure.memory.StepMemory: one step profiled by what holds memory
        self.precision, self.clip, self.recipe = precision, clip, recipe
        self.nonfinite = nonfinite            # the non-finite loss policy (faults.py)
        self.sync = sync                      # DDP/FSDP2: does the coming backward all-reduce (distributed.py)
        self.step = self.epoch = self.micro_step = self.accumulated = 0
        self.update_due = False               # the last backward completed an accumulation
        self.last_batch = False               # the training loader is handing out its epoch's last batch
        self.in_backward = False              # inside backward(): what BackwardGuard checks
        self.stepping = False                 # inside update(): what the real optimizer's guard checks
        # What only backward() does: with these, a plain loss.backward() would train wrongly.
        self.needs_backward = [why for why, needed in (
            (f"precision={recipe.precision} scales the loss (fp16 loss scaling)", precision.scales_loss),
            (f"grad_accum_steps={recipe.grad_accum_steps} divides the loss and holds DDP's gradient sync",
             recipe.grad_accum_steps > 1),
            ("nonfinite=skip checks every loss", recipe.nonfinite == "skip")) if needed]
        self.guard = BackwardGuard(self) if precision.scales_loss else NoGuard()
        if guard_optimizer:
            optimizer.register_step_pre_hook(self.refuse_direct_step)
        self.forward = SessionModule(model, trained, self)     # what the training step calls
        self.optimizer = SessionOptimizer(optimizer, self)
        self.scheduler = SessionScheduler(scheduler, self)

    def autocast(self):
        return self.precision.forward_context()

    def batches(self, batches: Iterable) -> Iterator:
        """The training batches of one pass, timed (how long each is waited for, its samples) and, when
        accumulating, with the epoch's last one marked (track_last). A device-batch object says when each batch
        leaves its host loader (`on_fetched`), which on CUDA splits the wait for input from the copy."""
        if hasattr(batches, "on_fetched"):
            batches.on_fetched = self.timer.arrived
        batches = self.timer.batches(self.track_last(batches))
        return self.memory.around(batches) if self.memory is not None else batches

    def track_last(self, batches: Iterable) -> Iterator:
        """The batches of one epoch. When accumulating, `last_batch` is set while the epoch's last one is out,
        so the accumulation ends with the epoch (a short update, as Lightning and Accelerate do): no gradient
        is carried into the next epoch and an epoch-end checkpoint misses nothing. That reads one batch ahead;
        without accumulation nothing is read ahead."""
        if self.recipe.grad_accum_steps == 1:
            return iter(batches)
        return self._flag_last(batches)

    def _flag_last(self, batches: Iterable) -> Iterator:
        try:
            for batch, last in flag_last(batches):
                self.last_batch = last
                yield batch
        finally:
            self.last_batch = False

    def updates_next(self) -> bool:
        """Whether the coming micro-batch ends an accumulation (so its backward all-reduces the gradients)."""
        return self.accumulated + 1 >= self.recipe.grad_accum_steps or self.last_batch

    def backward(self, loss: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Backward of `loss` (a dict of losses is summed first); returns the summed loss."""
        total = sum_losses(loss)
        self.accumulated += 1
        self.micro_step += 1
        self.update_due = self.accumulated >= self.recipe.grad_accum_steps or self.last_batch
        if self.nonfinite.allows(total, self.step):     # "stop": always, no sync; "skip": one host read
            self.in_backward = True
            try:
                self.precision.backward(total / self.recipe.grad_accum_steps)   # x / 1 is exact in fp
            finally:
                self.in_backward = False
        return total

    def update(self) -> None:
        """optimizer.step(): applies the update once per accumulation; a no-op on the micro-batches before."""
        if not self.update_due:
            if self.accumulated:              # inside an accumulation: the update comes with its last batch
                return
            self.refuse_plain_backward()      # no backward() since the last update: loss.backward() was used
        if self.nonfinite.take_update():      # "skip": an update with a non-finite micro-batch is dropped
            self.stepping = True
            try:
                self.clip(self.precision, self.optimizer.optimizer)   # unscale, then clip; no-op without grad_clip
                self.precision.step(self.optimizer.optimizer)         # fp16: skipped on inf/NaN, scale backs off
            finally:
                self.stepping = False
        self.step += 1
        self.accumulated = 0
        self.update_due = False
        self.timer.step()                     # the step's end: its samples and data wait since the last one
        self.after_update()

    def zero_grad(self, set_to_none: bool) -> None:
        if self.accumulated == 0:             # never the gradients an accumulation is still gathering
            self.optimizer.optimizer.zero_grad(set_to_none=set_to_none or self.recipe.set_to_none)

    def refuse_plain_backward(self) -> None:
        if self.needs_backward:
            raise BackwardOutsideSession(
                f"optimizer.step() found no tf.backward(loss) since the last update, but this run's recipe needs "
                f"it: {'; '.join(self.needs_backward)}. Call tf.backward(loss) instead of loss.backward().")

    def refuse_direct_step(self, optimizer, args, kwargs) -> None:
        if not self.stepping:
            raise BackwardOutsideSession(
                "the optimizer passed to Session.setup() was stepped directly; with this recipe its step must go "
                "through the loss scaler, O2's fp32 master weights or the accumulation: step the optimizer that "
                "setup() returned (`model, optimizer, ... = tf.setup(model, optimizer, ...)`).")


def sum_losses(loss: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
    if not isinstance(loss, Mapping):
        return loss
    if not loss:
        raise ValueError("tf.backward() got an empty loss dict")
    terms = iter(loss.values())
    total = next(terms)
    for term in terms:
        total = total + term
    return total


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


class BackwardGuard:
    """fp16 loss scaling: a backward through the model's outputs that tf.backward did not start would leave the
    gradients unscaled (fp16 gradients underflow, and the scaler then divides them by the scale, 2**16), so it
    is refused where it happens. Costs one tensor hook per output tensor per training forward, fp16 only.
    (A torch.autograd.grad through the outputs inside the loss, e.g. a gradient penalty, is refused too:
    under fp16 it needs the scaled-gradient recipe from torch's AMP docs.)"""

    def __init__(self, state: TrainState) -> None:
        self.state = state

    def watch(self, outputs: Any) -> Any:
        for tensor in tensors_in(outputs):
            if tensor.requires_grad:
                tensor.register_hook(self.check)
        return outputs

    def check(self, grad: torch.Tensor) -> None:
        if not self.state.in_backward:
            raise BackwardOutsideSession(
                f"loss.backward() was called directly, but this Session uses fp16 loss scaling (precision=fp16, "
                f"level {self.state.precision.level}): gradients would be unscaled and then divided by the loss scale. "
                f"Call tf.backward(loss) instead of loss.backward().")


class NoGuard:
    def watch(self, outputs: Any) -> Any:
        return outputs


class SessionModule(nn.Module):
    """What setup() returns for the model: a wrapper, so the user's instance keeps its class and its forward.
    Training forwards (train() mode with grad enabled) go through the DDP/FSDP2/compiled module; evaluation
    calls the eager module, as the built-in evaluate does. Both run under the precision's autocast and hand
    the loss fp32 outputs under O1. state_dict()/load_state_dict() are the user's module's (no `module.` or
    `_orig_mod.` prefixes); attributes the wrapper lacks are looked up on the user's module."""

    def __init__(self, module: nn.Module, trained: nn.Module, state: TrainState) -> None:
        super().__init__()
        self.module = module                  # the user's module (as DDP names its wrapped module)
        self.trained = trained                # DDP / FSDP2 / compiled, or the module itself
        self.train_state = state

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        state = self.train_state
        if not (self.module.training and torch.is_grad_enabled()):
            with state.precision.forward_context():
                return state.precision.cast_outputs(self.module(*args, **kwargs))
        state.sync(state.updates_next())      # accumulation under DDP/FSDP2: all-reduce on the last micro-batch
        with state.precision.forward_context():
            outputs = self.trained(*args, **kwargs)
        return state.guard.watch(state.precision.cast_outputs(outputs))

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if module is None:
                raise
            return getattr(module, name)


class SessionOptimizer(torch.optim.Optimizer):
    """What setup() returns for the optimizer: step() and zero_grad() go through the Session (TrainState.update,
    TrainState.zero_grad); the rest is the real optimizer's. A torch Optimizer (isinstance checks, schedulers
    built on it) without Optimizer.__init__: it holds no state of its own."""

    def __init__(self, optimizer: torch.optim.Optimizer, state: TrainState) -> None:  # no super().__init__
        self.optimizer = optimizer
        self.train_state = state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> dict:
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    def step(self, closure: Callable | None = None) -> None:
        if closure is not None:
            raise ValueError("Session optimizers take no closure (the step goes through the loss scaler)")
        self.train_state.update()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.train_state.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def register_step_pre_hook(self, hook: Callable):
        return self.optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Callable):
        return self.optimizer.register_step_post_hook(hook)

    def __getattr__(self, name: str) -> Any:
        if name in ("optimizer", "train_state"):     # not set yet (copy/unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __getstate__(self) -> dict[str, Any]:        # a plain object's, not Optimizer's (copy, pickle)
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"SessionOptimizer({self.optimizer!r})"


class SessionScheduler:
    """What setup() returns for a scheduler: it steps once per optimizer update, not per micro-batch (a call
    while an accumulation is open is a no-op); the rest is the scheduler's."""

    def __init__(self, scheduler: Any, state: TrainState) -> None:
        self.scheduler, self.train_state = scheduler, state

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self.train_state.accumulated == 0:
            self.scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name in ("scheduler", "train_state"):
            raise AttributeError(name)
        return getattr(self.scheduler, name)
