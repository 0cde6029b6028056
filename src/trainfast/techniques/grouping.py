"""Aspect-ratio grouping of detection batches (torchvision references' --aspect-ratio-group-factor): a
detector pads every batch to its largest image, so batching images of similar shape pads less and the
backbone computes fewer zeros (detection/batching.py measures the padding). It acts only where batches are
padded: a detector that resizes every image to one fixed size (SSD) pads nothing."""
from __future__ import annotations

from .switch import EVERY_ADAPTER, RungSpec, Switch

SWITCHES = (
    Switch(("group_aspect_ratio",),
           rungs=(RungSpec("group_aspect_ratio", {"group_aspect_ratio": True}, place=25, tasks=("detection",),
                           default_in=("detection",)),),
           data="padded_sizes",
           changes_math=True,              # which images share a batch: another order, another trajectory
           unreachable={EVERY_ADAPTER: "trainfast's detection sampler; the script's loader is the framework's"}),
)
