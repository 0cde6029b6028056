"""The one interface every technique shares: can it act here, and why not.

A technique that cannot act on the current device (or model) is reported as "no effect on this
device" with the reason, never timed and presented as a gain or loss that is really noise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:      # imports no torch: a task's declarations (and so the CLI) read Effect before torch loads
    import torch
    from torch import nn

NOT_APPLICABLE = "not-applicable"     # an Effect's label: the technique has nothing to act on in this task


@dataclass(frozen=True)
class Effect:
    acts: bool
    reason: str = ""
    applies: bool = True      # False: not this device but the task's model or data rules it out (the report says why)

    @property
    def label(self) -> str:
        return "measured" if self.acts else ("no-effect" if self.applies else NOT_APPLICABLE)


ACTS = Effect(True)


def cuda_only(device: torch.device, what: str) -> Effect:
    if device.type == "cuda":
        return ACTS
    return Effect(False, f"{what} only acts on CUDA; on {device.type} it changes nothing")


def has_conv(model: nn.Module) -> bool:
    from torch import nn

    return any(isinstance(m, (nn.Conv2d, nn.Conv3d, nn.BatchNorm2d)) for m in model.modules())
