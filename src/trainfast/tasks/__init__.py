"""Tasks: what a batch, a loss and a metric mean. The loop (engine.py) is one loop for every task.

Every task is a declaration (base.py: TaskDeclaration, registered by name in declarations.py, which imports no torch:
its metric, rate unit, the data it offers, its defaults and what it refuses) and an implementation (base.py: Task,
whose abstract methods are every point where tasks differ, so the training step never branches on the task).
classification.py: stacked images, cross-entropy, accuracy. detection.py: lists of images of different sizes,
the detector's own loss dict, COCO mAP. lm.py: documents of token ids, the model's own next-token loss,
validation loss per token (rate in tokens/s).

This package imports no torch: the command line reads the declarations (TASKS, declared, infer_task) before torch
loads; build_task imports a task's implementation when it makes one.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from .base import Metric, Task, TaskDeclaration
from .declarations import REGISTRY, declared, register

TASKS = tuple(REGISTRY)
__all__ = ["TASKS", "Metric", "Task", "TaskDeclaration", "declared", "register", "infer_task", "resolve_task",
           "build_task", "as_task", "task_class"]


def infer_task(task: str | None, model: Any = None, data: Any = None) -> str:
    """The task a run is: `task` when given; else the task whose models include `model` (by name: a detection
    model, a language model trainfast defines), or whose data `data` is (a DetectionSplit, a TextSplit); else
    classification. Without a `data` object it needs no torch."""
    if task is not None:
        return declared(task).name
    for declaration in REGISTRY.values():
        if isinstance(model, str) and model in declaration.models:
            return declaration.name
    for declaration in REGISTRY.values():
        if data is not None and declaration.split_class and isinstance(data, imported(declaration.split_class)):
            return declaration.name
    return "classification"


def resolve_task(task: str | None, model: str | None, data: str | None) -> tuple[str, str, str]:
    """The CLI's (task, model, data): the task inferred from --model when --task is not given, and the
    task's default model and data where the flags were left out."""
    name = infer_task(task, model)
    defaults = declared(name)
    return name, model or defaults.default_model, data or defaults.default_data


def imported(where: str) -> Any:
    """The object a declaration names as "package.module:Name" (its module imported here)."""
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def task_class(name: str) -> type[Task]:
    """The implementation of the task called `name` (its module imports torch)."""
    return imported(declared(name).implementation)


def build_task(name: str, loss_fn: Callable | None = None, dist=None, recipe=None) -> Task:
    """The task object, looked up by name (Task.__init__ says what each argument is for)."""
    return task_class(name)(loss_fn=loss_fn, dist=dist, recipe=recipe)


def as_task(task_or_loss_fn: Task | Callable | None) -> Task:
    """A task as it is; a bare loss function (the loop's callers from before tasks, benchmarks and tests of the
    classification step) as the classification task with that loss."""
    if isinstance(task_or_loss_fn, Task):
        return task_or_loss_fn
    return build_task("classification", task_or_loss_fn)
