"""Session: the one place a Recipe reaches a model, an optimizer, loaders and the training step.

A user's own loop, adopted in three lines (examples/adopted_loop.py):

    tf = trainfast.Session()                                        # 1: seeds, flags, process group, device
    model, optimizer, loader = tf.setup(model, optimizer, loader)   # 2: the recipe's techniques, in order
    for inputs, targets in loader:                                  #    batches arrive on the device
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        tf.backward(loss)                                           # 3: instead of loss.backward()
        optimizer.step()

The built-in loop is a client of the same objects: `trainer.train` opens a Session and `engine.train_one_epoch`
is the loop above, so the built-in loop and a user's loop get every technique from the same code.

Where the recipe comes from: the defaults < the script's `Session(recipe)` < the TRAINFAST_RECIPE environment
variable (recipe.py: inline JSON or a YAML/JSON file; how the ablation runs a script with each rung's recipe).
The fields the variable changed are in `tf.overridden`.

The order in which `setup` (build_state) applies the techniques; each needs the one before it:
  1. the model to the device, then channels_last, then the precision level's dtype (O2/O3: half weights,
     norms kept fp32, input/output casts as module hooks)
  2. DDP / FSDP2 wrap under torchrun (DDP broadcasts rank 0's weights; FSDP2 swaps parameters for shards)
  3. the optimizer's parameters: O2's fp32 masters are made now, from the broadcast weights, and a user's
     optimizer is remapped onto them (and onto FSDP2's shards) in place, param groups kept
  4. torch.compile of the wrapped module, after the memory format, dtype and wrapping are fixed
  5. a user's optimizer rebuilt as foreach/fused when the recipe says so, its scheduler rebound to it
  6. the wrapper module (`SessionModule`) around it all: the user's instance keeps its class and forward
Loaders (`SessionLoader`): a user's DataLoader is kept or rebuilt (data/adopt.py: DistributedSampler with
set_epoch under torchrun, per-rank worker seeds, num_workers, pinned memory, host normalization), then its
batches are moved to the device (data/device.py: non_blocking copies, the prefetcher's side stream and
on-device normalization of uint8 images, channels_last).

What the returned objects do:
  - model: training forwards (train() mode, grad enabled) run the DDP/compiled module under the precision's
    autocast, and under gradient accumulation tell DDP whether this micro-batch all-reduces; evaluation runs
    the eager module (no recompiles, no collectives). state_dict() has the user's own keys.
  - optimizer: the user's optimizer (remapped, or rebuilt) behind a proxy whose step() goes through the loss
    scaler (fp16: unscale, skip on inf/NaN), grad clipping, O2's masters and gradient accumulation (a no-op
    until the accumulation's last micro-batch), and whose zero_grad() honours recipe.set_to_none (True forces
    set_to_none; False leaves the caller's choice, torch's default being True) and never clears gradients an
    accumulation still needs. Everything else (param_groups, state_dict, hooks) is the real optimizer's.
  - scheduler: steps once per optimizer update (not per micro-batch).
  - `tf.backward(loss)`: a tensor or a dict of losses (summed; each term logged); loss / grad_accum_steps;
    fp16 loss scaling; nonfinite=skip drops a non-finite loss. Where the recipe needs it (fp16 scaling,
    accumulation, nonfinite=skip) a plain loss.backward() is refused with a message saying so. (nonfinite=stop
    is the built-in loop's Meter reading every loss; in a user's loop a NaN loss shows in tf.log.)
"""
from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import nn

from .checkpoint import (FORMAT_VERSION, CheckpointError, capture_rng, capture_state, log_stderr, read_checkpoint,
                         restore_rng, restore_state, write_checkpoint)
from .data.adopt import adopt_loader, epoch_sampler, loader_generators, resolve_loader_workers
from .data.device import build_device_batches
from .distributed import Dist, setup_distributed
from .faults import build_nonfinite_policy
from .recipe import RECIPE_ENV, Recipe, RecipeError, apply_env_recipe, resolve_device, validate_for_device
from .techniques.clip import Clipper
from .techniques.compile import apply_compile
from .techniques.memory_format import apply_memory_format
from .techniques.optimizer import apply_optimizer_impl, build_optimizer, build_scheduler, remap_params
from .techniques.precision import Precision, build_precision
from .techniques.runtime import apply_runtime_flags
from .techniques.transfer import tensors_in
from .measure import StepTimer
from . import probe


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)   # seeds CUDA generators too


def no_op() -> None:
    pass


class BackwardOutsideSession(RuntimeError):
    """A backward or optimizer step that bypassed the Session where the recipe needs it; the message says why."""


# --- the training step -------------------------------------------------------------------------------

class TrainState:
    """The step machinery a Recipe builds (`build_state`), shared by the built-in loop and a user's loop.
    Counters: `step` counts optimizer updates, `micro_step` backward passes (batches) across epochs,
    `accumulated` the micro-batches whose gradients wait for the next update."""

    def __init__(self, model: nn.Module, trained: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                 precision: Precision, clip: Clipper, recipe: Recipe, nonfinite, sync: Callable[[bool], None],
                 guard_optimizer: bool) -> None:
        self.model = model                    # the eager module: owns the parameters, evaluation, saving
        self.timer = StepTimer(precision.device)   # one step = one optimizer update (measure.StepTimer)
        self.after_update: Callable[[], None] = no_op    # the ablation's probe, when it measures this run
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
        accumulating, with the epoch's last one marked (track_last)."""
        return self.timer.batches(self.track_last(batches))

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

    def __init__(self, optimizer: torch.optim.Optimizer, state: TrainState) -> None:  # noqa: no super().__init__
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


class NoSchedule:
    """A user's loop without a scheduler: nothing to step, nothing to save."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class SessionLoader:
    """What setup() returns for a loader: every pass sets the epoch on a DistributedSampler (a new shuffle per
    epoch, the same on every rank), moves the batches to the device and prepares them (data/device.py), and
    for the training loader (the first one given to setup) marks the epoch's last batch for accumulation.
    Attributes it lacks (dataset, batch_size, sampler...) are the DataLoader's."""

    def __init__(self, loader: Iterable, batches: Iterable, state: TrainState, marks_last: bool) -> None:
        self.loader, self.batches, self.train_state, self.marks_last = loader, batches, state, marks_last
        self.epoch = 0                        # passes started; saved by Session.save

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator:
        sampler = epoch_sampler(self.loader)
        if sampler is not None:
            sampler.set_epoch(self.epoch)
        self.epoch += 1
        return self.train_state.batches(self.batches) if self.marks_last else iter(self.batches)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "generators": [g.get_state() for g in loader_generators(self.loader)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        for generator, saved in zip(loader_generators(self.loader), state["generators"]):
            generator.set_state(saved)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "batches", "train_state", "marks_last"):
            raise AttributeError(name)
        return getattr(self.loader, name)


def build_state(model: nn.Module, recipe: Recipe, device: torch.device, dist: Dist | None = None,
                precision: Precision | None = None, optimizer: torch.optim.Optimizer | None = None,
                scheduler: Any = None) -> TrainState:
    """The techniques, applied in the documented order (module docstring). Without `optimizer`, the recipe's
    own (optimizer, lr, weight_decay, optimizer_impl) with its linear warm-up is built on the final tensors:
    the built-in loop. `precision` overrides the one the recipe names (tests and benchmarks tune the loss
    scaler with it)."""
    dist = dist or Dist(device, strategy=recipe.strategy)
    precision = precision or build_precision(dist.precision_name(recipe), device, recipe.precision_level)
    adopted = optimizer is not None
    names = {id(p): name for name, p in model.named_parameters()}    # how a user's optimizer finds them again
    model = precision.prepare_model(apply_memory_format(model.to(device), recipe.channels_last))      # 1
    model.zero_grad(set_to_none=True)              # the step zeroes after each update, not before
    trained = dist.wrap(model, recipe)             # 2: DDP / FSDP2 (in place) / DataParallel; `model` alone
    trainable = [p for p in model.parameters() if p.requires_grad]
    params = precision.optimizer_params(model)     # 3: the parameters, or O2's fp32 masters (same order)
    if adopted:                                    #    a user's optimizer: remapped in place, groups kept
        stepped = {id(p): q for p, q in zip(trainable, params)}
        current = dict(model.named_parameters())
        remap_params(optimizer, {old: stepped.get(id(current[name]), current[name]) for old, name in names.items()})
    else:                                          #    the built-in loop: the recipe's, its impl included
        optimizer = build_optimizer(params, recipe)
        scheduler = build_scheduler(optimizer, recipe.warmup_steps)
    forward = apply_compile(trained, recipe.compile)                                                 # 4
    if adopted:
        rebuilt = apply_optimizer_impl(optimizer, recipe.optimizer_impl, scheduler)                   # 5
        if rebuilt is not optimizer:
            optimizer.register_step_pre_hook(refuse_rebuilt_step)
        optimizer = rebuilt
    masters = any(q is not p for p, q in zip(trainable, params))
    clipped = [p for group in optimizer.param_groups for p in group["params"]]
    return TrainState(model, forward, optimizer, scheduler if scheduler is not None else NoSchedule(), precision,
                      Clipper(recipe.grad_clip, clipped), recipe, build_nonfinite_policy(recipe, dist.agree_finite),
                      dist.grad_sync(trained),
                      guard_optimizer=precision.scales_loss or masters or recipe.grad_accum_steps > 1)


def refuse_rebuilt_step(optimizer, args, kwargs) -> None:
    raise BackwardOutsideSession(
        "this optimizer was rebuilt by Session.setup() for the recipe's optimizer_impl and no longer trains the "
        "model: step the optimizer that setup() returned")
# --- logging -----------------------------------------------------------------------------------------

class LogBuffer:
    """tf.log: values stay on the device (a detached copy each, no sync). When a key already holds
    `every` values, every pending key is read at once (one sync), averaged, averaged again over ranks (one
    gloo all-reduce), and appended to `records` as {"step": values of a key logged so far, key: mean}: with
    one tf.log per step, the step the window ends at. Every rank must log the same keys as often (lockstep,
    like the training step itself), since each read is a collective."""

    def __init__(self, every: int, device: torch.device, dist: Dist) -> None:
        self.every, self.device, self.dist = every, device, dist
        self.pending: dict[str, list[torch.Tensor]] = {}
        self.counts: dict[str, int] = {}
        self.records: list[dict[str, float]] = []

    def add(self, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            if len(self.pending.get(name, ())) >= self.every:
                self.flush()
            self.pending.setdefault(name, []).append(self.as_scalar(value))
            self.counts[name] = self.counts.get(name, 0) + 1

    def as_scalar(self, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            value = value.detach().to(self.device, torch.float32, non_blocking=True)
            return value if value.numel() == 1 else value.mean()
        return torch.tensor(float(value), device=self.device)

    def flush(self) -> None:
        if not self.pending:
            return
        names = sorted(self.pending)
        means = torch.stack([torch.stack([v.reshape(()) for v in self.pending[n]]).mean() for n in names]).tolist()
        self.pending = {}
        means = [m / self.dist.world_size for m in self.dist.sum(means)]
        self.records.append({"step": max(self.counts[n] for n in names), **dict(zip(names, means))})


# --- the public object -------------------------------------------------------------------------------

class Session:
    """`tf = trainfast.Session(recipe=None, *, device="auto")`: reads the recipe (TRAINFAST_RECIPE wins over
    `recipe`, `tf.overridden` says what it changed), validates it for the device, opens the process group under
    torchrun (gloo on CPU, nccl on CUDA, one device per local rank), applies the runtime flags
    (cudnn.benchmark, deterministic) and seeds every RNG (python, numpy, torch, CUDA) with recipe.seed.
    Create it first, before the model, so the model's initialization is seeded too.

    `tf.setup(...)` applies the techniques; `tf.backward(loss)` replaces loss.backward(); `tf.autocast()` for
    loss code outside the model; `tf.log(**values)` and `tf.report(**metrics)` record numbers;
    `tf.save(path)` / `tf.load(path)` checkpoint the full state."""

    def __init__(self, recipe: Recipe | None = None, *, device: str | torch.device = "auto") -> None:
        self.recipe, self.overridden = apply_env_recipe(recipe or Recipe())
        device = device if isinstance(device, torch.device) else resolve_device(device)
        validate_for_device(self.recipe, device)
        self.dist = setup_distributed(self.recipe, device)
        self.device = self.dist.device
        apply_runtime_flags(self.recipe, self.device)
        seed_everything(self.recipe.seed)
        self.precision = build_precision(self.dist.precision_name(self.recipe), self.device,
                                         self.recipe.precision_level)
        self.state: TrainState | None = None
        self.loaders: list[SessionLoader] = []
        self.reported: dict[str, Any] = {}
        self.logs = LogBuffer(self.recipe.log_every, self.device, self.dist)
        self.probe = probe.current()          # the ablation measures this run (probe.py): it times our steps
        if self.probe is not None:
            self.probe.attach(self)
        if self.overridden and self.dist.is_main:
            changed = ", ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in self.overridden.items())
            log_stderr(f"trainfast: {RECIPE_ENV} overrides the script's recipe: {changed}")

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def is_main(self) -> bool:
        """Rank 0 (the only process without torchrun): the one that should print and write files."""
        return self.dist.is_main

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *loaders: Iterable,
              scheduler: Any = None, mean=None, std=None) -> tuple:
        """Apply the recipe to `model`, `optimizer` and the loaders, in the documented order (module docstring).
        Returns (model, optimizer, *loaders), with the scheduler last when one is given:

            model, optimizer, loader = tf.setup(model, optimizer, loader)
            model, optimizer, train_loader, val_loader, scheduler = tf.setup(
                model, optimizer, train_loader, val_loader, scheduler=scheduler)

        Use the returned objects from then on. `optimizer`: any torch optimizer on the model's parameters
        (None: the recipe's optimizer and warm-up, as the built-in loop uses). `scheduler`: built on that
        optimizer, before setup. Loaders: DataLoaders (or any iterable of batches, moved to the device as they
        are); the first one is the training loader. `mean`/`std` (per channel, for images in [0, 1]): the
        datasets yield uint8 images first in each sample, `(image, target, ...)`, and trainfast normalizes
        them (on the device with recipe.prefetch). Recipe fields that describe the built-in loop's optimizer
        (optimizer, lr, weight_decay, warmup_steps) and data (epochs, batch_size) do not change a user's own."""
        if self.state is not None:
            raise RuntimeError("Session.setup() was already called: one model per Session")
        if not isinstance(model, nn.Module):
            raise TypeError(f"Session.setup(): the first argument must be the model (an nn.Module), got "
                            f"{type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"Session.setup(): the second argument must be the optimizer (or None), got "
                            f"{type(optimizer).__name__}: tf.setup(model, optimizer, loader)")
        if self.recipe.strategy == "dp" and (optimizer is not None or loaders):
            raise RecipeError("strategy=dp computes the loss inside each replica, which only the built-in loop "
                              "can do (trainfast.train); use strategy=ddp under torchrun")
        if loaders:
            self.recipe = resolve_loader_workers(loaders[0], self.recipe, self.device, mean, std)
        self.state = build_state(model, self.recipe, self.device, self.dist, self.precision, optimizer, scheduler)
        self.loaders = [self.adopt(loader, i == 0, mean, std) for i, loader in enumerate(loaders)]
        if self.probe is not None:
            workers = getattr(self.loaders[0].loader, "num_workers", 0) if self.loaders else None
            self.probe.watch(self.state, workers)
        returned = (self.state.forward, self.state.optimizer, *self.loaders)
        return returned + (self.state.scheduler,) if scheduler is not None else returned

    def adopt(self, loader: Iterable, marks_last: bool, mean=None, std=None) -> SessionLoader:
        adopted = adopt_loader(loader, self.recipe, self.device, self.dist, mean, std)
        batches = build_device_batches(adopted, self.recipe, self.device, mean, std)
        return SessionLoader(adopted, batches, self.require_state(), marks_last)

    def require_state(self) -> TrainState:
        if self.state is None:
            raise RuntimeError("call tf.setup(model, optimizer, loader) first")
        return self.state

    def backward(self, loss: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Instead of loss.backward(). `loss`: a tensor, or a dict of losses (summed; each term and the sum,
        as "loss", go to tf.log). Divides by grad_accum_steps, scales under fp16, applies nonfinite=skip.
        Returns the summed loss."""
        if isinstance(loss, Mapping) and "loss" in loss:
            raise ValueError("tf.backward(): a loss dict may not have a term named 'loss' (the sum is logged under "
                             "that name); rename it")
        total = self.require_state().backward(loss)
        if isinstance(loss, Mapping):
            self.logs.add({"loss": total, **loss})
        return total

    def autocast(self):
        """The precision's autocast (a no-op context for fp32 and O2/O3), for loss code outside the model."""
        return self.precision.forward_context()

    def log(self, **values: Any) -> None:
        """Record scalars (tensors stay on the device: no sync here); read every recipe.log_every values,
        averaged over the window and over ranks, into `tf.logged`. Every rank must call it alike."""
        self.logs.add(values)

    def flush_logs(self) -> list[dict[str, float]]:
        """Read what tf.log holds now (a sync, and a collective under torchrun: every rank must call it)."""
        self.logs.flush()
        return self.logs.records

    @property
    def logged(self) -> list[dict[str, float]]:
        """Windows read so far: [{"step": values logged so far, name: mean, ...}, ...] (LogBuffer)."""
        return self.logs.records

    def report(self, **metrics: Any) -> None:
        """The numbers this run reports (e.g. val_accuracy=...), kept in `tf.reported` (the ablation writes
        them to its result file). Tensors are read to Python numbers; a later value replaces an earlier one."""
        for name, value in metrics.items():
            self.reported[name] = value.item() if isinstance(value, torch.Tensor) else value

    def save(self, path: str | Path) -> Path | None:
        """The full state (model with the user's own keys, optimizer, scheduler, loss scaler and O2 masters,
        non-finite counters, step counters, the loaders' epochs and generators (the next pass shuffles as it
        would have; a pass is not resumed in its middle), what was reported, every rank's RNG states),
        written atomically with a checksum by rank 0 and loadable with torch.load(weights_only=True) (see
        checkpoint.py). Every rank must call it (the RNG states are gathered); returns the path on rank 0."""
        state = self.require_state()
        ranks = self.dist.gather_objects({"rng": capture_rng()})
        if not self.dist.is_main:
            return None
        payload = {"format": "trainfast.session", "version": FORMAT_VERSION, **capture_state(state),
                   "recipe": self.recipe.to_dict(), "loaders": [loader.state_dict() for loader in self.loaders],
                   "reported": dict(self.reported), "world_size": len(ranks), "ranks": ranks}
        write_checkpoint(payload, path)
        return Path(path)

    def load(self, path: str | Path) -> None:
        """Restore what save() wrote into this Session (after setup, with the same model and optimizer),
        including this rank's RNG states, so the run continues as if it had not stopped."""
        state = self.require_state()
        payload = read_checkpoint(path)
        if payload.get("world_size", 1) != self.dist.world_size:
            raise CheckpointError(f"{path}: written by {payload.get('world_size')} rank(s), this run has "
                                  f"{self.dist.world_size}; load it with the same number of processes")
        restore_state(state, payload)
        state.accumulated, state.update_due = 0, False
        for loader, saved in zip(self.loaders, payload["loaders"]):
            loader.load_state_dict(saved)
        self.reported.update(payload.get("reported", {}))
        restore_rng(payload["ranks"][self.dist.rank]["rng"])      # last: nothing after this draws

    def close(self) -> None:
        """Close the process group this Session opened (also done at exit)."""
        self.dist.close()
