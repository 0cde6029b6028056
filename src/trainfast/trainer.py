"""Assembling a run: seeding, the documented order in which techniques are applied, and the epoch loop
behind `trainfast.train` / `trainfast train`.

Order (each step needs the one before it):
  1. process flags (cudnn.benchmark, deterministic), seed every RNG
  2. model to the device, then channels_last, then the precision level's dtype (O2/O3: half weights, input and
     output casts); the optimizer must see the final parameter tensors
  3. optimizer (for-loop/foreach/fused) and warm-up scheduler on the precision's optimizer params (the eager
     parameters, or O2's fp32 masters); the clipper clips the same tensors
  4. torch.compile wraps the forward last, after the memory format and dtype are fixed
  5. loaders (host or on-device normalization)
Under torchrun (distributed.py): the process group first; DDP/FSDP2 wrap the model after step 2 and
before the optimizer (FSDP2 swaps parameters for shards in place); DistributedSampler feeds the loaders.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from .checkpoint import build_checkpointer
from .data.datasets import Split, normalize, stats_tensors
from .data.badfiles import skipped_last_pass
from .data.imagefolder import with_decode_cache
from .data.loader import build_loader, resolve_num_workers
from .distributed import Dist, setup_distributed
from .engine import Clipper, TrainState, evaluate, train_one_epoch
from .faults import build_nonfinite_policy
from .measure import Meter
from .recipe import Recipe, resolve_device, validate_for_device
from .techniques.compile import apply_compile
from .techniques.memory_format import apply_memory_format, memory_format
from .techniques.optimizer import build_optimizer, build_scheduler
from .techniques.precision import Precision, build_precision
from .techniques.prefetch import HostBuffers, Prefetcher
from .techniques.runtime import apply_runtime_flags
from .techniques.transfer import DeviceBatches


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)   # seeds CUDA generators too


def build_prepare(split: Split, recipe: Recipe, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """What happens to an input batch once it is on the device: normalization if it arrived as uint8
    (prefetch), then the memory format."""
    fmt = memory_format(recipe.channels_last)
    if recipe.prefetch and split.mean is not None:
        mean, std = stats_tensors(split.mean, split.std, device=device)
        buffers = HostBuffers(device)     # CPU: recycled output buffers; CUDA: the caching allocator's
        return lambda x: normalize(x, mean, std, out=buffers.take(x.shape)).contiguous(memory_format=fmt)
    return lambda x: x.contiguous(memory_format=fmt)


def build_batches(dataset: Dataset, split: Split, recipe: Recipe, device: torch.device, train: bool,
                  sampler=None, rank: int = 0):
    loader = build_loader(dataset, recipe, device, train, split, sampler=sampler, rank=rank)
    prepare = build_prepare(split, recipe, device)
    if recipe.prefetch:
        return Prefetcher(loader, device, prepare)
    return DeviceBatches(loader, device, prepare, non_blocking=recipe.non_blocking)


def build_state(model: nn.Module, recipe: Recipe, device: torch.device, dist: Dist | None = None,
                precision: Precision | None = None) -> TrainState:
    """`precision` overrides the one the recipe names (tests and benchmarks tune the loss scaler with it)."""
    dist = dist or Dist(device, strategy=recipe.strategy)
    precision = precision or build_precision(dist.precision_name(recipe), device, recipe.precision_level)
    model = precision.prepare_model(apply_memory_format(model.to(device), recipe.channels_last))
    model.zero_grad(set_to_none=True)              # the engine zeroes after each update, not before
    trained = dist.wrap(model, recipe)             # DDP / FSDP2 (in place) / DataParallel; `model` alone
    params = precision.optimizer_params(model)     # the parameters, or O2's fp32 masters
    optimizer = build_optimizer(params, recipe)
    return TrainState(
        model=model,
        forward=apply_compile(trained, recipe.compile),
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, recipe.warmup_steps),
        precision=precision,
        clip=Clipper(recipe.grad_clip, params),
        recipe=recipe,
        nonfinite=build_nonfinite_policy(recipe, dist.agree_finite),
        sync=dist.grad_sync(trained),
    )


def build_run(model: nn.Module, split: Split, recipe: Recipe, device: torch.device, dist: Dist,
              loss_fn: Callable) -> tuple[TrainState, Any, Any]:
    """One rank's state and batches: the unused-parameter probe (DDP only), the wrapped model, and the
    loaders on this rank's shards (plain loaders in one process)."""
    dist.probe_unused(model, loss_fn, split.train, recipe.batch_size)
    state = build_state(model, recipe, device, dist)
    train_batches = build_batches(split.train, split, recipe, device, train=True,
                                  sampler=dist.train_sampler(split.train, recipe.seed), rank=dist.rank)
    val_batches = build_batches(split.val, split, recipe, device, train=False,
                                sampler=dist.val_sampler(split.val), rank=dist.rank)
    return state, train_batches, val_batches


def build_meter(state: TrainState, dist: Dist, on_window: Callable | None = None) -> Meter:
    """One epoch's Meter: it counts micro-steps from where the state is, raises on a non-finite loss only
    under nonfinite=stop, and under torchrun decides that together with every rank."""
    recipe = state.recipe
    return Meter(dist.device, recipe.log_every, on_window=on_window, first_step=state.micro_step,
                 stop_on_nonfinite=recipe.nonfinite == "stop",
                 agree=dist.agree_nonfinite if dist.enabled else None)


@dataclass
class TrainResult:
    state: TrainState
    history: list[dict[str, Any]] = field(default_factory=list)
    out_dir: Path | None = None

    @property
    def model(self) -> nn.Module:
        return self.state.model


def as_split(train_set: Dataset | Split, val_set: Dataset | None, num_classes: int | None = None,
             mean=None, std=None) -> Split:
    """Accept our Split or two plain datasets. With mean/std, datasets are expected to yield uint8 images
    (normalized by trainfast); without, they yield model-ready tensors."""
    if isinstance(train_set, Split):
        return train_set
    if val_set is None:
        raise ValueError("train(): val_set is required when train_set is a plain Dataset")
    return Split(train_set, val_set, num_classes or 0, mean, std, 0, type(train_set).__name__)


def train(model: nn.Module | Callable[[], nn.Module], train_set: Dataset | Split, val_set: Dataset | None = None,
          loss_fn: Callable | None = None, recipe: Recipe | None = None, *, device: str | torch.device = "auto",
          mean=None, std=None, out: str | Path | None = None,
          on_window: Callable | None = None, on_epoch: Callable | None = None,
          resume: str | Path | None = None) -> TrainResult:
    """Train `model` (a module, or a factory called after seeding so its init is reproducible) with a Recipe.
    Returns the final state and per-epoch metrics; with `out`, writes the run folder (metrics.jsonl,
    recipe.json, model.pt, checkpoints/). resume="auto" continues from the newest good checkpoint in
    out/checkpoints (fresh start when there is none); a path resumes from that checkpoint file."""
    recipe = recipe or Recipe()
    device = device if isinstance(device, torch.device) else resolve_device(device)
    validate_for_device(recipe, device)
    split = as_split(train_set, val_set, mean=mean, std=std)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    out_dir = Path(out) if out is not None else None
    dist = setup_distributed(recipe, device)       # from torchrun's env; a no-op object in one process
    device = dist.device
    writes = out_dir is not None and dist.is_main  # rank 0 alone writes the run folder
    on_window, on_epoch = (on_window, on_epoch) if dist.is_main else (None, None)
    apply_runtime_flags(recipe, device)
    seed_everything(recipe.seed)
    module = model() if callable(model) and not isinstance(model, nn.Module) else model
    split = with_decode_cache(split, recipe, dist)        # image folders, when asked: decode once, read pixels
    recipe = resolve_num_workers(recipe, split, device)   # "auto": measured once, recorded
    state, train_batches, val_batches = build_run(module, split, recipe, device, dist, loss_fn)
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
        meter = build_meter(state, dist, on_window)
        checkpoints.begin_epoch(state, meter)
        t0 = time.perf_counter()
        with dist.watch():                     # a silent rank is named, not waited on forever
            stats = train_one_epoch(state, train_batches, dist.criterion(loss_fn), meter,
                                    after_step=checkpoints.after_step)
            metrics = dist.reduce_eval(evaluate(state.model, val_batches, loss_fn, state.precision))
        train_loss, train_accuracy = dist.reduce_train(stats.loss, stats.correct, stats.samples)
        record = {"epoch": epoch + 1, "step": state.step, "train_loss": train_loss, "train_accuracy": train_accuracy,
                  "val_loss": metrics["loss"], "val_accuracy": metrics["accuracy"],
                  "epoch_time_s": time.perf_counter() - t0, "data_wait_s": stats.data_wait_s,
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
    dist.close()                                   # an error leaves it to process exit (atexit)
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
