"""torch.compile: fuses elementwise ops and removes Python overhead. Costs compile time on the first
steps (excluded from steady-state throughput, included in epoch time), and recompiles when input shapes
change, which is why training loaders drop the last partial batch."""
from __future__ import annotations

import shutil

import torch
from torch import nn

from .base import ACTS, Effect
from .switch import RungSpec, Switch


def effect(device: torch.device) -> Effect:
    if device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        return Effect(False, "no C++ compiler found: inductor cannot build CPU kernels")
    return ACTS


def apply_compile(model: nn.Module, enabled: bool) -> nn.Module:
    """Returns the module that runs the training forward. The eager `model` keeps the parameters and is
    used for evaluation, so eval-mode graphs and partial batches never trigger recompiles."""
    return torch.compile(model) if enabled else model


SWITCHES = (
    Switch(("compile",),
           rungs=(RungSpec("compile", {"compile": True}, place=60, places={"detection": 80},
                           default_in=("classification", "detection"), tune=8),),
           device_effect=effect,
           frameworks={"transformers": "TrainingArguments.torch_compile",
                       "lightning": "fit(torch.compile(model)), as Lightning's docs show",
                       "accelerate": "Accelerator(dynamo_backend=...)"}),
)
