"""The built-in run, assembled in one place.

`trainfast train`, every rung of a built-in ablation, `trainfast doctor` and `trainfast bench-data` get their
run from here, so what one measures is what another trains. The order, each step needing the one before:
  1. a Session: the recipe (TRAINFAST_RECIPE on top, unless the caller's recipe is the experiment), the
     process group under torchrun, the runtime flags (cudnn.benchmark, deterministic), every RNG seeded; the
     built-in run's Session makes the recipe's rewrites concrete as it starts (a bigger batch: batch size or
     accumulation, learning rate, warm-up), so the loaders, the optimizer and the schedule all read those values;
  2. the task (tasks/): what a batch, a loss and the judged metric mean;
  3. the model, built after seeding so its initialization is reproducible;
  4. the data as the task reads it (an image folder's decode cache), num_workers="auto" measured (prepare_data);
  5. under DDP, one probe step on a copy for parameters that get no gradient (find_unused_parameters);
  6. the Session's setup: the recipe's techniques on the model and the recipe's optimizer (session/);
  7. the task's loaders, their batches on the device, and its warm-up schedule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from .data.datasets import Split
from .detection.data import DetectionSplit
from .distributed import Dist
from .engine import train_one_epoch
from .measure import Meter, StepTime, StepTimer, local_terms, reset_peak_memory
from .recipe import Recipe
from .session import Session, TrainState, sum_losses
from .session.state import no_update_hook
from .tasks import build_task, infer_task
from .text.batching import TextSplit


@dataclass
class BuiltinRun:
    """One rank's assembled run: its Session (recipe, process group, device, state), its task, its data
    (after the decode cache) and the batches of both splits on the device."""
    session: Session
    task: Any
    split: Any
    train_batches: Any
    val_batches: Any

    @property
    def state(self) -> TrainState:
        return self.session.state

    @property
    def recipe(self) -> Recipe:
        return self.session.recipe

    @property
    def dist(self) -> Dist:
        return self.session.dist

    @property
    def device(self) -> torch.device:
        return self.session.device

    def meter(self, on_window: Callable | None = None) -> Meter:
        """A Meter for one pass of the loop (build_meter)."""
        return build_meter(self.state, self.dist, on_window, self.task)

    def steps_apart(self, batches) -> list[StepTime]:
        """Train on `batches` with the run's own loop and switches, timed on a clock of their own and with nothing
        after each update (the ablation's probe neither counts nor sees these steps); the run's clock and hook are
        put back after. Every step as that clock read it (on CUDA the read waits for the device)."""
        state = self.state
        kept_timer, kept_hook = state.timer, state.after_update
        state.timer, state.after_update = StepTimer(self.device), no_update_hook
        try:
            with self.dist.watch():
                train_one_epoch(state, batches, self.task, self.meter())
            state.timer.read()
            return state.timer.steps
        finally:
            state.timer, state.after_update = kept_timer, kept_hook

    def close(self) -> None:
        self.session.close()


def assemble_run(model: str | nn.Module | Callable[[], nn.Module], split, recipe: Recipe | None = None, *,
                 device: str | torch.device = "auto", task: str | None = None, loss_fn: Callable | None = None,
                 env: bool = True) -> BuiltinRun:
    """The built-in run in the module docstring's order. `model`: a model name (built by the task), a module,
    or a zero-argument factory (called after seeding). `task`: a task name, inferred from the model or split
    when None. `env=False`: TRAINFAST_RECIPE is not applied (an ablation rung's recipe is the experiment)."""
    name = infer_task(task, model, split)
    build_task(name, loss_fn).validate(recipe or Recipe())        # refused before anything starts
    session = Session(recipe, device=device, env=env, builtin=True)                     # 1
    try:
        work = build_task(name, loss_fn, session.dist, session.recipe)                  # 2
        work.validate(session.recipe)                    # again: TRAINFAST_RECIPE may have changed it
        module = build_module(model, work, split)                                       # 3
        split, session.recipe = prepare_data(split, session.recipe, session.device, session.dist, work)   # 4
        reset_peak_memory(session.device)
        session.dist.probe_unused(module, first_step_loss(work, split.train, session.recipe.batch_size,  # 5
                                                          session.device))
        session.setup(module)                                                           # 6
        train_batches, val_batches = work.build_loaders(split, session.recipe, session.device, session.dist)  # 7
        check_steps(len(train_batches), len(split.train), session.recipe.batch_size, session.dist,
                    scale=session.recipe.batch_size // session.asked.batch_size)
        work.apply_schedule(session.state, len(train_batches))
    except BaseException:
        session.close()
        raise
    return BuiltinRun(session, work, split, train_batches, val_batches)


def check_steps(steps: int, samples: int, batch_size: int, dist: Dist | None, scale: int = 1) -> None:
    """An epoch must hold one step: with full batches only (a partial last batch is dropped, so every step has
    one shape), a batch larger than the training set would train nothing, and a timed run wait for ever.
    `scale`: the batch_scale that multiplied the recipe's batch into `batch_size`, named in the message."""
    if steps:
        return
    ranks = dist.world_size if dist is not None else 1
    per_rank = f" ({samples // ranks} per rank of {ranks})" if ranks > 1 else ""
    fits = max(1, samples // ranks)
    asked = (f"--batch-size {batch_size // scale} x batch_scale={scale} = {batch_size}" if scale > 1
             else f"--batch-size {batch_size}")
    advice = (f"use a batch_scale of at most {max(1, fits // (batch_size // scale))} or a smaller batch size, or "
              "scale_by=accumulation" if scale > 1 else f"use a batch size of at most {fits}")
    raise ValueError(f"{asked} is larger than the training set's {samples} samples{per_rank}: an epoch would hold "
                     f"no full batch (the last partial batch is dropped) and train nothing; {advice}")


def as_split(train_set, val_set=None, num_classes: int | None = None, mean=None,
             std=None) -> Split | DetectionSplit | TextSplit:
    """Accept our Split (or DetectionSplit, TextSplit) or two plain datasets. With mean/std, datasets are expected
    to yield uint8 images (normalized by trainfast); without, they yield model-ready tensors."""
    if isinstance(train_set, (Split, DetectionSplit, TextSplit)):
        return train_set
    if val_set is None:
        raise ValueError("train(): val_set is required when train_set is a plain Dataset")
    return Split(train_set, val_set, num_classes or 0, mean, std, 0, type(train_set).__name__)


def build_module(model: str | nn.Module | Callable[[], nn.Module], task, split) -> nn.Module:
    if isinstance(model, str):
        return task.build_model(model, split)
    return model() if callable(model) and not isinstance(model, nn.Module) else model


def prepare_data(split, recipe: Recipe, device: torch.device, dist: Dist | None = None, task=None):
    """(split, recipe) ready to load: the split as the task reads it (image folders through the decode cache when
    the recipe asks for it: Task.prepare_split), and num_workers="auto" measured once and recorded in the recipe."""
    task = task or build_task("classification")
    split = task.prepare_split(split, recipe, dist)
    return split, task.resolve_workers(recipe, split, device)


def first_step_loss(task, dataset, batch_size: int, device: torch.device) -> Callable[[nn.Module], torch.Tensor]:
    """The task's summed loss of a model on the dataset's first samples: what the unused-parameter probe
    backpropagates (only read under DDP, so the samples are loaded only then)."""
    def loss_of(model: nn.Module) -> torch.Tensor:
        inputs, targets = task.probe_batch([dataset[i] for i in range(min(batch_size, len(dataset)))], device)
        return sum_losses(task.forward(model, inputs, targets)[1])
    return loss_of


def build_meter(state: TrainState, dist: Dist, on_window: Callable | None, task) -> Meter:
    """One epoch's Meter: it counts micro-steps from where the state is, raises on a non-finite loss only
    under nonfinite=stop, and under torchrun decides that together with every rank. `task` decides what a
    step counts and whether loss terms are compared and averaged over ranks."""
    recipe = state.recipe
    return Meter(dist.device, recipe.log_every, on_window=on_window, first_step=state.micro_step,
                 stop_on_nonfinite=recipe.nonfinite == "stop",
                 agree=dist.agree_nonfinite if dist.enabled else None, timer=state.timer, score=task.score,
                 reduce_terms=dist.reduce_terms if task.loss_terms else local_terms)
