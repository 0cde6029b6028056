"""Detection batches: lists of images of different sizes, aspect-ratio grouping, and what padding costs.

A detection batch is (list of uint8 images [3, H_i, W_i], list of target dicts): the images cannot be
stacked, the model pads them itself. Faster R-CNN's transform resizes each image (short side to min_size,
long side at most max_size) and pads the batch to its largest height and width, rounded up to a multiple
of 32: a 1:2 image next to a 2:1 one turns both into squares that are half zeros, and the backbone pays
for every zero. Grouping batches by aspect ratio (torchvision references' --aspect-ratio-group-factor,
detectron2's AspectRatioGroupedDataset) keeps the canvases close to the images. SSD resizes every image
to a fixed 320x320, so it pads nothing and grouping has no effect on it (padding_fraction says so: 0).

GroupedBatchSampler differs from torchvision's on purpose: it never repeats a sample to fill a group's
last batch (every index is visited exactly once per epoch, so an epoch is an epoch and the metrics
count every image once); each group's remainder is one smaller batch at the end of the epoch.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from ..data.badfiles import BadFileTally, Batch, GuardedLoader, join_run_tally
from ..data.datasets import Skipped
from ..data.sampler import DealtBatches
from ..techniques.transfer import no_arrival

SIZE_DIVISIBLE = 32      # GeneralizedRCNNTransform's default padding multiple


def collate_detection(samples: list[Any]) -> Batch:
    """(list of images, list of targets) of the readable samples, as badfiles.Batch: the unreadable ones
    (`Skipped`) are dropped and remembered, so GuardedLoader counts them as it does for classification."""
    skipped = tuple((i, s) for i, s in enumerate(samples) if isinstance(s, Skipped))
    good = [s for s in samples if not isinstance(s, Skipped)]
    images = [image for image, _ in good] if good else None
    targets = [target for _, target in good] if good else None
    return Batch(images, targets, len(samples), skipped)


def images_to_device(images: Sequence[torch.Tensor], device: torch.device | str,
                     non_blocking: bool = False) -> list[torch.Tensor]:
    """uint8 images -> float32 in [0, 1] on the device (the detectors normalize with their own mean/std).
    Copied as uint8, converted there: 4x fewer bytes over the host-device link."""
    return [image.to(device, non_blocking=non_blocking).float().div_(255.0) for image in images]


def targets_to_device(targets: Sequence[dict], device: torch.device | str, non_blocking: bool = False) -> list[dict]:
    return [{k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v for k, v in t.items()}
            for t in targets]


class DetectionDeviceBatches:
    """The detection twin of techniques.transfer.DeviceBatches: each (images, targets) batch of a loader, its
    images as float in [0, 1] and its targets on the device. The prefetcher does not apply: it copies stacked
    tensors into recycled buffers of one shape, and these are lists of images of different sizes. `loader`
    stays reachable (bad-file counts, the checkpointer's data order), as on DeviceBatches."""

    on_fetched: Callable[[], None] = staticmethod(no_arrival)     # as on DeviceBatches: the step clock's mark

    def __init__(self, loader: Iterable, device: torch.device | str, non_blocking: bool = False) -> None:
        self.loader, self.device, self.non_blocking = loader, device, non_blocking

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], list[dict]]]:
        for images, targets in self.loader:
            self.on_fetched()
            yield (images_to_device(images, self.device, self.non_blocking),
                   targets_to_device(targets, self.device, self.non_blocking))


def aspect_ratio_groups(sizes: Sequence[tuple[int, int]], group_factor: int = 3) -> list[int]:
    """A group id per (height, width): log2(width / height) cut into bins of 1/group_factor between 1:2
    and 2:1 (ratios beyond fall into the two end bins). group_factor=3 gives 8 groups, the resolution of
    torchvision's default; group_factor=0 puts everything in one group (no grouping)."""
    if group_factor < 0:
        raise ValueError(f"aspect-ratio group factor must be >= 0, got {group_factor}")
    groups = []
    for height, width in sizes:
        if height <= 0 or width <= 0:
            raise ValueError(f"image size must be positive, got height={height} width={width}")
        position = math.floor(max(-1.0, min(1.0, math.log2(width / height))) * group_factor)
        groups.append(max(position, -group_factor) + group_factor)   # 0 .. 2 * group_factor
    return groups


class GroupedBatchSampler(DealtBatches):
    """Batches of `batch_size` indices whose images share an aspect-ratio group (see aspect_ratio_groups).

    Per epoch: a permutation drawn from (seed, epoch) is walked in order; each index joins its group's
    open batch, which is yielded when full. The groups' remainders follow, one partial batch per group (or
    are dropped with drop_last). Call `set_epoch(epoch)` before each epoch, as with DistributedSampler:
    the same (seed, epoch) gives the same batches on every run. shuffle=False walks 0..N-1 (evaluation).

    Under DDP the batches are dealt whole to the ranks, and a mid-epoch resume skips what it trained on
    (data/sampler.py: DealtBatches).
    """

    def __init__(self, sizes: Sequence[tuple[int, int]], batch_size: int, group_factor: int = 3, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False, num_replicas: int = 1, rank: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        super().__init__(seed, num_replicas, rank)
        self.groups = aspect_ratio_groups(sizes, group_factor)
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last

    def total_batches(self) -> int:
        """Batches per epoch over all ranks, before the repeats that even out the ranks."""
        counts = np.bincount(self.groups) if self.groups else np.zeros(0, dtype=int)
        rounding = (lambda n: n // self.batch_size) if self.drop_last else (lambda n: -(-n // self.batch_size))
        return int(sum(rounding(int(n)) for n in counts))

    def all_batches(self) -> Iterator[list[int]]:
        """This epoch's batches over all ranks, in order."""
        n = len(self.groups)
        order = np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle else np.arange(n)
        open_batches: dict[int, list[int]] = {}
        for index in order.tolist():
            batch = open_batches.setdefault(self.groups[index], [])
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                open_batches[self.groups[index]] = []
        if not self.drop_last:
            for group in sorted(open_batches):
                if open_batches[group]:
                    yield open_batches[group]


def resized_size(height: int, width: int, min_size: int, max_size: int) -> tuple[int, int]:
    """The size GeneralizedRCNNTransform resizes an image to: short side to min_size unless the long side
    would pass max_size (then long side to max_size); sizes floored as torch's interpolate does."""
    scale = min(min_size / min(height, width), max_size / max(height, width))
    return int(math.floor(height * scale)), int(math.floor(width * scale))


def padding_fraction(batches: Iterable[Sequence[int]], sizes: Sequence[tuple[int, int]],
                     resize: tuple[int, int] | None = None, size_divisible: int = SIZE_DIVISIBLE) -> float:
    """The share of the padded batch canvases that is padding, over all `batches` (lists of indices into
    `sizes`, (height, width) per image): 1 - sum of image areas / sum of canvas areas, a canvas being
    len(batch) x max height x max width rounded up to `size_divisible`. `resize=(min_size, max_size)`
    applies Faster R-CNN's resize first (what the backbone really sees). 0.0 for no batches."""
    image_area = canvas_area = 0
    for batch in batches:
        shapes = [sizes[i] if resize is None else resized_size(*sizes[i], *resize) for i in batch]
        if not shapes:
            continue
        height = -(-max(h for h, _ in shapes) // size_divisible) * size_divisible
        width = -(-max(w for _, w in shapes) // size_divisible) * size_divisible
        canvas_area += len(shapes) * height * width
        image_area += sum(h * w for h, w in shapes)
    return 1.0 - image_area / canvas_area if canvas_area else 0.0


def random_batches(n: int, batch_size: int, seed: int = 0, epoch: int = 0) -> list[list[int]]:
    """Plain shuffled batches (what DataLoader(shuffle=True) gives), drawn like GroupedBatchSampler's
    permutation: the baseline that padding_fraction compares grouping with."""
    order = np.random.default_rng([seed, epoch]).permutation(n).tolist()
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def build_detection_loader(dataset, split, recipe, device: torch.device, dist, train: bool,
                           workers: int | None = None) -> GuardedLoader:
    """A built-in loader of (list of uint8 images, list of targets) batches, behind the bad-file guard.
    Training: shuffled batches (the loader's seeded generator, resumable mid-epoch) or, with
    recipe.group_aspect_ratio, GroupedBatchSampler's, dealt whole to the ranks and re-drawn every epoch
    (registered with `dist` for set_epoch, as a DistributedSampler is). Either way one rank visits every
    training image exactly once per epoch: the last partial batch is kept, since detection batches change
    shape every step anyway. Evaluation: every image, this rank's shard."""
    from ..data.loader import make_loader

    sampler = batch_sampler = None
    if train and recipe.group_aspect_ratio:
        batch_sampler = GroupedBatchSampler(dataset.sizes, recipe.batch_size, seed=recipe.seed,
                                            num_replicas=dist.world_size, rank=dist.rank)
        dist.samplers.append(batch_sampler)
    elif train:
        sampler = dist.train_sampler(dataset, recipe.seed)
    else:
        sampler = dist.val_sampler(dataset)
    loader = make_loader(dataset, recipe, device, train, sampler, dist.rank, workers, collate_fn=collate_detection,
                         batch_sampler=batch_sampler, drop_last=False)
    return GuardedLoader(loader, BadFileTally(run=join_run_tally(split, recipe.max_bad_fraction, len(dataset))))
