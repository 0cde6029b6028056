"""Aspect-ratio grouping of detection batches (torchvision references' --aspect-ratio-group-factor): a
detector pads every batch to its largest image, so batching images of similar shape pads less and the
backbone computes fewer zeros (detection/batching.py measures the padding). It acts only where batches are
padded: a detector that resizes every image to one fixed size (SSD) pads nothing."""
from __future__ import annotations

from torch import nn

from .base import ACTS, Effect


def effect(model: nn.Module | None, split) -> Effect:
    from ..detection.batching import aspect_ratio_groups

    sizes = getattr(getattr(split, "train", None), "sizes", None)
    if sizes is None:
        return Effect(False, "aspect-ratio grouping acts on detection data (images of different sizes); these "
                             "batches are stacked at one size", applies=False)
    fixed = getattr(getattr(model, "transform", None), "fixed_size", None)
    if fixed:
        return Effect(False, f"the model resizes every image to {fixed[0]}x{fixed[1]}: no batch is padded, so "
                             "grouping changes nothing", applies=False)
    if len(set(aspect_ratio_groups(sizes))) < 2:
        return Effect(False, "every training image falls in one aspect-ratio group: grouping changes nothing",
                      applies=False)
    return ACTS
