"""`--data SPEC` for detection -> a DetectionSplit: synthetic images of shapes or digits, or a COCO folder."""
from __future__ import annotations

from ..dataspecs import parse_detection_spec
from .coco import load_coco
from .data import DetectionSplit
from .synthetic import load_synthetic_detection


def load_detection_data(spec: str = "synthetic", seed: int = 0) -> DetectionSplit:
    """The split a detection run trains and evaluates on. `seed` picks the synthetic images (a data seed,
    not the run's seed: every rung of an ablation is scored on the same images)."""
    kind, arg = parse_detection_spec(spec)
    if kind == "synthetic":
        return load_synthetic_detection(objects=arg or "shapes", seed=seed)
    return load_coco(arg)
