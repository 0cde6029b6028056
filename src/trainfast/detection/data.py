"""DetectionSplit and the detection data specs (`--data` for the detection task).

Specs: `synthetic` (the built-in default: drawn shapes on real photos), `synthetic:shapes`,
`synthetic:digits` (scikit-learn's digits on real photos, 10 categories), `coco:PATH` (a COCO-format
folder, see coco.py). Every dataset in a split has `sizes`, the (height, width) of each image, known
without decoding it: the aspect-ratio grouping sampler needs them before the first batch.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import Dataset

from ..data.datasets import DataError

DATA_KINDS = ("synthetic", "coco")


@dataclass
class DetectionSplit:
    train: Dataset
    val: Dataset
    categories: tuple[str, ...]     # label i + 1 is categories[i]; label 0 is the background
    name: str
    # Annotations dropped or changed while loading (coco.py), by reason, e.g. {"crowd annotation": 3}:
    # shown with the metrics, so nothing is skipped silently.
    skipped: Counter = field(default_factory=Counter)
    # The bad-file RunTally shared by the run's loaders (data/badfiles.join_run_tally), as on Split.
    bad_files: Any = field(default=None, repr=False, compare=False)

    @property
    def image_size(self) -> None:
        """No one input size (Split.image_size's twin): detectors resize every image themselves."""
        return None

    @property
    def num_classes(self) -> int:
        """torchvision's num_classes: the categories plus the background (label 0)."""
        return len(self.categories) + 1


def parse_detection_spec(spec: str) -> tuple[str, str | None]:
    kind, _, arg = spec.partition(":")
    if kind not in DATA_KINDS:
        raise DataError(f"--data {spec!r}: unknown detection dataset {kind!r}; choose synthetic, "
                        f"synthetic:shapes, synthetic:digits or coco:PATH")
    if kind == "coco" and not arg:
        raise DataError(f"--data {spec!r}: coco needs a folder, e.g. coco:/data/coco (an instances*.json and its images)")
    if kind == "synthetic" and arg not in ("", "shapes", "digits"):
        raise DataError(f"--data {spec!r}: synthetic objects are 'shapes' or 'digits', not {arg!r}")
    return kind, arg or None


def load_detection_data(spec: str = "synthetic", seed: int = 0) -> DetectionSplit:
    """The split a detection run trains and evaluates on. `seed` picks the synthetic images (a data seed,
    not the run's seed: every rung of an ablation is scored on the same images)."""
    kind, arg = parse_detection_spec(spec)
    if kind == "synthetic":
        from .synthetic import load_synthetic_detection

        return load_synthetic_detection(objects=arg or "shapes", seed=seed)
    from .coco import load_coco

    return load_coco(arg)
