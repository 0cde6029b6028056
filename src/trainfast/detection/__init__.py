"""Object detection: the building blocks of the detection task.

One module per concern:
  data.py       DetectionSplit, the detection twin of data.datasets.Split
  loading.py    `load_detection_data(spec)`: synthetic shapes/digits or a COCO folder
  synthetic.py  the built-in, offline, seeded dataset (shapes or digits pasted onto real photos)
  coco.py       `coco:PATH` folders, validated before training (what is refused, what is skipped and counted)
  batching.py   collate to (list of images, list of targets), aspect-ratio grouping, padding measurement
  models.py     torchvision detectors by name, random weights, trainable BatchNorm, a CPU-sized config
  metrics.py    COCO mAP through torchmetrics + pycocotools, 0.0 (not -1) when nothing is predicted
  engine.py     the first-epoch warm-up, and evaluation under inference_mode

Samples are (uint8 image [3, H, W], target) with target = {"boxes": float32 [N, 4] xyxy in pixels,
"labels": int64 [N] in 1..C (0 is background), "image_id": int}: images stay uint8 until the batch is on
its device (`batching.images_to_device`), as everywhere else in trainfast; torchvision's detectors take
float images in [0, 1] and normalize them themselves.
"""
from .batching import (GroupedBatchSampler, aspect_ratio_groups, collate_detection, images_to_device, padding_fraction,
                       targets_to_device)
from .data import DetectionSplit
from .engine import evaluate_detection, warmup_iters, warmup_scheduler
from .loading import load_detection_data
from .metrics import compute_map
from .models import DETECTION_MODELS, build_detection_model

__all__ = [
    "DETECTION_MODELS", "DetectionSplit", "GroupedBatchSampler", "aspect_ratio_groups", "build_detection_model",
    "collate_detection", "compute_map", "evaluate_detection", "images_to_device", "load_detection_data",
    "padding_fraction", "targets_to_device", "warmup_iters", "warmup_scheduler",
]
