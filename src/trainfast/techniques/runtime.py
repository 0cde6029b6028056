"""Process-wide switches: cudnn.benchmark (autotune conv algorithms, CUDA only), deterministic mode, and how
freed host memory is kept (reuse_memory, memory_reuse.py)."""
from __future__ import annotations

import os

import torch

from .base import Effect, cuda_only

# By name, never `from . import memory_reuse`: that reads the package, whose __init__ imports this module's
# siblings, and would make an import cycle through a package still being initialised.
from .memory_reuse import apply as apply_reuse_memory
from .switch import Switch, setting


def cudnn_effect(device: torch.device) -> Effect:
    return cuda_only(device, "cudnn.benchmark")


def apply_runtime_flags(recipe, device: torch.device) -> None:
    torch.backends.cudnn.benchmark = bool(recipe.cudnn_benchmark) and device.type == "cuda"
    apply_reuse_memory(recipe)
    if recipe.deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; must be set before the first cuBLAS call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True)


SWITCHES = (
    Switch(("cudnn_benchmark",), process=True, device_effect=cudnn_effect,      # a global flag
           frameworks={"transformers": "torch.backends.cudnn.benchmark", "lightning": "Trainer(benchmark=...)",
                       "accelerate": "torch.backends.cudnn.benchmark, at Accelerator()"}),
    setting("deterministic", process=True, unreachable="not switched by the framework adapters"),
)
