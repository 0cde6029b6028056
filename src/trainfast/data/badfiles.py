"""Unreadable images: skipped, counted, logged, and fatal past a threshold.

How a bad file travels: the dataset returns a `Skipped(path, reason)` instead of raising (an exception
in a worker would kill the whole epoch); `collate_skipping` drops it from the batch and attaches its
path to the `Batch`; `GuardedLoader` (what `build_loader` returns) reads those paths in the main
process, logs each one to the "trainfast.data" logger, keeps the tally and raises `BadFileError`
past the threshold. The training step never sees any of this: batches stay (inputs, targets).

Thresholds (checked in the main process, on this rank):
- `max_fraction` (Recipe.max_bad_fraction, default 1%) of the samples read so far, checked once
  `MIN_SAMPLES` samples have been read (before that a fraction is noise: one bad file among the first
  ten is 10%) and at the end of every pass over the data;
- `MAX_CONSECUTIVE` (10) bad samples in a row, checked from the first sample: with 1% of files bad, ten
  in a row has odds of 1e-20 in a shuffled order, so it means the storage itself is failing.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch
from torch.utils.data import default_collate

from .datasets import DataError, Skipped

log = logging.getLogger("trainfast.data")

MAX_CONSECUTIVE = 10
MIN_SAMPLES = 100


class BadFileError(DataError):
    """Too many unreadable files; the message names the last ones."""


class Batch(tuple):
    """(inputs, targets), plus the positions and paths of the samples that were skipped while building
    it. A tuple, so `inputs, targets = batch` works unchanged; `pin_memory` is defined so the DataLoader's
    pinning thread keeps the attributes (it calls `pin_memory()` on objects that have one)."""

    def __new__(cls, inputs, targets, size: int, skipped: tuple[tuple[int, Skipped], ...] = ()):
        batch = super().__new__(cls, (inputs, targets))
        batch.size, batch.skipped = size, skipped     # size: samples requested, good + skipped
        return batch

    def __reduce__(self):                      # crosses the worker queue with its attributes
        return Batch, (self[0], self[1], self.size, self.skipped)

    def pin_memory(self) -> "Batch":
        inputs, targets = (t.pin_memory() if isinstance(t, torch.Tensor) else t for t in self)
        return Batch(inputs, targets, self.size, self.skipped)


def collate_skipping(samples: list[Any]) -> Batch:
    """default_collate over the readable samples; the skipped ones are remembered with their position."""
    skipped = tuple((i, s) for i, s in enumerate(samples) if isinstance(s, Skipped))
    good = [s for s in samples if not isinstance(s, Skipped)] if skipped else samples
    inputs, targets = default_collate(good) if good else (None, None)
    return Batch(inputs, targets, len(samples), skipped)


@dataclass
class BadFileTally:
    """Counts on this rank (every worker's batches arrive here); see `reduce_count` for all ranks."""
    max_fraction: float = 0.01
    max_consecutive: int = MAX_CONSECUTIVE
    seen: int = 0
    skipped: int = 0
    consecutive: int = 0
    pass_skipped: int = 0
    last_pass_skipped: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=5))

    def record(self, batch: Batch) -> None:
        bad = dict(batch.skipped)
        for position in range(batch.size):
            self.seen += 1
            if position not in bad:
                self.consecutive = 0
                continue
            self.consecutive += 1
            self.skipped += 1
            self.pass_skipped += 1
            self.recent.append(bad[position])
            log.warning("skipped unreadable image %s (%s)", bad[position].path, bad[position].reason)
            if self.consecutive >= self.max_consecutive:
                self.fail(f"{self.consecutive} unreadable images in a row")
        if self.seen >= MIN_SAMPLES:
            self.check_fraction()

    def end_pass(self) -> None:
        self.last_pass_skipped, self.pass_skipped = self.pass_skipped, 0
        self.check_fraction()

    def check_fraction(self) -> None:
        if self.skipped > self.max_fraction * self.seen:
            self.fail(f"{self.skipped} of {self.seen} images read ({100 * self.skipped / self.seen:.1f}%) were "
                      f"unreadable, above max_bad_fraction={self.max_fraction:g}")

    def fail(self, what: str) -> None:
        last = "; ".join(f"{s.path} ({s.reason})" for s in self.recent)
        raise BadFileError(f"stopping: {what}. Last unreadable files: {last}. Fix or remove them, or raise "
                           f"--max-bad-fraction (0 <= value < 1).")


class GuardedLoader:
    """Wraps a DataLoader whose collate_fn is `collate_skipping`: yields (inputs, targets) batches, keeps
    the tally, drops batches in which every sample was unreadable. Anything else is the DataLoader's."""

    def __init__(self, loader: Iterable, tally: BadFileTally) -> None:
        self.loader, self.tally = loader, tally

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        if name in ("loader", "tally"):       # not set yet (copy/unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)     # sampler, dataset, batch_size, num_workers, ...

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.loader:
            if isinstance(batch, Batch):
                self.tally.record(batch)
                if batch.size == len(batch.skipped):
                    continue
            yield batch
        self.tally.end_pass()


def reduce_count(count: int, device: torch.device | None = None) -> int:
    """Sum a count over ranks when torch.distributed is initialized (else return it). A collective: every
    rank must call it at the same point. The tensor lives on `device` (NCCL needs CUDA tensors)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return count
    total = torch.tensor([count], dtype=torch.long, device=device)
    dist.all_reduce(total)
    return int(total.item())


def skipped_last_pass(batches: Any, device: torch.device | None = None) -> int:
    """Unreadable images skipped in the last pass over `batches` (DeviceBatches / Prefetcher / a loader),
    summed over workers and ranks; 0 for data that cannot be unreadable (in-memory tensors)."""
    loader = getattr(batches, "loader", batches)
    tally = getattr(loader, "tally", None)
    return reduce_count(tally.last_pass_skipped if tally is not None else 0, device)
