"""`--data SPEC` for detection -> a DetectionSplit: synthetic images of shapes or digits, or a COCO folder."""
from __future__ import annotations

from ..errors import DataError
from .coco import load_coco
from .data import DetectionSplit
from .synthetic import load_synthetic_detection

DATA_KINDS = ("synthetic", "coco")


def parse_detection_spec(spec: str) -> tuple[str, str | None]:
    kind, _, arg = spec.partition(":")
    if kind not in DATA_KINDS:
        raise DataError(f"--data {spec!r}: unknown detection dataset {kind!r}; choose synthetic, "
                        f"synthetic:shapes, synthetic:digits or coco:PATH")
    if kind == "coco" and not arg:
        raise DataError(f"--data {spec!r}: coco needs a folder, e.g. coco:/data/coco "
                        "(an instances*.json and its images)")
    if kind == "synthetic" and arg not in ("", "shapes", "digits"):
        raise DataError(f"--data {spec!r}: synthetic objects are 'shapes' or 'digits', not {arg!r}")
    return kind, arg or None


def load_detection_data(spec: str = "synthetic", seed: int = 0) -> DetectionSplit:
    """The split a detection run trains and evaluates on. `seed` picks the synthetic images (a data seed,
    not the run's seed: every rung of an ablation is scored on the same images)."""
    kind, arg = parse_detection_spec(spec)
    if kind == "synthetic":
        return load_synthetic_detection(objects=arg or "shapes", seed=seed)
    return load_coco(arg)
