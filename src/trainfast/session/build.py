"""A run's start: every RNG seeded (seed_everything), then the recipe's techniques applied to the model and
the optimizer in the documented order (build_state; the order is the package docstring's, session/__init__.py)."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import nn

from ..distributed import Dist
from ..faults import build_nonfinite_policy
from ..recipe import Recipe
from ..techniques import apply_model_switches, apply_optimizer_switches, build_run_optimizer, optimizer_fields
from ..techniques.clip import Clipper
from ..techniques.compile import apply_compile
from ..techniques.optimizer import build_scheduler, remap_params
from ..techniques.precision import Precision, build_precision
from .state import BackwardOutsideSession, TrainState


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)   # seeds CUDA generators too


def build_state(model: nn.Module, recipe: Recipe, device: torch.device, dist: Dist | None = None,
                precision: Precision | None = None, optimizer: torch.optim.Optimizer | None = None,
                scheduler: Any = None) -> TrainState:
    """The techniques, applied in the documented order (the package docstring, session/__init__.py). Without
    `optimizer`, the recipe's own (optimizer, lr, weight_decay and its optimizer switches) with its linear warm-up
    is built on the final tensors: the built-in loop. `precision` overrides the one the recipe names (tests and
    benchmarks tune the loss scaler with it)."""
    dist = dist or Dist(device, strategy=recipe.strategy)
    precision = precision or build_precision(dist.precision_name(recipe), device, recipe.precision_level)
    adopted = optimizer is not None
    names = {id(p): name for name, p in model.named_parameters()}    # how a user's optimizer finds them again
    model = precision.prepare_model(apply_model_switches(model.to(device), recipe))                 # 1
    model.zero_grad(set_to_none=True)              # the step zeroes after each update, not before
    trained = dist.wrap(model, recipe)             # 2: DDP / FSDP2 (in place) / DataParallel; `model` alone
    trainable = [p for p in model.parameters() if p.requires_grad]
    params = precision.optimizer_params(model)     # 3: the parameters, or O2's fp32 masters (same order)
    if adopted:                                    #    a user's optimizer: remapped in place, groups kept
        stepped = {id(p): q for p, q in zip(trainable, params)}
        current = dict(model.named_parameters())
        remap_params(optimizer, {old: stepped.get(id(current[name]), current[name]) for old, name in names.items()})
        built_by = None
    else:                                          #    the built-in loop: the recipe's, built by its switches
        built_by, optimizer = build_run_optimizer(params, recipe)   # (techniques.OPTIMIZER_ORDER)
        scheduler = build_scheduler(optimizer, recipe.warmup_steps)
    forward = apply_compile(trained, recipe.compile)                                                 # 4
    rebuilt = apply_optimizer_switches(optimizer, recipe, scheduler, built_by)                       # 5
    if rebuilt is not optimizer:
        optimizer.register_step_pre_hook(refuse_rebuilt_step)
    optimizer = rebuilt
    masters = any(q is not p for p, q in zip(trainable, params))
    clipped = [p for group in optimizer.param_groups for p in group["params"]]
    return TrainState(model, forward, optimizer, scheduler if scheduler is not None else NoSchedule(), precision,
                      Clipper(recipe.grad_clip, clipped), recipe, build_nonfinite_policy(recipe, dist.agree_finite),
                      dist.grad_sync(trained),
                      guard_optimizer=precision.scales_loss or masters or recipe.grad_accum_steps > 1)


def refuse_rebuilt_step(optimizer, args, kwargs) -> None:
    raise BackwardOutsideSession(
        f"this optimizer was rebuilt by Session.setup() for the recipe's {'/'.join(optimizer_fields())} and no longer "
        "trains the model: step the optimizer that setup() returned")


class NoSchedule:
    """A user's loop without a scheduler: nothing to step, nothing to save."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass
