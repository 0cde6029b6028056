"""`--data SPEC` -> a Split: the built-in datasets by name, an image folder or CIFAR-10 by path."""
from __future__ import annotations

from ..dataspecs import parse_data_spec
from .datasets import DIGITS_SIZE, Split, load_cifar10, load_digits, load_synthetic
from .imagefolder import load_imagefolder


def load_data(spec: str = "digits", image_size: int | None = None) -> Split:
    kind, arg = parse_data_spec(spec)
    if kind == "digits":
        return load_digits(image_size or DIGITS_SIZE)
    if kind == "synthetic":
        return load_synthetic(image_size or 32)
    if kind == "cifar10":
        return load_cifar10(arg)
    return load_imagefolder(arg, image_size or 224)
