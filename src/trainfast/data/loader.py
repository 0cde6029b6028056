"""Loader building and seeding.

Seeding: every (rank, worker) pair gets its own RNG stream that changes every epoch and repeats across
runs with the same seed. The loader's generator is seeded with (seed, rank); at the start of every epoch
(every new iterator) the DataLoader draws a fresh base_seed from it and seeds worker w with base_seed + w
(torch, python `random`, numpy). With persistent workers the workers are not re-seeded: their streams
simply continue into the next epoch, which is just as different and just as repeatable.

`num_workers="auto"`: a short measurement (a few batches at each candidate worker count, a few seconds in
all) instead of a rule of thumb; see `choose_num_workers`.
"""
from __future__ import annotations

import logging
import math
import random
import time
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler

from ..defaults import usable_cpus
from ..techniques.transfer import pin_memory_for, tensors_in
from .badfiles import BadFileTally, GuardedLoader, collate_skipping, join_run_tally, world_size
from .datasets import HostNormalized, Split
from .encoded import encodes
from .sampler import ResumableBatchSampler

log = logging.getLogger("trainfast.data")

AUTO_MAX_WORKERS = 8        # candidates: 0, 1, 2, 4, 8, capped at the CPUs this process may use
AUTO_TIMED_BATCHES = 4      # timed per candidate, after each worker has delivered its first batch
AUTO_BUDGET_S = 20.0        # stop trying larger counts once the measurement has taken this long
AUTO_MIN_GAIN = 1.10        # more workers must be >= 10% faster to win: each costs memory and a core


def seed_worker(worker_id: int) -> None:
    # torch seeds each worker's torch and python RNGs with base_seed + worker_id and numpy from
    # (base_seed, worker_id). Re-seed python and numpy here from the full 64-bit torch seed, explicitly,
    # so the guarantee does not rest on DataLoader internals.
    seed = torch.initial_seed()
    random.seed(seed)
    np.random.seed(np.random.SeedSequence(seed).generate_state(4))


def loader_generator(seed: int, rank: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed + 1_000_003 * rank)


def loader_dataset(dataset: Dataset, recipe, split: Split) -> Dataset:
    """The plain path normalizes on the host, per sample (torchvision's default); with `prefetch` the
    dataset's uint8 images travel as they are and the prefetcher normalizes on the device."""
    # A dataset that hands out encoded images (device_decode) is normalized on the device after decoding.
    return dataset if recipe.prefetch or encodes(dataset) else HostNormalized(dataset, split.mean, split.std)


def make_loader(dataset: Dataset, recipe, device: torch.device, train: bool, sampler: Sampler | None = None,
                rank: int = 0, workers: int | None = None, collate_fn: Callable = collate_skipping,
                batch_sampler: Sampler | None = None, drop_last: bool = True) -> DataLoader:
    """`batch_sampler` (training only) replaces the shuffled batches, e.g. detection's aspect-ratio groups;
    `drop_last=False` keeps the last partial training batch (detection: its shapes change every batch anyway)."""
    workers = recipe.num_workers if workers is None else workers
    generator = loader_generator(recipe.seed, rank)
    batching = {"batch_size": recipe.batch_size, "sampler": sampler, "drop_last": False}
    if train:
        # Training drops the last partial batch: static shapes, so compile and cudnn.benchmark never
        # recompile or re-tune for a one-off shape. Evaluation sees every sample. RandomSampler on the
        # loader's generator is exactly what shuffle=True builds; the wrapper makes it resumable mid-epoch.
        order = sampler if sampler is not None else RandomSampler(dataset, generator=generator)
        persistent = bool(workers and recipe.persistent_workers)
        batching = {"batch_sampler": batch_sampler or ResumableBatchSampler(order, recipe.batch_size, drop_last,
                                                                            generator, persistent)}
    return DataLoader(
        dataset,
        **batching,
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory_for(recipe, device),
        persistent_workers=bool(recipe.persistent_workers) and workers > 0,
        prefetch_factor=recipe.prefetch_factor if workers else None,
        worker_init_fn=seed_worker if workers else None,
        generator=generator,
        multiprocessing_context=worker_context() if workers else None,
    )


def worker_context() -> str | None:
    # Fork where the OS has it (the DataLoader default on Linux up to Python 3.13). Processes that were
    # themselves spawned (every ablation rung) would otherwise spawn their workers too: each re-imports
    # torch, seconds per worker and per epoch that would land in the rung's timing.
    import multiprocessing as mp

    return "fork" if "fork" in mp.get_all_start_methods() else None


def build_loader(dataset: Dataset, recipe, device: torch.device, train: bool, split: Split,
                 sampler: Sampler | None = None, rank: int = 0) -> GuardedLoader:
    """A DataLoader wrapped in the unreadable-file guard (badfiles.py); yields (inputs, targets). Loaders
    built for the same `split` before either reads share one run-wide bad-file tally (join_run_tally)."""
    dataset = loader_dataset(dataset, recipe, split)
    workers = recipe.num_workers
    if workers == "auto":
        workers = choose_num_workers(dataset, recipe, device)
    if not train:
        workers = eval_workers(len(sampler) if sampler is not None else len(dataset), recipe.batch_size, workers)
    loader = make_loader(dataset, recipe, device, train, sampler, rank, workers)
    run = join_run_tally(split, recipe.max_bad_fraction, pass_size(loader, dataset, recipe.batch_size))
    return GuardedLoader(loader, BadFileTally(run=run))


def pass_size(loader: DataLoader, dataset: Dataset, batch_size: int) -> int:
    """Images one pass of `loader` reads, over all ranks: the dataset, less the partial last batch a training
    loader drops (every step one shape). The bad-file fraction is exact once a run has read this many, so a
    small folder whose epoch never reaches the whole dataset is still judged in its first epoch."""
    return min(len(dataset), len(loader) * batch_size * world_size())


def eval_workers(samples: int, batch_size: int, workers: int) -> int:
    """Loader workers for an evaluation of `samples`: none when it has no more batches than workers. Then no
    worker has a second batch to prepare while the first is evaluated, so workers buy no overlap, and they
    cost: forked, and kept alive with persistent_workers, after the model and optimizer state exist, they hold
    copy-on-write references to every page of the training process, which the next epoch then copies as it
    writes them (ViT-S/16 at 224, a 32-photo val set, 2 cores: that epoch's first step took 3.7 s, not 1.6;
    the epoch 21.6 s against 17.7 and 16.6 for the ones around it). Read in-process, those batches cost the
    same decode and nothing else."""
    return 0 if workers and math.ceil(samples / max(1, batch_size)) <= workers else workers


def resolve_num_workers(recipe, split: Split, device: torch.device):
    """The recipe with num_workers="auto" replaced by the measured choice (once per run, so the train and
    val loaders share it and the recorded recipe says what ran). Unchanged if num_workers is a number."""
    if recipe.num_workers != "auto":
        return recipe
    return with_workers(recipe, choose_num_workers(loader_dataset(split.train, recipe, split), recipe, device))


def with_workers(recipe, workers: int):
    """The recipe with a measured worker count written out (no workers: nothing to keep or prefetch)."""
    if workers == 0:
        return recipe.replace(num_workers=0, persistent_workers=False, prefetch_factor=None)
    return recipe.replace(num_workers=workers)


def worker_candidates() -> list[int]:
    cpus = usable_cpus()
    return [0] + [n for n in (1, 2, 4, 8) if n <= min(cpus, AUTO_MAX_WORKERS)]


def time_loader(loader: DataLoader, skip: int, timed: int) -> float:
    """Samples/s over `timed` batches after the first `skip` (worker start-up, the first batch of each
    worker arriving together)."""
    iterator = iter(loader)
    try:
        for _ in range(skip):
            next(iterator)
        t0, samples = time.perf_counter(), 0
        for _ in range(timed):
            batch = next(iterator)
            samples += count_samples(batch)
        return samples / max(1e-9, time.perf_counter() - t0)
    finally:
        del iterator     # shuts the candidate's workers down


def count_samples(batch: Any) -> int:
    """Samples in a batch: what the bad-file guard says it asked for, else the first tensor's length."""
    size = getattr(batch, "size", None)          # data.badfiles.Batch (a tensor's .size is a method)
    if isinstance(size, int):
        return size
    tensors = tensors_in(batch)
    return int(tensors[0].shape[0]) if tensors and tensors[0].ndim else 1


def choose_num_workers(dataset: Dataset, recipe, device: torch.device, candidates: list[int] | None = None,
                       budget_s: float = AUTO_BUDGET_S, build: Callable[[int, Sampler], Iterable] | None = None,
                       batch_size: int | None = None, collate_fn: Callable = collate_skipping) -> int:
    """Time a few batches of this dataset (same batch size, transforms and normalization as the run) at
    each candidate worker count and return the fastest; a larger count must win by AUTO_MIN_GAIN.
    Costs a few seconds: (n + 1 + AUTO_TIMED_BATCHES) batches per candidate n, larger counts skipped once
    `budget_s` has passed. The RNGs of this process are restored afterwards, so the run that follows
    draws exactly what it would have drawn with the number written out.
    It times the loader alone: during training the step competes with the workers for the CPU, so on a
    machine with few cores the best count for training can be lower than the one measured here.
    `build(n, sampler)` makes the loader timed with n workers (default: the run's own loader on `dataset`, with
    the task's `collate_fn`; the Session passes a copy of a user's loader, with its batch size and collate
    function)."""
    candidates = candidates or worker_candidates()
    batch_size = batch_size or recipe.batch_size

    def build_own(n: int, sampler: Sampler) -> DataLoader:
        probe = recipe.replace(num_workers=n, persistent_workers=False, prefetch_factor=None)
        return make_loader(dataset, probe, device, True, sampler, collate_fn=collate_fn)

    build = build or build_own
    started = time.perf_counter()
    rates: dict[int, float] = {}
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        for n in candidates:
            needed = (n + 1 + AUTO_TIMED_BATCHES) * batch_size
            sampler = RandomSampler(dataset, replacement=True, num_samples=needed,
                                    generator=torch.Generator().manual_seed(recipe.seed))
            rates[n] = time_loader(build(n, sampler), n + 1, AUTO_TIMED_BATCHES)
            if time.perf_counter() - started > budget_s:
                break
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    best = candidates[0]
    for n, rate in rates.items():
        if rate >= AUTO_MIN_GAIN * rates[best]:
            best = n
    log.info("num_workers=auto: %s samples/s -> %d workers",
             ", ".join(f"{n}: {r:,.0f}" for n, r in rates.items()), best)
    return best
