"""Detection: lists of images of different sizes, the detector's own loss dict, COCO mAP.

A torchvision detector in train mode is called `model(images, targets)` and returns its losses as a dict
(Faster R-CNN: loss_classifier, loss_box_reg, loss_objectness, loss_rpn_box_reg; SSD: bbox_regression,
classification). The loop backpropagates their sum (Session.backward sums a dict) and the Meter logs every
term. Evaluation: COCO mAP and mAP@0.5 over every rank's shard (detection/metrics.py).
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..detection.batching import (DetectionDeviceBatches, build_detection_loader, collate_detection, images_to_device,
                                  targets_to_device)
from ..detection.engine import predict_detection, warmup_scheduler
from ..detection.metrics import compute_map
from ..recipe import RecipeError
from .base import Task
from .declarations import DETECTION


class Detection(Task):
    declaration = DETECTION

    def __init__(self, loss_fn: Callable | None = None, dist=None, recipe=None) -> None:
        if loss_fn is not None:
            raise RecipeError("the detection task takes no loss_fn: a torchvision detector computes its own "
                              "losses in train mode (model(images, targets) -> dict of losses)")

    # --- the step -------------------------------------------------------------------------------------
    def forward(self, model: Callable, images: list[torch.Tensor], targets: list[dict]) -> tuple[None, dict]:
        return None, model(images, targets)

    def score(self, outputs: None, targets: list[dict]) -> tuple[None, int]:
        return None, len(targets)        # nothing to count as correct while training: mAP needs eval mode

    def probe_batch(self, samples: list, device: torch.device) -> tuple[list[torch.Tensor], list[dict]]:
        images, targets = collate_detection(samples)
        return images_to_device(images, device), targets_to_device(targets, device)

    # --- evaluation and the epoch record ----------------------------------------------------------------
    def evaluate(self, model: nn.Module, batches: Iterable, precision, dist) -> dict[str, Any]:
        """COCO mAP over every rank's shard: each rank predicts its own images, the (small, CPU) predictions
        are gathered and every rank scores them all (mAP does not average over shards). In fp32, not under the
        precision's autocast: the boxes are decoded and compared in pixels, where bf16's 8 bits of mantissa
        would move a box edge by up to 2 px at 480 px, and mAP@.75 would measure that rounding instead of the
        training (torchvision's detection reference evaluates without autocast too)."""
        predictions, truth = predict_detection(model, batches)
        gathered = dist.gather_objects((predictions, truth))
        predictions = [p for rank_predictions, _ in gathered for p in rank_predictions]
        truth = [t for _, rank_truth in gathered for t in rank_truth]
        return compute_map(predictions, truth)

    def train_metrics(self, stats, dist) -> dict[str, Any]:
        loss, _ = dist.reduce_train(stats.loss, 0, stats.samples)
        return {"train_loss": loss, "train_loss_terms": stats.loss_terms}

    def val_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        return {"val_map": metrics["map"], "val_map_50": metrics["map_50"], "val_map_75": metrics["map_75"],
                "val_images": metrics["images"], "val_detections": metrics["detections"]}

    def judged(self, metrics: dict[str, Any]) -> float:
        return metrics["map"]

    def rung_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Its noise band treats the held-out images as the samples, as accuracy's does (val_samples)."""
        return {"map": metrics["map"], "map_50": metrics["map_50"], "loss": None,
                "val_samples": metrics["images"]}

    def summary(self, record: dict[str, Any]) -> str:
        terms = "  ".join(f"{k} {v:.3f}" for k, v in record["train_loss_terms"].items())
        return f"({terms})  val mAP {record['val_map']:.4f}  mAP@0.5 {record['val_map_50']:.4f}"

    # --- data, model, schedule --------------------------------------------------------------------------
    def load_data(self, spec: str, image_size: int | None):
        from ..detection.loading import load_detection_data

        self.declaration.check_image_size(image_size)
        return load_detection_data(spec)

    def build_model(self, name: str, split) -> nn.Module:
        from ..detection.models import build_detection_model

        return build_detection_model(name, split.num_classes)

    def build_file_counts(self):
        """A coco:PATH folder's unreadable images, skipped and counted as classification's are; its images are
        decoded by its own dataset, never on the device, so there are no host decodes to count."""
        from ..data.filecounts import FileCounts

        return FileCounts(host_decode=False)

    def resolve_workers(self, recipe, split, device: torch.device):
        """num_workers="auto": the fastest worker count for this data, measured once on the detection loader."""
        from ..data.loader import choose_num_workers, with_workers

        if recipe.num_workers != "auto":
            return recipe
        return with_workers(recipe, choose_num_workers(split.train, recipe, device, collate_fn=collate_detection))

    def build_loaders(self, split, recipe, device: torch.device, dist) -> tuple[Any, Any]:
        return tuple(DetectionDeviceBatches(build_detection_loader(dataset, split, recipe, device, dist, train),
                                            device, recipe.non_blocking)
                     for dataset, train in ((split.train, True), (split.val, False)))

    def apply_schedule(self, state, steps_per_epoch: int) -> None:
        """The detection reference's first-epoch warm-up (detection/engine.py: LinearLR from lr/1000 over the first
        epoch, at most 1000 steps) unless the recipe asks for its own (warmup_steps > 0). A from-scratch detector's
        first gradients are large enough to send the loss to NaN at the full learning rate."""
        from ..session import SessionScheduler

        if state.recipe.warmup_steps == 0:
            state.scheduler = SessionScheduler(warmup_scheduler(state.optimizer.optimizer, steps_per_epoch), state)

    def flops_per_sample(self, model: nn.Module, split, recipe) -> float | None:
        """Model FLOPs of one training image (forward + backward, the losses included), counted on a copy on the
        first two training images; None when the counter cannot run the model."""
        from torch.utils.flop_counter import FlopCounterMode

        samples = [split.train[i] for i in range(min(2, len(split.train)))]
        images = images_to_device([image for image, _ in samples], "cpu")
        targets = [target for _, target in samples]
        shadow = copy.deepcopy(model).train()
        try:
            with torch.random.fork_rng(devices=[]), FlopCounterMode(display=False) as counter:
                sum(shadow(images, targets).values()).backward()
        except Exception:            # a model the counter cannot trace still gets every other number
            return None
        return counter.get_total_flops() / len(samples)
