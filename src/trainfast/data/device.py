"""Batches on the device: the transfer (plain, or the prefetcher's side stream) and what happens to a batch
once it is there. The built-in loaders (trainer.build_batches) and the loaders a user hands to
`Session.setup` both come through here, so both get the same transfer and the same normalization.

Normalization contract (the same on both paths): with mean/std, the dataset yields uint8 images as the
first element of each sample, `(image, target, ...)`. Without `prefetch` they are normalized on the host,
per sample (data.datasets.HostNormalized, in the workers); with it they travel as uint8 and the first
element of each batch is normalized here, on the device. Every 4-D floating tensor of a batch then takes
the recipe's memory format (channels_last)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Iterable

import torch

from ..errors import DataError
from ..techniques.memory_format import memory_format
from ..techniques.prefetch import HostBuffers, Prefetcher
from ..techniques.transfer import DeviceBatches, Prepare, map_tensors
from .datasets import normalize, stats_tensors
from .device_decode import DeviceDecoder, is_encoded
from .encoded import encodes


def build_prepare(recipe, device: torch.device, mean=None, std=None, decoder: DeviceDecoder | None = None) -> Prepare:
    """`decoder`: where batches arrive encoded (device_decode), it decodes them here first; their uint8 images
    are then normalized here whatever `prefetch` says (the workers did not)."""
    fmt = memory_format(recipe.channels_last)

    def lay_out(batch: Any) -> Any:
        return map_tensors(lambda t: t.contiguous(memory_format=fmt) if t.ndim == 4 and t.is_floating_point() else t,
                           batch)

    normalizing = mean is not None and (recipe.prefetch or decoder is not None)
    if not normalizing:
        return (lambda batch: lay_out(decoder(batch) if is_encoded(batch) else batch)) if decoder else lay_out
    mean_t, std_t = stats_tensors(mean, std, device=device)
    buffers = HostBuffers(device)     # CPU: recycled output buffers; CUDA: the caching allocator's

    def normalize_images(images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8:
            raise DataError(f"mean/std were given, so the images (first element of each batch) must be uint8; got "
                            f"{images.dtype}. Drop mean/std if the dataset normalizes its images itself.")
        return normalize(images, mean_t, std_t, out=buffers.take(images.shape))

    def prepare(batch: Any) -> Any:
        if decoder is not None and is_encoded(batch):
            batch = decoder(batch)
        elif not recipe.prefetch:       # the workers normalized it (data.datasets.HostNormalized)
            return lay_out(batch)
        return lay_out(apply_to_images(normalize_images, batch))

    return prepare


def apply_to_images(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """`fn` on the images of an `(images, ...)` batch, or on a bare tensor batch."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, (tuple, list)) and not isinstance(batch, Mapping) and batch:
        return (fn(batch[0]), *batch[1:])
    raise DataError(f"mean/std were given but a batch is a {type(batch).__name__}: trainfast normalizes the first "
                    f"element of (images, ...) batches only; normalize in the dataset instead")


def build_device_batches(loader: Iterable, recipe, device: torch.device, mean=None, std=None) -> Iterable:
    """The prefetcher (side-stream copy on CUDA, normalization on the device) or the plain per-batch copy.
    A loader whose dataset hands out encoded images (data/encoded.py) gets its batches decoded here, on the
    device; the batches object keeps the decoder (`.decoder`: its count of host-decoded files)."""
    decoder = DeviceDecoder(device, getattr(loader, "tally", None)) if encodes(getattr(loader, "dataset", None)) \
        else None
    prepare = build_prepare(recipe, device, mean, std, decoder)
    if recipe.prefetch:
        batches = Prefetcher(loader, device, prepare)
    else:
        batches = DeviceBatches(loader, device, prepare, non_blocking=recipe.non_blocking)
    batches.decoder = decoder
    return batches
