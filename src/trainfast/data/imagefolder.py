"""`--data imagefolder:PATH`: class subfolders of images, decoded straight to uint8 tensors.

The fast path, per sample in the workers: read the file's bytes -> libjpeg-turbo decode
(torchvision.io.decode_image; PNG/GIF/WebP through their torchvision decoders, BMP through PIL) ->
uint8 RandomResizedCrop + horizontal flip (train) or resize + centre crop (val), on uint8 tensors
(torchvision's native uint8 antialiased resize). Images stay uint8 through collate and the worker
queue (4x fewer bytes than float32); float conversion and normalization happen on the device in the
prefetcher, or on the host in the plain baseline (`HostNormalized`), with the same arithmetic.

Reduced-size (DCT-domain) decoding is not used: torchvision.io does not expose it, and at ImageNet-like
sizes (~500x375) it would rarely apply anyway: halving the decode needs a crop side >= 2x the output
(448 px for 224), which RandomResizedCrop on a 500x375 photo almost never draws.

PATH/train and PATH/val are used when both exist; otherwise a fixed 20% of PATH is held out. Folder
problems (missing folder, no class subfolders, a class without images, a non-image file) are errors
before any training starts; a file that fails to decode during training is skipped and counted
(see badfiles.py).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch.utils.data import Dataset

from .datasets import IMAGE_EXTENSIONS, DataError, Skipped, Split, _split_indices

TORCHVISION_DECODES = (".jpg", ".jpeg", ".png", ".gif", ".webp")   # the rest of IMAGE_EXTENSIONS via PIL
VAL_RESIZE_RATIO = 0.875      # val: resize the short side to size / 0.875 (256 for 224), centre crop size


def scan_folder(root: Path) -> tuple[list[tuple[Path, int]], list[str]]:
    """(path, class index) for every image under root/<class>/, checked before any training starts.
    Hidden files (.DS_Store, ._foo.jpg) are ignored; any other non-image file is an error."""
    if not root.is_dir():
        raise DataError(f"--data imagefolder:{root}: folder does not exist")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"--data imagefolder:{root}: no class subfolders (expected {root}/<class>/<image>)")
    samples, others, empty = [], [], []
    for index, name in enumerate(classes):
        found = 0
        for path in sorted((root / name).rglob("*")):
            if not path.is_file() or any(part.startswith(".") for part in path.relative_to(root).parts):
                continue
            if path.suffix.lower() in IMAGE_EXTENSIONS:
                samples.append((path, index))
                found += 1
            else:
                others.append(path)
        if not found:
            empty.append(name)
    if others:
        listed = ", ".join(str(p) for p in others[:3])
        raise DataError(f"--data imagefolder:{root}: {len(others)} non-image file(s), e.g. {listed} "
                        f"(images are {', '.join(IMAGE_EXTENSIONS)})")
    if not samples:
        raise DataError(f"--data imagefolder:{root}: class folders {classes[:5]} contain no images")
    if empty:
        raise DataError(f"--data imagefolder:{root}: class folder(s) without images: {', '.join(empty[:5])}")
    return samples, classes


def decode_file(path: Path) -> torch.Tensor:
    """uint8 [3, H, W] RGB (grayscale and CMYK JPEGs converted). Raises on a corrupt or truncated file."""
    if path.suffix.lower() in TORCHVISION_DECODES:
        from torchvision.io import ImageReadMode, decode_image, read_file

        return decode_image(read_file(str(path)), mode=ImageReadMode.RGB)
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        return torch.from_numpy(np.asarray(image.convert("RGB"))).permute(2, 0, 1)


class TrainCrop:
    """RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) + horizontal flip with p=0.5, on uint8
    tensors: torchvision's crop-parameter sampler and functional kernels, called directly (the v2
    transform objects add ~0.25 ms of dispatch per image, a fifth of the decode). Draws from the worker's
    torch RNG, which the loader seeds per (rank, worker, epoch)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms import RandomResizedCrop
        from torchvision.transforms.v2 import functional as TF

        top, left, height, width = RandomResizedCrop.get_params(image, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        image = TF.resized_crop(image, top, left, height, width, [self.size, self.size], antialias=True)
        return image.flip(-1) if torch.rand(1).item() < 0.5 else image


class ValCrop:
    """Resize the short side to size / 0.875 (256 for 224), then centre-crop size x size, on uint8."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        image = TF.resize(image, round(self.size / VAL_RESIZE_RATIO), antialias=True)
        return TF.center_crop(image, self.size)


def describe_error(exc: Exception) -> str:
    """The decoder's message without torchvision's C++ source location ("decode_jpeg, .../x.cpp:171, ")."""
    return re.sub(r"\S+\.cpp:\d+,?\s*", "", str(exc)).strip()[:160]


def build_transform(image_size: int, train: bool):
    """uint8 in, uint8 out: the crop picks and resamples pixels, it never converts them to float."""
    return TrainCrop(image_size) if train else ValCrop(image_size)


class ImageFiles(Dataset):
    """One file per item -> (uint8 [3, S, S], label), or `Skipped` when the file cannot be decoded."""

    def __init__(self, samples: list[tuple[Path, int]], image_size: int, train: bool = False) -> None:
        self.samples = samples
        self.image_size = image_size
        self.train = train
        self.transform = build_transform(image_size, train)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        try:
            image = decode_file(path)
        except (RuntimeError, OSError, ValueError) as exc:    # torchvision: RuntimeError; PIL: OSError/ValueError
            return Skipped(str(path), f"{type(exc).__name__}: {describe_error(exc)}")
        return self.transform(image), label


def load_imagefolder(path: str, image_size: int = 224) -> Split:
    root = Path(path)
    if (root / "train").is_dir() and (root / "val").is_dir():
        train_samples, classes = scan_folder(root / "train")
        val_samples, val_classes = scan_folder(root / "val")
        if val_classes != classes:
            raise DataError(f"--data imagefolder:{root}: train/ and val/ have different class folders")
    else:
        samples, classes = scan_folder(root)
        train_idx, val_idx = _split_indices(len(samples), 0.2)
        train_samples = [samples[i] for i in train_idx.tolist()]
        val_samples = [samples[i] for i in val_idx.tolist()]
    # ImageNet statistics: computing them would mean decoding the whole folder before training.
    return Split(ImageFiles(train_samples, image_size, train=True), ImageFiles(val_samples, image_size),
                 len(classes), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), image_size, f"imagefolder:{root}")
