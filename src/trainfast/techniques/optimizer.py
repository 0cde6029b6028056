"""The optimizer and its implementation switch: "for-loop" updates one tensor at a time, "foreach" groups
tensors into multi-tensor kernels, "fused" does the whole update in one kernel per dtype/device.
"default" passes nothing, so torch picks (foreach on CUDA, for-loop on CPU), exactly as a plain loop."""
from __future__ import annotations

import warnings
from typing import Iterable

import torch

from .base import ACTS, Effect


def effect(device: torch.device) -> Effect:
    return ACTS


def build_optimizer(params: Iterable[torch.nn.Parameter], recipe) -> torch.optim.Optimizer:
    impl = {"default": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    kwargs = impl[recipe.optimizer_impl]
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, momentum=0.9, weight_decay=recipe.weight_decay, **kwargs)
    return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay, **kwargs)


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warm-up over `warmup_steps` (seed 004's warmup_lr_scheduler), then constant. With 0 warm-up
    steps the factor is exactly 1.0, so the LR is bit-identical to no scheduler."""
    # Under fp16 the GradScaler skips optimizer.step() on overflow (always on the first steps, while the
    # scale calibrates); the schedule still advances once per step, as in torchvision's reference
    # engine, so torch's "scheduler.step() before optimizer.step()" warning is expected and not a bug.
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`")

    def factor(step: int) -> float:
        if step >= warmup_steps:
            return 1.0
        return (step + 1) / warmup_steps

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
