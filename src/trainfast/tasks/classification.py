"""Classification: stacked images, a loss function on the logits, held-out accuracy."""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..measure import count_correct, count_train_flops
from .base import Task
from .declarations import CLASSIFICATION


class Classification(Task):
    declaration = CLASSIFICATION
    # On a GPU the default (resnet9 on digits: declarations.py) is a launch-bound toy (resnet9's 16-px kernels take
    # microseconds: the host's launches set the pace, and the switches' effects on the arithmetic never show).
    # `trainfast ablate` with no flags on a GPU runs this instead: the same built-in digits at 160 px through
    # ResNet-50, batch 256, whose step keeps the GPU busy. compile is left out of its ladder: every run would compile
    # for about a minute.
    gpu_default = {"model": "resnet50", "image_size": 160, "batch_size": 256, "epochs": 4,
                   "switches": "amp,non_blocking,prefetch,channels_last,fused"}

    def __init__(self, loss_fn: Callable | None = None, dist=None, recipe=None) -> None:
        self.loss_fn = loss_fn or nn.CrossEntropyLoss()
        # Training goes through the run's criterion (strategy=dp: inside each replica); evaluation does not.
        self.criterion = dist.criterion(self.loss_fn) if dist is not None else self.loss_fn

    # --- the step -------------------------------------------------------------------------------------
    def forward(self, model: Callable, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[Any, torch.Tensor]:
        outputs = model(inputs)
        return outputs, self.criterion(outputs, targets)

    def score(self, outputs: Any, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
        return count_correct(outputs, targets)

    def probe_batch(self, samples: list, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of a few dataset samples on the device, for the unused-parameter probe (only the graph
        matters there, so uint8 images are scaled without the dataset's normalization)."""
        inputs = torch.stack([s[0] for s in samples]).to(device)
        inputs = inputs.float() / 255 if inputs.dtype == torch.uint8 else inputs
        return inputs, torch.as_tensor([s[1] for s in samples]).to(device)

    # --- evaluation and the epoch record ----------------------------------------------------------------
    def evaluate(self, model: nn.Module, batches: Iterable, precision, dist) -> dict[str, float]:
        """Held-out loss and accuracy over every rank's shard. eval() switches dropout/BN to inference
        behaviour; inference_mode() additionally skips autograd bookkeeping. Sums stay on the device and
        are read once."""
        model.eval()
        device = precision.device
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.long, device=device)
        count = 0
        with torch.inference_mode():
            for inputs, targets in batches:
                with precision.forward_context():
                    outputs = model(inputs)
                    loss = self.loss_fn(outputs, targets)
                loss_sum += loss.double() * targets.shape[0]
                correct += (outputs.argmax(dim=-1) == targets).sum()
                count += targets.shape[0]
        model.train()
        return dist.reduce_eval({"loss": float(loss_sum) / max(1, count), "accuracy": int(correct) / max(1, count),
                                 "samples": count})

    def train_metrics(self, stats, dist) -> dict[str, float]:
        loss, accuracy = dist.reduce_train(stats.loss, stats.correct, stats.samples)
        return {"train_loss": loss, "train_accuracy": accuracy}

    def val_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"val_loss": metrics["loss"], "val_accuracy": metrics["accuracy"]}

    def judged(self, metrics: dict[str, float]) -> float:
        return metrics["accuracy"]

    def rung_metrics(self, metrics: dict[str, float]) -> dict[str, Any]:
        return {"loss": metrics["loss"], "val_samples": metrics["samples"]}

    def summary(self, record: dict[str, Any]) -> str:
        return f"val loss {record['val_loss']:.4f}  val acc {record['val_accuracy']:.4f}"

    # --- data, model, schedule --------------------------------------------------------------------------
    def load_data(self, spec: str, image_size: int | None):
        from ..data.loading import load_data

        self.declaration.check_image_size(image_size)
        return load_data(spec, image_size)

    def check_model(self, name: str) -> None:
        from torchvision.models import detection, list_models

        from ..detection.models import DETECTION_MODELS
        from ..models import ModelError, check_model_name

        try:
            check_model_name(name)
        except ModelError:
            if name not in list_models(module=detection):
                raise
            raise ModelError(f"--model {name!r} is a torchvision detection model; the detection task (--task "
                             f"detection) trains {', '.join(DETECTION_MODELS)}") from None

    def build_model(self, name: str, split) -> nn.Module:
        """The named model, checked on the split's input shape before any training (models.check_input_size)."""
        from ..models import build_model, check_input_size

        model = build_model(name, split.num_classes, split.image_size)
        check_input_size(model, name, tuple(first_readable(split.train).shape))
        return model

    def prepare_split(self, split, recipe, dist=None):
        """Image folders read through the decode cache when the recipe asks for it (decode once, then read uint8
        pixels; data/decoded_cache.py)."""
        from ..data.decoded_cache import with_decode_cache

        return with_decode_cache(split, recipe, dist)

    def build_file_counts(self):
        """Image folders: unreadable files and, under device_decode, files decoded on the host (data/filecounts.py)."""
        from ..data.filecounts import FileCounts

        return FileCounts(host_decode=True)

    def resolve_workers(self, recipe, split, device: torch.device):
        from ..data.loader import resolve_num_workers

        return resolve_num_workers(recipe, split, device)

    def build_loaders(self, split, recipe, device: torch.device, dist) -> tuple[Any, Any]:
        from ..data.pipeline import build_loaders

        return build_loaders(split, recipe, device, dist)

    def flops_per_sample(self, model: nn.Module, split, recipe) -> float | None:
        """Model FLOPs of one training sample (forward + backward), counted on a batch of two (FLOPs scale
        with the batch; memory format and precision do not change the count); None when the counter cannot
        trace the model (every other number is still measured)."""
        sample = first_readable(split.train)
        batch = 2
        inputs = torch.zeros((batch, *sample.shape))
        targets = torch.zeros(batch, dtype=torch.long)
        try:
            return count_train_flops(model, self.loss_fn, inputs, targets) / batch
        except Exception:
            return None


def first_readable(dataset, tries: int = 100) -> torch.Tensor:
    """The first input of `dataset` that decodes (its shape sizes the FLOP count); an unreadable file is
    the bad-file tally's business during training, not a reason for the count to crash."""
    from ..data.datasets import DataError, Skipped

    for index in range(min(tries, len(dataset))):
        item = dataset[index]
        if not isinstance(item, Skipped):
            return item[0]
    raise DataError(f"none of the first {min(tries, len(dataset))} training images could be read")
