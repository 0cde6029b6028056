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
