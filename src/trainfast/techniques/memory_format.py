"""channels_last: NHWC layout for conv nets, which oneDNN (CPU) and cuDNN tensor cores prefer. It has
nothing to act on in a model without convolutions."""
from __future__ import annotations

import torch
from torch import nn

from .base import ACTS, Effect, has_conv


def effect(model: nn.Module) -> Effect:
    return ACTS if has_conv(model) else Effect(False, "the model has no convolutions: memory format changes nothing")


def memory_format(enabled: bool) -> torch.memory_format:
    return torch.channels_last if enabled else torch.contiguous_format


def apply_memory_format(model: nn.Module, enabled: bool) -> nn.Module:
    return model.to(memory_format=torch.channels_last) if enabled else model
