"""Session: the one place a Recipe reaches a model, an optimizer, loaders and the training step.

A user's own loop, adopted in three lines (examples/adopted_loop.py):

    tf = trainfast.Session()                                        # 1: seeds, flags, process group, device
    model, optimizer, loader = tf.setup(model, optimizer, loader)   # 2: the recipe's techniques, in order
    for inputs, targets in loader:                                  #    batches arrive on the device
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        tf.backward(loss)                                           # 3: instead of loss.backward()
        optimizer.step()

The built-in loop is a client of the same objects: the built-in run (run.assemble_run) opens a Session and
`engine.train_one_epoch` is the loop above, so the built-in loop and a user's loop get every technique from the
same code.

Where the recipe comes from: the defaults < the script's `Session(recipe)` < the TRAINFAST_RECIPE environment
variable (recipe.py: inline JSON or a YAML/JSON file; how the ablation runs a script with each rung's recipe).
The fields the variable changed are in `tf.overridden`.

The order in which `setup` (build_state) applies the techniques; each needs the one before it:
  1. the model to the device, then the switches that act on the model object in their written order
     (techniques.MODEL_ORDER, each with why: attention backend, activation checkpointing, channels_last), then
     the precision level's dtype (O2/O3: half weights, norms kept fp32, input/output casts as module hooks)
  2. DDP / FSDP2 wrap under torchrun (DDP broadcasts rank 0's weights; FSDP2 swaps parameters for shards)
  3. the optimizer's parameters: O2's fp32 masters are made now, from the broadcast weights, and a user's
     optimizer is remapped onto them (and onto FSDP2's shards) in place, param groups kept
  4. torch.compile of the wrapped module, after the memory format, dtype and wrapping are fixed
  5. a user's optimizer rebuilt as foreach/fused, or as the low-bit Adam (optimizer_state), when the recipe says
     so, its scheduler rebound to it
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

Where the pieces are (this docstring is the one place the order above is written down):
  __init__.py  Session, the public object: recipe, process group, seeding, setup, backward, log, save/load
  build.py     seed_everything, and build_state: the techniques applied in the order above
  state.py     TrainState, the step (backward, update, zero_grad, accumulation), and what it hands out for the
               model, optimizer and scheduler: SessionModule, SessionOptimizer, SessionScheduler
  loaders.py   SessionLoader, what setup() returns for a loader, and adopt(): a script's loader made one
  logs.py      LogBuffer, behind tf.log
  arguments.py what setup() refuses before it builds anything
  snapshot.py  what save() writes and how load() puts it back
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn

from ..checkpoint import capture_rng, log_stderr, read_checkpoint, write_checkpoint
from ..data.adopt import resolve_loader_workers
from ..distributed import setup_distributed
from ..observers import no_closing, session_observers
from ..recipe import RECIPE_ENV, Recipe, apply_env_recipe, resolve_device, validate_for_device
from ..techniques import (apply_process_wide_switches, apply_recipe_rewrites, asked_batches, batch_refusals,
                          unapplied_rewrites, unreached_losses)
from ..techniques.background_save import checkpoint_writer
from ..techniques.precision import build_precision
from ..techniques.runtime import apply_runtime_flags
from .arguments import check_setup
from .build import NoSchedule, build_state, refuse_rebuilt_step, seed_everything
from .loaders import SessionLoader, adopt
from .logs import LogBuffer
from .snapshot import restore_session, session_payload
from .state import (BackwardGuard, BackwardOutsideSession, NoGuard, SessionModule, SessionOptimizer, SessionScheduler,
                    TrainState, flag_last, no_update_hook, sum_losses)

__all__ = ["Session", "TrainState", "build_state", "seed_everything", "sum_losses", "flag_last",
           "BackwardOutsideSession", "BackwardGuard", "NoGuard", "NoSchedule", "no_update_hook", "refuse_rebuilt_step",
           "SessionModule", "SessionOptimizer", "SessionScheduler", "SessionLoader", "LogBuffer"]


class Session:
    """`tf = trainfast.Session(recipe=None, *, device="auto")`: reads the recipe (TRAINFAST_RECIPE wins over
    `recipe`, `tf.overridden` says what it changed), validates it for the device, opens the process group under
    torchrun (gloo on CPU, nccl on CUDA, one device per local rank), applies the runtime flags
    (cudnn.benchmark, deterministic) and seeds every RNG (python, numpy, torch, CUDA) with recipe.seed.
    Create it first, before the model, so the model's initialization is seeded too.

    `tf.setup(...)` applies the techniques; `tf.backward(loss)` replaces loss.backward(); `tf.autocast()` for
    loss code outside the model; `tf.log(**values)` and `tf.report(**metrics)` record numbers;
    `tf.save(path)` / `tf.load(path)` checkpoint the full state."""

    def __init__(self, recipe: Recipe | None = None, *, device: str | torch.device = "auto", env: bool = True,
                 builtin: bool = False) -> None:
        # env=False: the recipe as given, TRAINFAST_RECIPE ignored (an ablation rung: its recipe is the experiment).
        # builtin=True: the built-in run's, whose task computes the loss (the loss switches reach it) and whose
        # recipe's rewrites (a bigger batch) are made concrete here, once (`asked`: the recipe as asked).
        self.recipe, self.overridden = apply_env_recipe(recipe or Recipe()) if env else (recipe or Recipe(), {})
        self.asked, self.builtin, self.recipe = self.recipe, builtin, apply_recipe_rewrites(self.recipe, builtin)
        device = device if isinstance(device, torch.device) else resolve_device(device)
        validate_for_device(self.recipe, device)
        self.dist = setup_distributed(self.recipe, device)
        self.device = self.dist.device
        apply_runtime_flags(self.recipe, self.device)
        apply_process_wide_switches(self.recipe)      # one a process's start sets (passive_threads): said if too late
        seed_everything(self.recipe.seed)
        self.precision = build_precision(self.dist.precision_name(self.recipe), self.device,
                                         self.recipe.precision_level)
        self.state: TrainState | None = None
        self.loaders: list[SessionLoader] = []
        self.reported: dict[str, Any] = {}
        self.writer = checkpoint_writer(self.recipe)    # save(): in the loop, or in the background (async_checkpoint)
        self.logs = LogBuffer(self.recipe.log_every, self.device, self.dist)
        self.observers = session_observers()  # an instrument measuring this run (the ablation's probe)
        for observer in self.observers:
            observer.attach(self)
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
        """Apply the recipe to `model`, `optimizer` and the loaders, in the documented order (this package's docstring).
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
        (optimizer, lr, weight_decay, warmup_steps) and data (epochs, batch_size, batch_scale) do not change a
        user's own (a batch_scale asked of one is reported in unsupported())."""
        if self.state is not None:
            raise RuntimeError("Session.setup() was already called: one model per Session")
        check_setup(model, optimizer, bool(loaders), self.recipe)
        if loaders:
            self.recipe = resolve_loader_workers(loaders[0], self.recipe, self.device, mean, std)
        self.state = build_state(model, self.recipe, self.device, self.dist, self.precision, optimizer, scheduler)
        self.loaders = [adopt(loader, self.recipe, self.dist, self.state, i == 0, mean, std)
                        for i, loader in enumerate(loaders)]
        workers = getattr(self.loaders[0].loader, "num_workers", 0) if self.loaders else None
        for observer in self.observers:
            observer.watch(self.state, workers)
        returned = (self.state.forward, self.state.optimizer, *self.loaders)
        return returned + (self.state.scheduler,) if scheduler is not None else returned

    def unsupported(self) -> dict[str, str]:
        """The switches this run asked for that could not act on the script's own loop, each with why (a padding
        switch on batches that hold no padding or no token ids, a loss switch on a loss the script computes, a
        bigger batch for loaders and an optimizer the script built): the ablation rules their rung out."""
        cannot: dict[str, str] = {}
        if self.loaders:                  # each batch switch asked why it could not act on the training batches
            collator = getattr(getattr(self.loaders[0], "loader", None), "collate_fn", None)
            cannot.update(batch_refusals(collator, asked_batches(self.recipe)))
        cannot.update(unapplied_rewrites(self.recipe))      # none in the built-in run's: concrete since __init__
        cannot.update({} if self.builtin else unreached_losses(self.recipe))
        return cannot

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
        with self.dist.watch():     # the gradient all-reduce timed out: the rank that did not arrive is named
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
        values = {name: value.item() if isinstance(value, torch.Tensor) else value for name, value in metrics.items()}
        self.reported.update(values)
        for observer in self.observers:     # a measured run: a point of its curve (--target)
            observer.reported(values)

    def save(self, path: str | Path) -> Path | None:
        """The full state (model with the user's own keys, optimizer, scheduler, loss scaler and O2 masters,
        non-finite counters, step counters, the loaders' epochs and generators (the next pass shuffles as it
        would have; a pass is not resumed in its middle), what was reported, every rank's RNG states),
        written atomically with a checksum by rank 0 and loadable with torch.load(weights_only=True) (see
        checkpoint.py). Every rank must call it (the RNG states are gathered); returns the path on rank 0.
        With async_checkpoint the file is written in the background and appears shortly after: wait_saved()
        (or close(), or the next save) waits for it."""
        state = self.require_state()
        ranks = self.dist.gather_objects({"rng": capture_rng()})
        if not self.dist.is_main:
            return None
        payload = session_payload(state, self.recipe, self.loaders, self.reported, ranks)
        self.writer.save(payload, lambda owned: write_checkpoint(owned, path))
        return Path(path)

    def wait_saved(self) -> None:
        """Block until the last save() is on disk (async_checkpoint); raise its error, if it failed."""
        self.writer.wait()

    def load(self, path: str | Path) -> None:
        """Restore what save() wrote into this Session (after setup, with the same model and optimizer),
        including this rank's RNG states, so the run continues as if it had not stopped."""
        state = self.require_state()
        self.writer.wait()                 # a save of ours still in flight is complete before anything is read
        restore_session(read_checkpoint(path), path, state, self.loaders, self.reported, self.dist.rank,
                        self.dist.world_size)

    def close(self) -> None:
        """Wait for a checkpoint still being written, then close the process group this Session opened (also
        done at exit)."""
        self.writer.wait()
        for observer in self.observers:     # a measured run gathers what it needs of every rank while the group is open
            getattr(observer, "closing", no_closing)()
        self.dist.close()
