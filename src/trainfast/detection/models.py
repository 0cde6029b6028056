"""torchvision detectors by name: random weights always, BatchNorm trainable, sized for the CPU by default.

Random weights: `weights=None, weights_backbone=None`, so torchvision never downloads anything. That choice
also decides the normalization layers: torchvision freezes BatchNorm (FrozenBatchNorm2d, and only the last
3 backbone stages trainable) when it loads pretrained weights, because fine-tuning with small batches would
wreck the pretrained statistics; from scratch there are no statistics to keep, so it builds plain
nn.BatchNorm2d with every backbone stage trainable (it ignores `trainable_backbone_layers` then, with a
warning, so we do not pass it), which is what a from-scratch run needs. `check_trainable` verifies the
result, so a torchvision change that froze anything fails loudly here instead of training a half-frozen
model.

The CPU-sized defaults (`CPU_DEFAULTS`) keep a few CPU minutes meaningful. Faster R-CNN: images resized to
a short side of 320 and a long side of at most 480 (the "320" model's own min_size; its 640 max_size
would double the work on 1:2 images), 300 proposals per image in training instead of 2000, 64 sampled
RoIs per image instead of 512 (the synthetic images hold 2 to 5 objects; at 128 RoIs, RoIAlign's backward
alone was a quarter of a training step in a CPU profile here, batch 4), and a detection score
threshold of 0.01 instead of 0.05 (COCO mAP rewards low-confidence detections, which is all an early
from-scratch model has). SSDlite needs nothing: it is already 320x320. `cpu_sized=False` gives
torchvision's defaults; keyword arguments override either.
"""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

# The names live where nothing imports torch, so the CLI can check one before torch loads
from ..modelnames import (DEFAULT_DETECTION_MODEL, DETECTION_MODELS, ModelError,  # noqa: F401  (re-exported)
                          check_detection_model_name)

# One per name in DETECTION_MODELS (tests/test_cli_early.py checks the two agree)
CPU_DEFAULTS: dict[str, dict[str, Any]] = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": {
        "min_size": 320, "max_size": 480,
        "rpn_pre_nms_top_n_train": 600, "rpn_post_nms_top_n_train": 300,
        "box_batch_size_per_image": 64, "box_score_thresh": 0.01,
    },
    "fasterrcnn_mobilenet_v3_large_fpn": {
        "min_size": 320, "max_size": 480,
        "rpn_pre_nms_top_n_train": 600, "rpn_post_nms_top_n_train": 300,
        "box_batch_size_per_image": 64, "box_score_thresh": 0.01,
    },
    "ssdlite320_mobilenet_v3_large": {},
}


def _builders() -> dict[str, Callable[..., nn.Module]]:
    from torchvision.models import detection

    return {name: getattr(detection, name) for name in CPU_DEFAULTS}


def build_detection_model(name: str, num_classes: int, cpu_sized: bool = True, **overrides: Any) -> nn.Module:
    """A torchvision detector with random weights. `num_classes` is torchvision's: the categories plus the
    background (DetectionSplit.num_classes). Train mode: model(images, targets) -> dict of losses; eval
    mode: model(images) -> list of {"boxes", "scores", "labels"}; images float in [0, 1]."""
    check_detection_model_name(name)
    if num_classes < 2:
        raise ModelError(f"--model {name}: num_classes={num_classes}, need at least one category plus the background")
    kwargs = {**(CPU_DEFAULTS[name] if cpu_sized else {}), **overrides}
    model = _builders()[name](weights=None, weights_backbone=None, num_classes=num_classes, **kwargs)
    check_trainable(model, name)
    return model


def check_trainable(model: nn.Module, name: str) -> None:
    """Every parameter trainable and every norm layer a real BatchNorm (FrozenBatchNorm2d has no
    parameters and ignores train()): what training from scratch needs."""
    from torchvision.ops.misc import FrozenBatchNorm2d

    frozen = [n for n, m in model.named_modules() if isinstance(m, FrozenBatchNorm2d)]
    fixed = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen or fixed:
        raise ModelError(f"--model {name}: torchvision built frozen layers for a from-scratch model "
                         f"(FrozenBatchNorm2d: {frozen[:3]}, requires_grad=False: {fixed[:3]})")
