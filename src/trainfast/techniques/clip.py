"""Global grad-norm clipping (as torchvision's detection reference engine does, after unscaling). Under fp16 the
gradients are unscaled first, so the threshold means the same thing at every loss scale; under O2 the clipped
tensors are the fp32 masters, the ones the optimizer steps."""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from .switch import setting


class Clipper:
    """Global grad-norm clipping on true-scale gradients (unscaled first under fp16); no-op when unset."""

    def __init__(self, max_norm: float | None, params: Iterable[nn.Parameter]) -> None:
        self.max_norm = max_norm
        self.params = [p for p in params if p.requires_grad]

    def __call__(self, precision, optimizer: torch.optim.Optimizer) -> None:
        if self.max_norm is None:
            return
        precision.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)


SWITCHES = (setting("grad_clip", unreachable="the script's own setting (not a speed switch)"),)
