"""Process-wide flags of a run: cudnn.benchmark (autotune conv algorithms, CUDA only) and deterministic mode. (The
process switches that reach any process, declared with a ProcessWideSwitch, are applied by the Session through
techniques.apply_process_wide_switches.)"""
from __future__ import annotations

import os

import torch

from .base import Effect, cuda_only

from .switch import Switch, setting


def cudnn_effect(device: torch.device) -> Effect:
    return cuda_only(device, "cudnn.benchmark")


def apply_runtime_flags(recipe, device: torch.device) -> None:
    torch.backends.cudnn.benchmark = bool(recipe.cudnn_benchmark) and device.type == "cuda"
    if recipe.deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; must be set before the first cuBLAS call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True)


SWITCHES = (
    Switch(("cudnn_benchmark",), own_process=True, device_effect=cudnn_effect,      # a global flag
           frameworks={"transformers": "torch.backends.cudnn.benchmark", "lightning": "Trainer(benchmark=...)",
                       "accelerate": "torch.backends.cudnn.benchmark, at Accelerator()"}),
    setting("deterministic", own_process=True, unreachable="not switched by the framework adapters"),
)
