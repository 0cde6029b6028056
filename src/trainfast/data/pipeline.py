"""The built-in run's batches: a loader over a dataset (data/loader.py), its batches moved to the device
(data/device.py: non_blocking copies, the prefetcher, normalization of uint8 images on the device). One
function for training, evaluation and `trainfast bench-data`, so the pipeline measured is the one that trains.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from ..recipe import Recipe
from ..techniques.device_decode import decode_on_device
from .datasets import Split
from .device import build_device_batches
from .encoded import encode_on_workers
from .imagefolder import ImageFiles
from .loader import build_loader


def build_batches(dataset: Dataset, split: Split, recipe: Recipe, device: torch.device, train: bool,
                  sampler=None, rank: int = 0):
    """A built-in loader for `dataset`, its batches on the device (prefetched with recipe.prefetch). With
    device_decode on CUDA an image folder's workers send bytes and crops, and the device decodes them."""
    if decode_on_device(recipe, device) and isinstance(dataset, ImageFiles):
        dataset = encode_on_workers(dataset)
    loader = build_loader(dataset, recipe, device, train, split, sampler=sampler, rank=rank)
    return build_device_batches(loader, recipe, device, split.mean, split.std)


def build_loaders(split: Split, recipe: Recipe, device: torch.device, dist) -> tuple[Any, Any]:
    """The run's training and evaluation batches, on this rank's shards (plain loaders in one process).
    `dist`: the run's distributed.Dist (its samplers)."""
    train_batches = build_batches(split.train, split, recipe, device, train=True,
                                  sampler=dist.train_sampler(split.train, recipe.seed), rank=dist.rank)
    val_batches = build_batches(split.val, split, recipe, device, train=False,
                                sampler=dist.val_sampler(split.val), rank=dist.rank)
    return train_batches, val_batches
