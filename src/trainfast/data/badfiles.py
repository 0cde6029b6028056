"""Unreadable images: skipped, counted, logged, and fatal past a threshold.

How a bad file travels: the dataset returns a `Skipped(path, reason)` instead of raising (an exception
in a worker would kill the whole epoch); `collate_skipping` drops it from the batch and attaches its
path to the `Batch`; `GuardedLoader` (what `build_loader` returns) reads those paths in the main
process, logs each one to the "trainfast.data" logger, keeps the tally and raises `BadFileError`
past the threshold. The training step never sees any of this: batches stay (inputs, targets).

Two levels of counts. `BadFileTally`, one per loader: its skipped count per pass is what the metrics
report per split (`skipped_last_pass`), and its run of consecutive failures. `RunTally`, one per run,
shared by the run's train and val loaders (see `join_run_tally`): everything read so far in the run,
both splits, all passes. The share of unreadable files is judged on the run's counts only: two bad files
that happen to land in a 61-image validation split are 3% of that split but 0.7% of the run.

Thresholds:
- `max_fraction` (Recipe.max_bad_fraction, default 1%) of the images the run has read, judged only once
  `MIN_SAMPLES` images have been read (before that a fraction is noise: one bad file among the first ten
  is 10%), or once as many images as the run's datasets hold, when they hold fewer (then the fraction is
  the exact share, not an estimate). The same rule for every check: after every batch on this rank, at
  the end of every pass, and over all ranks in `skipped_last_pass`.
- `MAX_CONSECUTIVE` (10) bad samples in a row from one loader, checked from the first sample: with 1% of
  files bad, ten in a row has odds of 1e-20 in a shuffled order, so it means the storage itself is failing.

Under torch.distributed the run-wide counts are summed over ranks in `skipped_last_pass`, a collective the
training loop already calls on every rank at the same point after every pass: every rank sees the same
sums and stops together. Between those points a rank judges alone, and stops alone only when its own
unreadable files already exceed the fraction of what all ranks have read (its count x the world size,
exact when the ranks read equal shares, as their samplers give them): a verdict no other rank's good
files could overturn.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch
from torch.utils.data import default_collate

from ..errors import DataError
from .datasets import Skipped
from .encoded import EncodedImage, collate_encoded

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
    if good and isinstance(good[0][0], EncodedImage):       # device_decode: bytes and boxes, decoded later
        inputs, targets = collate_encoded([s[0] for s in good]), default_collate([s[1] for s in good])
    else:
        inputs, targets = default_collate(good) if good else (None, None)
    return Batch(inputs, targets, len(samples), skipped)


@dataclass
class RunTally:
    """Everything one run has read on this rank: every loader built for the run (train and val), every
    pass. `skipped_last_pass` sums it over ranks."""
    max_fraction: float = 0.01
    seen: int = 0
    skipped: int = 0
    population: int = 0        # images in the run's datasets, one pass over each loader (0: unknown)
    reading: bool = False      # a loader has started reading: loaders built from now on are another run's
    recent: deque = field(default_factory=lambda: deque(maxlen=5))

    def min_samples(self) -> int:
        """Images to read before a fraction means something: MIN_SAMPLES, or all of a smaller dataset."""
        return min(MIN_SAMPLES, self.population) if self.population else MIN_SAMPLES

    def check_fraction(self, seen: int, skipped: int, note: str = "") -> None:
        """Stop if `skipped` of `seen` is above max_fraction, once `seen` can support a fraction."""
        if seen >= self.min_samples() and skipped > self.max_fraction * seen:
            self.fail(f"{skipped} of {seen} images read ({100 * skipped / seen:.1f}%){note} were unreadable, "
                      f"above max_bad_fraction={self.max_fraction:g}")

    def check_on_this_rank(self) -> None:
        # One process: the exact run-wide check. Under torchrun: this rank's unreadable files against what
        # all ranks have read (see the module docstring), a verdict the other ranks' counts cannot undo.
        ranks = world_size()
        note = "" if ranks == 1 else f" (this rank's unreadable files, of about what all {ranks} ranks read)"
        self.check_fraction(self.seen * ranks, self.skipped, note)

    def fail(self, what: str) -> None:
        last = ("; ".join(f"{s.path} ({s.reason})" for s in self.recent)
                or "none on this rank (see the other ranks' logs)")
        raise BadFileError(f"stopping: {what}. Last unreadable files: {last}. Fix or remove them, or raise "
                           f"--max-bad-fraction (0 <= value < 1).")


class BadFileTally:
    """One loader's counts (every worker's batches arrive here, in the main process), added to the run's
    `RunTally` too; a tally built alone gets a run of its own."""

    def __init__(self, max_fraction: float = 0.01, max_consecutive: int = MAX_CONSECUTIVE,
                 run: RunTally | None = None) -> None:
        self.run = run if run is not None else RunTally(max_fraction)
        self.max_consecutive = max_consecutive
        self.seen = self.skipped = self.consecutive = 0
        self.pass_skipped = self.last_pass_skipped = 0

    def record(self, batch: Batch) -> None:
        bad = dict(batch.skipped)
        self.seen += batch.size
        self.run.seen += batch.size
        for position in range(batch.size):
            if position not in bad:
                self.consecutive = 0
                continue
            self.consecutive += 1
            self.skipped += 1
            self.run.skipped += 1
            self.pass_skipped += 1
            self.run.recent.append(bad[position])
            log.warning("skipped unreadable image %s (%s)", bad[position].path, bad[position].reason)
            if self.consecutive >= self.max_consecutive:
                self.run.fail(f"{self.consecutive} unreadable images in a row")
        self.run.check_on_this_rank()

    def record_skip(self, skipped: Skipped) -> None:
        """A sample already counted as read that turned out unreadable later, on the device (device_decode:
        the workers only read its header): counted as the workers' skips are."""
        self.skipped += 1
        self.run.skipped += 1
        self.pass_skipped += 1
        self.run.recent.append(skipped)
        log.warning("skipped unreadable image %s (%s)", skipped.path, skipped.reason)
        self.run.check_on_this_rank()

    def end_pass(self) -> None:
        # No check of its own: record() judged these same counts after the pass's last batch, under the
        # same minimum; the judgement over all ranks follows in skipped_last_pass.
        self.last_pass_skipped, self.pass_skipped = self.pass_skipped, 0


def join_run_tally(split: Any, max_fraction: float, size: int) -> RunTally:
    """The RunTally that a loader over `size` images built for `split` reports to. The loaders of one run
    are built before any of them reads (the task's build_loaders: train, then val) and share the tally, which
    lives on the Split (`Split.bad_files`) because the Split is what they have in common. A loader built
    once reading has begun starts a new run: a second `train()` on the same Split counts from zero.
    Without a Split (`split=None`) the loader counts alone."""
    run = getattr(split, "bad_files", None)
    if run is None or run.reading:
        run = RunTally(max_fraction)
        if split is not None:
            split.bad_files = run
    run.population += size
    return run


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
        self.tally.run.reading = True
        for batch in self.loader:
            if isinstance(batch, Batch):
                self.tally.record(batch)
                if batch.size == len(batch.skipped):
                    continue
            yield batch
        self.tally.end_pass()


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def reduce_counts(counts: list[int], device: torch.device | None = None) -> list[int]:
    """Sum counts over ranks when torch.distributed is initialized (else return them), in one all-reduce. A
    collective: every rank must call it at the same point. The tensor lives on `device` (NCCL needs CUDA
    tensors)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return list(counts)
    total = torch.tensor(counts, dtype=torch.long, device=device)
    dist.all_reduce(total)
    return total.tolist()


def reduce_count(count: int, device: torch.device | None = None) -> int:
    """`reduce_counts` for one count."""
    return reduce_counts([count], device)[0]


def skipped_last_pass(batches: Any, device: torch.device | None = None) -> int:
    """Unreadable images skipped in the last pass over `batches` (DeviceBatches / Prefetcher / a loader),
    summed over workers and ranks; 0 for data that cannot be unreadable (in-memory tensors).

    A collective (the loop calls it on every rank after every pass), so it also judges the bad-file
    fraction over all ranks: the run's counts ride in the same all-reduce, every rank sees the same sums
    and raises BadFileError together, or none does."""
    tally = getattr(batches, "tally", None) or getattr(getattr(batches, "loader", None), "tally", None)
    counts = [tally.last_pass_skipped, tally.run.seen, tally.run.skipped] if tally is not None else [0, 0, 0]
    last_pass, seen, skipped = reduce_counts(counts, device)
    if tally is not None:
        tally.run.check_fraction(seen, skipped, "" if world_size() == 1 else " on all ranks")
    return last_pass
