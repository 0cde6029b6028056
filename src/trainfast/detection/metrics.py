"""COCO box mAP: torchmetrics' MeanAveragePrecision with the pycocotools backend (COCO's own evaluator).

What comes back (`MapMeter.compute`, `compute_map`): plain floats
  map      mAP@[.5:.95], COCO's headline number
  map_50   mAP at IoU 0.5 (PASCAL VOC's)
  map_75   mAP at IoU 0.75
  map_small, map_medium, map_large   by object area (< 32^2, < 96^2, larger), or None
  mar_100  recall with up to 100 detections per image
  images, ground_truth, detections   what was scored (so a 0.0 can be told from "nothing to score")

How -1 is handled: pycocotools writes -1 where a number has no ground truth to be computed from. For a
size range without any object of that size (the synthetic data has no "large" objects) that is a fact,
not a score: we return None, never -1 (which would average as a very bad mAP) nor 0. For the whole set,
no ground-truth box at all means mAP is undefined: `compute` raises instead of returning a number.
When there is ground truth and the model predicts nothing at all (a from-scratch model's first
evaluations, whose scores are all under the threshold), every ground-truth box is a miss: 0.0, which is
what pycocotools computes; this is tested, not assumed.
"""
from __future__ import annotations

from typing import Sequence

import torch

METRIC_KEYS = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_100")
SIZE_KEYS = ("map_small", "map_medium", "map_large")


class MapMeter:
    """Accumulates (predictions, targets) batch by batch; `compute()` scores them all at once."""

    def __init__(self) -> None:
        from torchmetrics.detection import MeanAveragePrecision

        self.metric = MeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend="pycocotools")
        # SSDlite returns up to 300 detections per image; COCO scores the 100 best of each (image, category),
        # which is the standard number, so torchmetrics' warning about it would only be noise in every run.
        self.metric.warn_on_many_detections = False
        self.images = self.ground_truth = self.detections = 0

    def update(self, predictions: Sequence[dict], targets: Sequence[dict]) -> None:
        if len(predictions) != len(targets):
            raise ValueError(f"{len(predictions)} predictions for {len(targets)} targets")
        # On the CPU, and only the keys COCO scoring reads: pycocotools runs on the host anyway.
        preds = [{"boxes": p["boxes"].detach().float().cpu(), "scores": p["scores"].detach().float().cpu(),
                  "labels": p["labels"].detach().long().cpu()} for p in predictions]
        truth = [{"boxes": t["boxes"].detach().float().cpu(), "labels": t["labels"].detach().long().cpu()}
                 for t in targets]
        self.metric.update(preds, truth)
        self.images += len(truth)
        self.ground_truth += sum(len(t["labels"]) for t in truth)
        self.detections += sum(len(p["labels"]) for p in preds)

    def compute(self) -> dict[str, float | int | None]:
        if self.ground_truth == 0:
            raise ValueError(f"mAP is undefined: the {self.images} evaluated image(s) hold no ground-truth box")
        raw = self.metric.compute()
        result: dict[str, float | int | None] = {}
        for key in METRIC_KEYS:
            value = float(raw[key])
            # -1: no ground truth in that size range (see the module docstring); any other -1 would mean
            # pycocotools found no ground truth at all, which the check above has ruled out.
            result[key] = None if (value == -1.0 and key in SIZE_KEYS) else value
        result.update(images=self.images, ground_truth=self.ground_truth, detections=self.detections)
        return result


def compute_map(predictions: Sequence[dict], targets: Sequence[dict]) -> dict[str, float | int | None]:
    """mAP of a list of predictions ({"boxes" xyxy, "scores", "labels"}) against targets ({"boxes",
    "labels"}), one dict per image."""
    meter = MapMeter()
    meter.update(predictions, targets)
    return meter.compute()


def empty_prediction(device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """What a detector returns for an image in which it finds nothing."""
    return {"boxes": torch.zeros(0, 4, device=device), "scores": torch.zeros(0, device=device),
            "labels": torch.zeros(0, dtype=torch.int64, device=device)}
