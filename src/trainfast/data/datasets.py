"""Datasets that yield uint8 CHW images and integer labels.

Every dataset here hands out uint8 tensors: 4x fewer bytes than float32 through worker queues and
host->device copies. Conversion to float and normalization happen either on the host (the plain
torchvision-style baseline, `HostNormalized`) or on the device (the prefetcher): the same arithmetic in
the same order, so both paths give the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..errors import DataError  # re-exported: callers that import it from here keep working

# torchvision's ImageFolder list (so a folder it reads, this reads) plus GIF; Pillow decodes what TorchCodec does not
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


@dataclass(frozen=True)
class Skipped:
    """What a dataset returns instead of a sample it cannot read (a corrupt or truncated file): the
    collate function drops it and the loader counts it (data/badfiles.py)."""
    path: str
    reason: str


@dataclass
class Split:
    train: Dataset
    val: Dataset
    num_classes: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    image_size: int
    name: str
    # The bad-file RunTally that the train and val loaders of the current run share (badfiles.py's
    # join_run_tally sets it): the fraction of unreadable files is judged over the run, not per split.
    bad_files: Any = field(default=None, repr=False, compare=False)


class TensorImages(Dataset):
    """In-memory uint8 images [N, C, H, W] with int64 labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise DataError(f"expected uint8 [N, C, H, W] images, got {images.dtype} {tuple(images.shape)}")
        self.images = images
        self.labels = labels.long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 -> float32 (x / 255 - mean) / std, the single definition both paths use, computed as
    x * (1 / (255 std)) - mean / std: two passes over the batch instead of four (within 5e-7 of the
    four-op form). `out`: a float32 buffer of the same shape to write into (a recycled one skips the
    page faults of a fresh allocation, see techniques/prefetch.HostBuffers)."""
    out = images.float() if out is None else out.copy_(images)
    return torch.addcmul(-mean / std, out, 1.0 / (255.0 * std), out=out)


def stats_tensors(mean, std, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (-1, 1, 1)
    return (torch.tensor(mean, device=device).view(shape), torch.tensor(std, device=device).view(shape))


class HostNormalized(Dataset):
    """The plain baseline: float conversion and normalization on the host, per sample (in workers)."""

    def __init__(self, base: Dataset, mean, std) -> None:
        self.base = base
        self.mean, self.std = stats_tensors(mean, std)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        item = self.base[index]
        if isinstance(item, Skipped):
            return item
        image, *rest = item       # (image, label) here; (image, target, ...) from a user's dataset
        return (normalize(image, self.mean, self.std), *rest)


def _channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    x = images.double().div(255.0)
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-3)
    return tuple(round(float(v), 6) for v in mean), tuple(round(float(v), 6) for v in std)


def split_indices(n: int, val_fraction: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    # A fixed split (its own generator, independent of the run's seed): every rung and every seed is
    # scored on the same held-out images.
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(round(n * val_fraction)))
    return perm[n_val:], perm[:n_val]


def _in_memory_split(images: torch.Tensor, labels: torch.Tensor, num_classes: int, name: str) -> Split:
    train_idx, val_idx = split_indices(len(labels), 0.2)
    mean, std = _channel_stats(images[train_idx])
    return Split(TensorImages(images[train_idx], labels[train_idx]), TensorImages(images[val_idx], labels[val_idx]),
                 num_classes, mean, std, images.shape[-1], name)


DIGITS_SIZE = 16


def load_digits(image_size: int = DIGITS_SIZE) -> Split:
    """scikit-learn's handwritten digits: 1,797 real 8x8 scans shipped inside the wheel (no download),
    upscaled bilinearly to image_size and repeated to 3 channels so any ImageNet-style model accepts them.
    The default, 16 px, is twice the scans' resolution: resnet9 reaches the same accuracy as at 32 px
    (0.95 after one epoch) at a third of the step time: the default ablation on a 2-core CPU without a
    fast half type (fp32 only) went from 5 minutes to about 2 (README gives the measured range)."""
    from sklearn.datasets import load_digits as sk_load_digits

    digits = sk_load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    images = (x.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    return _in_memory_split(images, torch.tensor(digits.target), 10, "digits")


def load_synthetic(image_size: int = 32, n: int = 2048, num_classes: int = 10, seed: int = 0) -> Split:
    """Random images whose class sets a learnable colour/brightness pattern: for speed runs, not accuracy."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    prototypes = torch.rand(num_classes, 3, 1, 1, generator=g) * 160 + 40
    noise = torch.randn(n, 3, image_size, image_size, generator=g) * 40
    images = (prototypes[labels] + noise).clamp(0, 255).to(torch.uint8)
    return _in_memory_split(images, labels, num_classes, "synthetic")


def load_cifar10(root: str | Path) -> Split:
    """A local torchvision CIFAR-10 folder (cifar-10-batches-py inside root); never downloaded."""
    from torchvision.datasets import CIFAR10

    root = Path(root)
    if not root.is_dir():
        raise DataError(f"--data cifar10:{root}: folder does not exist")
    try:
        train = CIFAR10(str(root), train=True, download=False)
        val = CIFAR10(str(root), train=False, download=False)
    except RuntimeError as exc:
        raise DataError(f"--data cifar10:{root}: no CIFAR-10 python batches found there ({exc})") from exc

    def to_tensors(ds):
        return torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous(), torch.tensor(ds.targets)

    (xt, yt), (xv, yv) = to_tensors(train), to_tensors(val)
    mean, std = _channel_stats(xt)
    return Split(TensorImages(xt, yt), TensorImages(xv, yv), 10, mean, std, 32, "cifar10")
