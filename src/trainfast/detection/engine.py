"""Detection-specific pieces of the loop: the first-epoch warm-up and evaluation as COCO mAP.

The training step itself is the built-in loop's (a detector in train mode returns a dict of losses, which
the loop sums for backward); what differs for detection lives here.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from .batching import images_to_device
from .metrics import compute_map

WARMUP_FACTOR = 1.0 / 1000
WARMUP_MAX_ITERS = 1000


def warmup_iters(iters_per_epoch: int, max_iters: int = WARMUP_MAX_ITERS) -> int:
    """torchvision's detection reference: warm up over min(1000, len(loader) - 1) iterations."""
    return max(0, min(max_iters, iters_per_epoch - 1))


def warmup_scheduler(optimizer: torch.optim.Optimizer, iters_per_epoch: int, factor: float = WARMUP_FACTOR,
                     max_iters: int = WARMUP_MAX_ITERS) -> torch.optim.lr_scheduler.LRScheduler:
    """The detection reference's first-epoch warm-up: LinearLR from factor x lr to lr over warmup_iters(iters_per_epoch)
    iterations, stepped once per optimizer step in the first epoch (it stays at lr afterwards, so stepping it longer is
    harmless). Why: a from-scratch detector's first gradients are large (random RPN/box heads); the full
    learning rate at step 0 sends the loss to NaN. A one-batch epoch leaves nothing to warm up over: then
    a constant factor of 1 (a no-op scheduler rather than a branch in the loop)."""
    total = warmup_iters(iters_per_epoch, max_iters)
    if total < 1:
        return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=1.0, total_iters=1)
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=factor, total_iters=total)


def predict_detection(model: nn.Module, batches: Iterable) -> tuple[list[dict], list[dict]]:
    """(predictions, targets) of `model` over `batches` of (float images on the model's device, targets),
    on the CPU (COCO scoring runs there), under inference_mode (no autograd bookkeeping at all, cheaper than
    no_grad) and eval() (BatchNorm's running statistics, the detector's post-processing). The model's mode
    is restored afterwards."""
    was_training = model.training
    model.eval()
    predictions, truth = [], []
    try:
        with torch.inference_mode():
            for images, targets in batches:
                predictions += [{k: p[k].detach().cpu() for k in ("boxes", "scores", "labels")} for p in model(images)]
                truth += [{k: t[k].detach().cpu() for k in ("boxes", "labels")} for t in targets]
    finally:
        model.train(was_training)
    return predictions, truth


def evaluate_detection(model: nn.Module, loader: Iterable, device: torch.device | str = "cpu") -> dict:
    """COCO mAP of `model` over `loader`'s (images, targets) batches (collate_detection's; uint8 images,
    batches whose every image was unreadable already dropped or None)."""
    batches = ((images_to_device(images, device), targets) for images, targets in loader if images is not None)
    return compute_map(*predict_detection(model, batches))
