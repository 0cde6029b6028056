"""`--data imagefolder:PATH`: class subfolders of images, decoded with libjpeg-turbo (torchvision.io)
straight to uint8 tensors. PATH/train and PATH/val are used when present; otherwise a fixed 20% of
PATH is held out. Problems with the folder are reported before any training starts.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from .datasets import IMAGE_EXTENSIONS, DataError, Split, _split_indices


def scan_folder(root: Path) -> tuple[list[tuple[Path, int]], list[str]]:
    if not root.is_dir():
        raise DataError(f"--data imagefolder:{root}: folder does not exist")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"--data imagefolder:{root}: no class subfolders (expected {root}/<class>/<image>)")
    samples, others = [], []
    for index, name in enumerate(classes):
        for path in sorted((root / name).rglob("*")):
            if path.is_file():
                (samples if path.suffix.lower() in IMAGE_EXTENSIONS else others).append((path, index))
    if others:
        listed = ", ".join(str(p) for p, _ in others[:3])
        raise DataError(f"--data imagefolder:{root}: {len(others)} non-image file(s), e.g. {listed}")
    if not samples:
        raise DataError(f"--data imagefolder:{root}: class folders {classes[:5]} contain no images")
    return samples, classes


class ImageFiles(Dataset):
    """Decodes one file per item to a uint8 [3, S, S] tensor (short side resized to S, centre crop)."""

    def __init__(self, samples: list[tuple[Path, int]], image_size: int) -> None:
        self.samples = samples
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        from torchvision.io import ImageReadMode, decode_image, read_file
        from torchvision.transforms.v2 import functional as TF

        path, label = self.samples[index]
        try:
            image = decode_image(read_file(str(path)), mode=ImageReadMode.RGB)
        except RuntimeError as exc:
            raise DataError(f"cannot decode image {path}: {exc}") from exc
        image = TF.resize(image, self.image_size, antialias=True)
        return TF.center_crop(image, self.image_size), label


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
    return Split(ImageFiles(train_samples, image_size), ImageFiles(val_samples, image_size), len(classes),
                 (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), image_size, f"imagefolder:{root}")
