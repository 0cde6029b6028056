"""`trainfast.train` / `trainfast train`: the built-in run (assembled by run.py, as every other built-in run
is), trained epoch by epoch with the Session loop (engine.py), evaluated, checkpointed and recorded. Under
torchrun (distributed.py): DistributedSampler feeds the loaders and rank 0 alone writes.
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
from .curves import BuiltinCurve, CurvePlan
from .data.datasets import Split
from .detection.data import DetectionSplit
from .engine import train_one_epoch
from .recipe import Recipe
from .run import BuiltinRun, as_split, assemble_run
from .session import TrainState
from .target import Target, TargetError, parse_target


@dataclass
class TrainResult:
    state: TrainState
    history: list[dict[str, Any]] = field(default_factory=list)
    out_dir: Path | None = None
    curve: dict[str, Any] | None = None      # with a target: its evaluations on the way and where it stopped

    @property
    def model(self) -> nn.Module:
        return self.state.model


def train(model: nn.Module | Callable[[], nn.Module], train_set: Dataset | Split | DetectionSplit,
          val_set: Dataset | None = None, loss_fn: Callable | None = None, recipe: Recipe | None = None, *,
          device: str | torch.device = "auto", mean=None, std=None, out: str | Path | None = None,
          on_window: Callable | None = None, on_epoch: Callable | None = None,
          resume: str | Path | None = None, task: str | None = None, target: str | Target | None = None
          ) -> TrainResult:
    # The public entry point: 14 parameters, each a user's documented option; an options object would only
    # move them out of sight of help(trainfast.train).
    """Train `model` (a module, or a factory called after seeding so its init is reproducible) with a Recipe.
    Returns the final state and per-epoch metrics; with `out`, writes the run folder (metrics.jsonl,
    recipe.json, model.pt, checkpoints/). resume="auto" continues from the newest good checkpoint in
    out/checkpoints (fresh start when there is none); a path resumes from that checkpoint file.
    `task`: "classification" or "detection" (tasks/); by default detection for a DetectionSplit (a torchvision
    detector: model(images, targets) -> dict of losses in train mode; evaluated as COCO mAP).
    `mean`/`std`: plain datasets yield uint8 images, normalized by trainfast. `on_window(step, stats)` after
    every metric window and `on_epoch(record)` after every epoch, on rank 0 only. `target` ("val_loss<=3.2",
    "val_acc>=0.95"): the run evaluates on a schedule, stops at its first evaluation that reaches it (else at the
    end of its epochs) and `result.curve` (out/curve.json) says when."""
    plan = target_plan(target)
    split = as_split(train_set, val_set, mean=mean, std=std)     # refused before anything starts
    run = assemble_run(model, split, recipe, device=device, task=task, loss_fn=loss_fn)
    out_dir = Path(out) if out is not None else None
    main = run.dist.is_main                        # rank 0 alone writes the run folder and reports progress
    result = TrainResult(run.state, out_dir=out_dir)
    checkpoints = build_checkpointer(out_dir, run.recipe, run.train_batches, run.dist.rank, run.dist.gather_objects)
    resumed = checkpoints.start(run.state, resume)     # restores state, RNGs and the data position
    if resume is not None:
        # Records after the checkpoint are redone (a mid-epoch checkpoint's epoch record included); with
        # no checkpoint at all, the run starts over and so does metrics.jsonl.
        keep_through = 0 if resumed is None else run.state.step - (resumed["position"] > 0)
        result.history = read_history(out_dir, keep_through)
    if out_dir is not None and main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "recipe.json").write_text(json.dumps(run.recipe.to_dict(), indent=2))
    curve = BuiltinCurve(run, plan) if plan is not None else None
    epoch = run.state.epoch
    while curve.more() if curve is not None else epoch < run.recipe.epochs:
        record = train_epoch(run, epoch, checkpoints, on_window if main else None, curve)
        epoch += 1
        result.history.append(record)
        if out_dir is not None and main:
            with open(out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        if main and on_epoch is not None:
            on_epoch(record)
        checkpoints.end_epoch(run.state)
    checkpoints.finish()                           # async_checkpoint: the last save is complete (or raises)
    if curve is not None:
        result.curve = curve.record()
        if out_dir is not None and main:
            (out_dir / "curve.json").write_text(json.dumps(result.curve, indent=2))
    if out_dir is not None:
        weights = run.dist.full_state_dict(run.state.model)   # collective under FSDP2
        if main:
            save_weights(weights, out_dir / "model.pt")
    run.close()                                    # an error leaves it to process exit (atexit)
    return result


def target_plan(target: str | Target | None) -> CurvePlan | None:
    """A target as train takes it: written out (auto is the level of a baseline's runs: ablate and tune have one)."""
    parsed = parse_target(target)
    if parsed is None:
        return None
    if not parsed.known:
        raise TargetError("--target auto is the level a baseline's runs reach, which a single run has not: give the "
                          "level (val_loss<=3.2, val_acc>=0.95), or find it with trainfast ablate --target auto")
    return CurvePlan(target=parsed, max_factor=1.0)       # early stopping: the epochs asked for are the most


def train_epoch(run: BuiltinRun, epoch: int, checkpoints, on_window: Callable | None,
                curve: BuiltinCurve | None = None) -> dict[str, Any]:
    """One epoch of the built-in loop and its evaluation; the epoch's record (metrics.jsonl's line). With a
    curve, the epoch evaluates on its schedule and ends early once the target is reached."""
    state, task, dist, device = run.state, run.task, run.dist, run.device
    batches = curve.batches(run.train_batches) if curve is not None else run.train_batches
    after_step = curve.hooked(checkpoints.after_step) if curve is not None else checkpoints.after_step
    dist.set_epoch(epoch)
    meter = run.meter(on_window)
    checkpoints.begin_epoch(state, meter)
    t0 = time.perf_counter()
    with dist.watch():                     # a silent rank is named, not waited on forever
        stats = train_one_epoch(state, batches, task, meter, after_step=after_step)
        metrics = task.evaluate(state.model, run.val_batches, state.precision, dist)
    return {"epoch": epoch + 1, "step": state.step, **task.train_metrics(stats, dist),
            **task.val_metrics(metrics), "epoch_time_s": time.perf_counter() - t0, "data_wait_s": stats.data_wait_s,
            "lr": state.optimizer.param_groups[0]["lr"], "train_losses": stats.losses,
            **state.precision.metrics(), **state.nonfinite.metrics(), "num_workers": run.recipe.num_workers,
            # image files: the unreadable ones, and those device_decode left to the host (data/filecounts.py)
            **task.build_file_counts().epoch_record(run.train_batches, run.val_batches, device)}


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
