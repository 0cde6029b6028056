"""`--data SPEC` -> a Split: the built-in datasets by name, an image folder or CIFAR-10 by path."""
from __future__ import annotations

from ..errors import DataError
from .datasets import DIGITS_SIZE, Split, load_cifar10, load_digits, load_synthetic
from .imagefolder import load_imagefolder


def parse_data_spec(spec: str) -> tuple[str, str | None]:
    kind, _, arg = spec.partition(":")
    kinds = ("digits", "synthetic", "imagefolder", "cifar10")
    if kind not in kinds:
        raise DataError(f"--data {spec!r}: unknown dataset {kind!r}; choose digits, synthetic, "
                        "imagefolder:PATH or cifar10:PATH")
    if kind in ("imagefolder", "cifar10") and not arg:
        raise DataError(f"--data {spec!r}: {kind} needs a path, e.g. {kind}:/data/{kind}")
    if kind in ("digits", "synthetic") and arg:
        raise DataError(f"--data {spec!r}: {kind} takes no path")
    return kind, arg or None


def load_data(spec: str = "digits", image_size: int | None = None) -> Split:
    kind, arg = parse_data_spec(spec)
    if kind == "digits":
        return load_digits(image_size or DIGITS_SIZE)
    if kind == "synthetic":
        return load_synthetic(image_size or 32)
    if kind == "cifar10":
        return load_cifar10(arg)
    return load_imagefolder(arg, image_size or 224)
