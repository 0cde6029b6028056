"""`trainfast.train` / `trainfast train`: the built-in run, a client of the Session (session.py).

A run: open a Session (recipe precedence, process group under torchrun, flags, seeds), build the model (a
factory is called after seeding, so its init is reproducible), set it up through the Session in the one
documented order (session.py), build the loaders for the run's datasets (data/loader.py; their batches reach
the device through data/device.py, as a Session loader's do), then run the epochs of the built-in
Session loop (engine.py) with checkpoints and metrics. Under torchrun (distributed.py): DistributedSampler
feeds the loaders and rank 0 alone writes.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import Dataset

from .checkpoint import build_checkpointer
from .data.badfiles import skipped_last_pass
from .data.datasets import Split
from .data.device import build_device_batches
from .data.imagefolder import with_decode_cache
from .data.loader import build_loader
from .detection.data import DetectionSplit
from .distributed import Dist
from .engine import train_one_epoch
from .measure import Meter, local_terms
from .recipe import Recipe
from .tasks import as_task, build_task, infer_task
from .tasks.classification import Classification
from .session import Session, TrainState, build_state, seed_everything  # noqa: F401  (seed_everything: ablate, tests)


def build_batches(dataset: Dataset, split: Split, recipe: Recipe, device: torch.device, train: bool,
                  sampler=None, rank: int = 0):
    """A built-in loader for `dataset`, its batches on the device (prefetched with recipe.prefetch)."""
    loader = build_loader(dataset, recipe, device, train, split, sampler=sampler, rank=rank)
    return build_device_batches(loader, recipe, device, split.mean, split.std)


def build_loaders(split: Split, recipe: Recipe, device: torch.device, dist: Dist) -> tuple[Any, Any]:
    """The run's training and evaluation batches, on this rank's shards (plain loaders in one process)."""
    train_batches = build_batches(split.train, split, recipe, device, train=True,
                                  sampler=dist.train_sampler(split.train, recipe.seed), rank=dist.rank)
    val_batches = build_batches(split.val, split, recipe, device, train=False,
                                sampler=dist.val_sampler(split.val), rank=dist.rank)
    return train_batches, val_batches


def build_run(model: nn.Module, split, recipe: Recipe, device: torch.device, dist: Dist,
              task) -> tuple[TrainState, Any, Any]:
    """One rank's state and batches: the unused-parameter probe (DDP only), the model set up in the Session's
    order, the task's loaders and its warm-up. For callers that manage seeding and the process group
    themselves (ablate). `task`: a task object, or a bare loss function for the classification task."""
    task = as_task(task)
    dist.probe_unused(model, task, split.train, recipe.batch_size)
    state = build_state(model, recipe, device, dist)
    train_batches, val_batches = task.build_loaders(split, recipe, device, dist)
    task.apply_schedule(state, len(train_batches))
    return state, train_batches, val_batches


def build_meter(state: TrainState, dist: Dist, on_window: Callable | None = None, task=None) -> Meter:
    """One epoch's Meter: it counts micro-steps from where the state is, raises on a non-finite loss only
    under nonfinite=stop, and under torchrun decides that together with every rank. `task` (default
    classification) decides what a step counts and whether loss terms are compared and averaged over ranks."""
    recipe = state.recipe
    task = task or Classification()
    return Meter(dist.device, recipe.log_every, on_window=on_window, first_step=state.micro_step,
                 stop_on_nonfinite=recipe.nonfinite == "stop",
                 agree=dist.agree_nonfinite if dist.enabled else None, timer=state.timer, score=task.score,
                 reduce_terms=dist.reduce_terms if task.loss_terms else local_terms)


@dataclass
class TrainResult:
    state: TrainState
    history: list[dict[str, Any]] = field(default_factory=list)
    out_dir: Path | None = None

    @property
    def model(self) -> nn.Module:
        return self.state.model


def as_split(train_set: Dataset | Split | DetectionSplit, val_set: Dataset | None, num_classes: int | None = None,
             mean=None, std=None) -> Split | DetectionSplit:
    """Accept our Split (or DetectionSplit) or two plain datasets. With mean/std, datasets are expected to
    yield uint8 images (normalized by trainfast); without, they yield model-ready tensors."""
    if isinstance(train_set, (Split, DetectionSplit)):
        return train_set
    if val_set is None:
        raise ValueError("train(): val_set is required when train_set is a plain Dataset")
    return Split(train_set, val_set, num_classes or 0, mean, std, 0, type(train_set).__name__)


def train(model: nn.Module | Callable[[], nn.Module], train_set: Dataset | Split | DetectionSplit,
          val_set: Dataset | None = None, loss_fn: Callable | None = None, recipe: Recipe | None = None, *,
          device: str | torch.device = "auto", mean=None, std=None, out: str | Path | None = None,
          on_window: Callable | None = None, on_epoch: Callable | None = None,
          resume: str | Path | None = None, task: str | None = None) -> TrainResult:
    """Train `model` (a module, or a factory called after seeding so its init is reproducible) with a Recipe.
    Returns the final state and per-epoch metrics; with `out`, writes the run folder (metrics.jsonl,
    recipe.json, model.pt, checkpoints/). resume="auto" continues from the newest good checkpoint in
    out/checkpoints (fresh start when there is none); a path resumes from that checkpoint file.
    `task`: "classification" or "detection" (tasks/); by default detection for a DetectionSplit (a torchvision
    detector: model(images, targets) -> dict of losses in train mode; evaluated as COCO mAP)."""
    split = as_split(train_set, val_set, mean=mean, std=std)     # refused before anything starts
    task_name = infer_task(task, data=split)
    build_task(task_name, loss_fn).validate(recipe or Recipe())
    out_dir = Path(out) if out is not None else None
    tf = Session(recipe, device=device)     # TRAINFAST_RECIPE wins over `recipe`; process group under torchrun
    dist, device = tf.dist, tf.device
    task = build_task(task_name, loss_fn, dist)
    task.validate(tf.recipe)                       # again: TRAINFAST_RECIPE may have changed it
    writes = out_dir is not None and dist.is_main  # rank 0 alone writes the run folder
    on_window, on_epoch = (on_window, on_epoch) if dist.is_main else (None, None)
    module = model() if callable(model) and not isinstance(model, nn.Module) else model
    split = with_decode_cache(split, tf.recipe, dist)        # image folders, when asked: decode once, read pixels
    tf.recipe = recipe = task.resolve_workers(tf.recipe, split, device)   # "auto": measured once, recorded
    dist.probe_unused(module, task, split.train, recipe.batch_size)
    tf.setup(module)                               # the recipe's optimizer and warm-up schedule
    state = tf.state
    train_batches, val_batches = task.build_loaders(split, recipe, device, dist)
    task.apply_schedule(state, len(train_batches))  # detection: seed 004's first-epoch warm-up
    result = TrainResult(state, out_dir=out_dir)
    checkpoints = build_checkpointer(out_dir, recipe, train_batches, dist.rank, dist.gather_objects)
    resumed = checkpoints.start(state, resume)     # restores state, RNGs and the data position
    if resume is not None:
        # Records after the checkpoint are redone (a mid-epoch checkpoint's epoch record included); with
        # no checkpoint at all, the run starts over and so does metrics.jsonl.
        keep_through = 0 if resumed is None else state.step - (resumed["position"] > 0)
        result.history = read_history(out_dir, keep_through)
    if writes:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "recipe.json").write_text(json.dumps(recipe.to_dict(), indent=2))

    for epoch in range(state.epoch, recipe.epochs):
        dist.set_epoch(epoch)
        meter = build_meter(state, dist, on_window, task)
        checkpoints.begin_epoch(state, meter)
        t0 = time.perf_counter()
        with dist.watch():                     # a silent rank is named, not waited on forever
            stats = train_one_epoch(state, train_batches, task, meter, after_step=checkpoints.after_step)
            metrics = task.evaluate(state.model, val_batches, state.precision, dist)
        record = {"epoch": epoch + 1, "step": state.step, **task.train_metrics(stats, dist),
                  **task.val_metrics(metrics), "epoch_time_s": time.perf_counter() - t0, "data_wait_s": stats.data_wait_s,
                  "lr": state.optimizer.param_groups[0]["lr"], "train_losses": stats.losses,
                  **state.precision.metrics(), **state.nonfinite.metrics(), "num_workers": recipe.num_workers,
                  "skipped_files": skipped_last_pass(train_batches, device),        # unreadable images,
                  "val_skipped_files": skipped_last_pass(val_batches, device)}      # all workers and ranks
        result.history.append(record)
        if writes:
            with open(out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        if on_epoch is not None:
            on_epoch(record)
        checkpoints.end_epoch(state)
    if out_dir is not None:
        weights = dist.full_state_dict(state.model)   # collective under FSDP2
        if writes:
            save_weights(weights, out_dir / "model.pt")
    tf.close()                                     # an error leaves it to process exit (atexit)
    return result


def read_history(out_dir: Path, step: int) -> list[dict[str, Any]]:
    """Epoch records of a resumed run up to `step`; later records (the process died between writing them
    and checkpointing) are dropped from metrics.jsonl, since the resumed run writes them again."""
    path = out_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept = [r for r in records if r["step"] <= step]
    if len(kept) != len(records):
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return kept


def save_weights(model: nn.Module | dict, path: Path) -> None:
    """Final weights as a plain state_dict (loadable with weights_only=True), written atomically."""
    from .checkpoint import atomic_save

    weights = model if isinstance(model, dict) else model.state_dict()
    atomic_save({k: v.detach().cpu() for k, v in weights.items()}, path)
