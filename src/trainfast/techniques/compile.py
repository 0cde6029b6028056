"""torch.compile: fuses elementwise ops and removes Python overhead. Costs compile time on the first
steps (excluded from steady-state throughput, included in epoch time), and recompiles when input shapes
change, which is why training loaders drop the last partial batch."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

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


CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"    # where inductor keeps compiled kernels and graphs between processes


@contextmanager
def fresh_compile_cache() -> Iterator[str]:
    """torch.compile's on-disk caches (inductor's kernels and graphs, read from CACHE_ENV each time it looks) in a
    folder of this run's own, removed after: the run pays the compilation a fresh machine pays, the same in every
    repeat. Shared, the first run of a rung compiles and its repeats read the cache (a compiled ResNet-9's first
    step took 18 s, then 1.4 s, on 2 cores), and a time to target that counts compilation would depend on which
    repeat ran first. Yields the folder (a script's run gets it through its environment)."""
    kept = os.environ.get(CACHE_ENV)
    with tempfile.TemporaryDirectory(prefix="trainfast-compile-cache-") as folder:
        os.environ[CACHE_ENV] = folder
        try:
            yield folder
        finally:
            if kept is None:
                os.environ.pop(CACHE_ENV, None)
            else:
                os.environ[CACHE_ENV] = kept


SWITCHES = (
    Switch(("compile",),
           rungs=(RungSpec("compile", {"compile": True}, place=60, places={"detection": 80},
                           default_in=("classification", "detection"), tune=8),),
           device_effect=effect, observed="compiled",
           frameworks={"transformers": "TrainingArguments.torch_compile",
                       "lightning": "fit(torch.compile(model)), as Lightning's docs show",
                       "accelerate": "Accelerator(dynamo_backend=...)"}),
)
