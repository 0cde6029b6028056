"""Loader building and seeding. Every (rank, worker) pair gets its own RNG stream that changes every
epoch and repeats across runs with the same seed; python, numpy and torch are all seeded."""
from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler

from ..techniques.transfer import pin_memory_for
from .datasets import HostNormalized, Split
from .sampler import ResumableBatchSampler


def seed_worker(worker_id: int) -> None:
    # torch already seeds each worker with base_seed + worker_id, where base_seed is drawn from the
    # loader's generator every epoch (so it differs per epoch and per rank via the generator's seed).
    # Python's and numpy's RNGs are not seeded by torch: derive them from the same value.
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def loader_generator(seed: int, rank: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed + 1_000_003 * rank)


def build_loader(dataset: Dataset, recipe, device: torch.device, train: bool, split: Split,
                 sampler: Sampler | None = None, rank: int = 0) -> DataLoader:
    """The plain path normalizes on the host, per sample (torchvision's default); with `prefetch` the
    dataset's uint8 images travel as they are and the prefetcher normalizes on the device."""
    if not recipe.prefetch:
        dataset = HostNormalized(dataset, split.mean, split.std)
    workers = recipe.num_workers
    generator = loader_generator(recipe.seed, rank)
    batching = {"batch_size": recipe.batch_size, "sampler": sampler, "drop_last": False}
    if train:
        # Training drops the last partial batch: static shapes, so compile and cudnn.benchmark never
        # recompile or re-tune for a one-off shape. Evaluation sees every sample. RandomSampler on the
        # loader's generator is exactly what shuffle=True builds; the wrapper makes it resumable mid-epoch.
        order = sampler if sampler is not None else RandomSampler(dataset, generator=generator)
        persistent = bool(workers and recipe.persistent_workers)
        batching = {"batch_sampler": ResumableBatchSampler(order, recipe.batch_size, True, generator, persistent)}
    return DataLoader(
        dataset,
        **batching,
        num_workers=workers,
        pin_memory=pin_memory_for(recipe, device),
        persistent_workers=recipe.persistent_workers if workers else False,
        prefetch_factor=recipe.prefetch_factor if workers else None,
        worker_init_fn=seed_worker if workers else None,
        generator=generator,
    )
