"""channels_last: NHWC layout for conv nets, which oneDNN (CPU) and cuDNN tensor cores prefer. It has
nothing to act on in a model without convolutions."""
from __future__ import annotations

import torch
from torch import nn

from .base import ACTS, Effect, has_conv
from .switch import ADAPTERS, ON_MODEL, ModelSwitch, RungSpec, Switch


def effect(model: nn.Module) -> Effect:
    return ACTS if has_conv(model) else Effect(False, "the model has no convolutions: memory format changes nothing")


def memory_format(enabled: bool) -> torch.memory_format:
    return torch.channels_last if enabled else torch.contiguous_format


def apply_memory_format(model: nn.Module, enabled: bool) -> nn.Module:
    return model.to(memory_format=torch.channels_last) if enabled else model


def memory_format_of(model: nn.Module) -> str | None:
    """The memory format of the model's first 4-D weight (a convolution's), None without one."""
    for p in model.parameters():
        if p.dim() == 4:
            return "channels_last" if p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous() \
                else "contiguous"
    return None


def switch_memory_format(model: nn.Module, enabled: bool) -> nn.Module:
    """channels_last on; off, a model the script itself made channels_last is turned back."""
    if not enabled and memory_format_of(model) == "channels_last":
        return model.to(memory_format=torch.contiguous_format)
    return apply_memory_format(model, enabled)


SWITCHES = (
    Switch(("channels_last",),
           rungs=(RungSpec("channels_last", {"channels_last": True}, place=50,
                           default_in=("classification", "detection"), tune=1),),
           model_effect=effect, data="images",       # NHWC is a layout of 4-D image batches and conv weights
           observed="memory_format",
           model=ModelSwitch("memory format", switch_memory_format, memory_format_of,
                             show=lambda on: "channels_last" if on else "contiguous", default="contiguous"),
           frameworks={name: ON_MODEL for name in ADAPTERS}),
)
