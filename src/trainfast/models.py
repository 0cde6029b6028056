"""Models by name: any timm model (random init, never downloaded) plus the built-in default.

The default, `resnet9`, is the DAWNBench-style ResNet-9 (Page, 2018) at a quarter of its width: on a
2-core CPU it trains the digits (16 px) to ~95% in one epoch, its convolutions are large enough for bf16
to pay (AVX512-BF16/AMX), and it compiles in under a minute, so the whole ladder takes minutes, not tens.
"""
from __future__ import annotations

import difflib
import sys

import torch
from torch import nn

from .modelnames import ModelError  # it lives where nothing imports torch: the CLI raises it before torch loads

DEFAULT_MODEL = "resnet9"


def _conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn(channels, channels), _conv_bn(channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def resnet9(num_classes: int = 10, widths: tuple[int, int, int, int] = (32, 64, 128, 256),
            in_chans: int = 3) -> nn.Module:
    w0, w1, w2, w3 = widths
    return nn.Sequential(
        _conv_bn(in_chans, w0),
        _conv_bn(w0, w1), nn.MaxPool2d(2), _Residual(w1),
        _conv_bn(w1, w2), nn.MaxPool2d(2),
        _conv_bn(w2, w3), nn.MaxPool2d(2), _Residual(w3),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(w3, num_classes),
    )


BUILTIN = {"resnet9": resnet9}


def check_model_name(name: str) -> None:
    """Refuse an unknown name before any work starts, suggesting close timm names."""
    if name in BUILTIN:
        return
    import timm

    if timm.is_model(name):
        if "." in name and name not in timm.list_pretrained():
            arch = name.split(".")[0]
            tags = timm.list_pretrained(arch + ".*")
            raise ModelError(f"--model {name!r}: timm has no such pretrained tag for {arch}"
                             + (f" (its tags: {', '.join(tags[:6])})" if tags else " (it has none)")
                             + f"; a tag only names weights, never downloaded here: {arch} alone is the same model")
        return
    close = difflib.get_close_matches(name, timm.list_models() + list(BUILTIN), n=4, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models()"
    raise ModelError(f"--model {name!r} is neither a built-in model ({', '.join(BUILTIN)}) nor a timm model{hint}")


def build_model(name: str, num_classes: int, image_size: int | None = None) -> nn.Module:
    """Random weights always: nothing is downloaded at run time."""
    check_model_name(name)
    if name in BUILTIN:
        return BUILTIN[name](num_classes=num_classes)
    import timm

    if "." in name:                                 # timm's "architecture.pretrained_tag"
        print(f"--model {name}: the tag after the dot names pretrained weights, which are never downloaded here: "
              f"{name.split('.')[0]} starts from random weights", file=sys.stderr)

    kwargs = {"pretrained": False, "num_classes": num_classes}
    cfg = timm.get_pretrained_cfg(name)
    default_size = cfg.input_size[-1] if cfg is not None and getattr(cfg, "input_size", None) else None
    if image_size and default_size and image_size != default_size:
        # ViT-style models bake the image size into their position embeddings; conv nets do not take it.
        try:
            return timm.create_model(name, img_size=image_size, **kwargs)
        except TypeError as exc:
            if "img_size" not in str(exc):
                raise
    return timm.create_model(name, **kwargs)


HINT_SIZES = (32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384)   # tried for the hint when a size is refused
INPUT_ERRORS = (RuntimeError, ValueError, AssertionError)   # what a forward raises on an input it cannot take


def check_input_size(model: nn.Module, name: str, sample_shape: tuple[int, ...]) -> None:
    """Refuse, before any training, an input a model cannot take (a net that downsamples 32x given 16 px
    images fails in its last stages, mid-run otherwise): one forward of two blank samples in eval mode, with
    the random state kept (a lazy layer initialized here must not shift the run's seed), and the error names
    the model, the size and the smallest of HINT_SIZES the model takes."""
    try:
        forward_blank(model, sample_shape)
    except INPUT_ERRORS as exc:
        channels, height, width = sample_shape[-3:]
        fits = next((size for size in HINT_SIZES if size > min(height, width)
                     and fits_size(model, (channels, size, size))), None)
        hint = f"; it takes --image-size {fits}" if fits else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"--model {name} cannot take {height}x{width} images (--image-size {height}): {first}"
                         f"{hint}") from exc


def forward_blank(model: nn.Module, sample_shape: tuple[int, ...]) -> None:
    was_training = model.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()
            model(torch.zeros((2, *sample_shape)))
    finally:
        model.train(was_training)


def fits_size(model: nn.Module, sample_shape: tuple[int, ...]) -> bool:
    try:
        forward_blank(model, sample_shape)
    except INPUT_ERRORS:
        return False
    return True
