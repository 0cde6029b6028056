"""Tasks: what a batch, a loss and a metric mean. The loop (engine.py) is one loop for every task.

A task is a small object the built-in run calls at the few points where tasks differ, so the training step
never branches on the task:
  forward(model, inputs, targets) -> (outputs, loss)   loss: a tensor, or a dict of named terms (detection)
  score(outputs, targets) -> (correct or None, samples) what the Meter counts per step, on the device
  evaluate(model, batches, precision, dist)            held-out metrics, over every rank's shard
  train_metrics(stats, dist), val_metrics(metrics)     the task's fields of the epoch record
  build_loaders / resolve_workers / apply_schedule     its batches on the device, its warm-up
  load_data / check_model / build_model / validate     names and flags, refused before any work starts
  rung_metrics(metrics), metric_label, metric_name     what the ablation judges every rung on, and its name

classification.py: stacked images, cross-entropy, accuracy. detection.py: lists of images of different sizes,
the detector's own loss dict, COCO mAP. lm.py: documents of token ids, the model's own next-token loss,
validation loss per token (rate in tokens/s).
"""
from __future__ import annotations

from typing import Any, Callable

from ..recipe import RecipeError

TASKS = ("classification", "detection", "lm")


def infer_task(task: str | None, model: Any = None, data: Any = None) -> str:
    """The task a run is: `task` when given; else detection when the model is one of the detection models
    (by name) or the data is a DetectionSplit; lm for a language model trainfast defines (by name) or a
    TextSplit; else classification."""
    from ..detection.data import DetectionSplit
    from ..detection.models import DETECTION_MODELS
    from ..text.batching import TextSplit
    from ..text.models import LM_MODELS

    if task is not None:
        if task not in TASKS:
            raise RecipeError(f"--task {task!r} is not one of {', '.join(TASKS)}")
        return task
    if (isinstance(model, str) and model in DETECTION_MODELS) or isinstance(data, DetectionSplit):
        return "detection"
    if (isinstance(model, str) and model in LM_MODELS) or isinstance(data, TextSplit):
        return "lm"
    return "classification"


def resolve_task(task: str | None, model: str | None, data: str | None) -> tuple[str, str, str]:
    """The CLI's (task, model, data): the task inferred from --model when --task is not given, and the
    task's default model and data where the flags were left out."""
    name = infer_task(task, model)
    defaults = build_task(name)
    return name, model or defaults.default_model, data or defaults.default_data


def build_task(name: str, loss_fn: Callable | None = None, dist=None):
    """The task object. `dist`: the run's Dist, whose criterion wraps the training loss (strategy=dp computes
    it inside each replica); evaluation always uses `loss_fn` as given."""
    if name == "detection":
        from .detection import Detection

        if loss_fn is not None:
            raise RecipeError("the detection task takes no loss_fn: a torchvision detector computes its own "
                              "losses in train mode (model(images, targets) -> dict of losses)")
        return Detection()
    if name == "lm":
        from .lm import LanguageModel

        if loss_fn is not None:
            raise RecipeError("the language-model task takes no loss_fn: the model computes its own next-token loss")
        return LanguageModel()
    from .classification import Classification

    infer_task(name)                     # an unknown name is refused, naming the choices
    return Classification(loss_fn, dist)


def as_task(task_or_loss_fn):
    """A task object as it is; a bare loss function (the loop's callers from before tasks, benchmarks and
    tests of the classification step) as the classification task with that loss."""
    if hasattr(task_or_loss_fn, "forward") and hasattr(task_or_loss_fn, "score"):
        return task_or_loss_fn
    from .classification import Classification

    return Classification(task_or_loss_fn)
