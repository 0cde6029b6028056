"""Tasks: what a batch, a loss and a metric mean. The loop (engine.py) is one loop for every task.

Every task is a `Task` (base.py), whose declarations the rest of trainfast reads instead of probing the object:
  name, ladder                           its name, and its default ladder's (ablation/ladders.py: LADDERS)
  metric: Metric(name, label, goal)      what every rung is judged on: its name in sentences and results.json, its
                                         table column, "max" or "min"
  rate_unit, count_batch(batch)          what its rate counts per second (samples, images, tokens), per batch
  offers, batches                        the kinds of data it offers (techniques/switch.py: DATA_KINDS) and its
                                         batches in words: a switch on another kind is ruled out, with the reason
  default_model, default_data, default_recipe, loss_terms, loss_fn
and the few points where tasks differ, so the training step never branches on the task:
  forward(model, inputs, targets) -> (outputs, loss)   loss: a tensor, or a dict of named terms (detection)
  score(outputs, targets) -> (correct or None, count)  what the Meter counts per step, on the device
  evaluate(model, batches, precision, dist)            held-out metrics, over every rank's shard
  judged(metrics), rung_metrics(metrics)               the metric's value, and the ablation run's other numbers
  train_metrics(stats, dist), val_metrics(metrics)     the task's fields of the epoch record
  build_loaders / resolve_workers / apply_schedule     its batches on the device, its warm-up
  load_data / check_model / build_model / validate     names and flags, refused before any work starts
  field_effect / data_reason / rules_out               whether a switch can act on its model and data, and why not

classification.py: stacked images, cross-entropy, accuracy. detection.py: lists of images of different sizes,
the detector's own loss dict, COCO mAP. lm.py: documents of token ids, the model's own next-token loss,
validation loss per token (rate in tokens/s).
"""
from __future__ import annotations

from typing import Any, Callable

from ..recipe import RecipeError
from .base import Metric, Task

TASKS = ("classification", "detection", "lm")
__all__ = ["TASKS", "Metric", "Task", "infer_task", "resolve_task", "build_task", "as_task"]


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


def build_task(name: str, loss_fn: Callable | None = None, dist=None, recipe=None) -> Task:
    """The task object. `dist`: the run's Dist, whose criterion wraps the training loss (strategy=dp computes
    it inside each replica); evaluation always uses `loss_fn` as given. `recipe`: the run's, for the switches
    that act on the task's own loss (techniques.task_loss)."""
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
        from ..techniques import task_loss

        return LanguageModel(task_loss(recipe, name))
    from .classification import Classification

    infer_task(name)                     # an unknown name is refused, naming the choices
    return Classification(loss_fn, dist)


def as_task(task_or_loss_fn: Task | Callable | None) -> Task:
    """A task as it is; a bare loss function (the loop's callers from before tasks, benchmarks and tests of the
    classification step) as the classification task with that loss."""
    if isinstance(task_or_loss_fn, Task):
        return task_or_loss_fn
    from .classification import Classification

    return Classification(task_or_loss_fn)
