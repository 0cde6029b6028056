"""Activation checkpointing: the forward pass keeps only some activations and the backward pass recomputes
the rest, so a step needs less memory for about one more forward's compute. A memory technique: a step gets
slower, and a larger batch or model fits. It acts through the model's own switch, which knows where its
blocks begin and end: timm's `set_grad_checkpointing`, transformers' `gradient_checkpointing_enable`."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .base import ACTS, Effect
from .switch import ON_MODEL, ModelSwitch, RungSpec, Switch


def supports(model: nn.Module) -> bool:
    return hasattr(model, "set_grad_checkpointing") or hasattr(model, "gradient_checkpointing_enable")


def effect(model: nn.Module | None) -> Effect:
    if model is None or supports(model):
        return ACTS
    return Effect(False, "the model has no checkpointing switch of its own (timm's set_grad_checkpointing, "
                         "transformers' gradient_checkpointing_enable)", applies=False)


def apply_checkpointing(model: nn.Module, enabled: bool) -> nn.Module:
    """`model` with checkpointing switched on where it has a switch (a model without one is left as it is:
    `effect` rules the switch out before a run)."""
    if not enabled:
        return model
    if hasattr(model, "set_grad_checkpointing"):
        model.set_grad_checkpointing(True)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable()
    count_norm_statistics_once(model)
    return model


# --- batch norm under recomputation ---------------------------------------------------------------------
# The recomputation runs a checkpointed block's forward again, inside backward. A batch norm in training mode
# would update its running statistics a second time from the same batch: the momentum applied twice a step
# and num_batches_tracked counting double, so the model evaluates with other statistics than it would without
# checkpointing (an accuracy change the ablation would pin on the switch). In the recomputation each norm's
# running statistics are put back after its forward: the step's normalization is the same either way (it uses
# the batch's statistics), only the bookkeeping is kept to once.

def count_norm_statistics_once(model: nn.Module) -> None:
    for module in model.modules():
        if (isinstance(module, _BatchNorm) and module.track_running_stats
                and not getattr(module, "_trainfast_stats_once", False)):
            module.register_forward_pre_hook(_keep_statistics)
            module.register_forward_hook(_put_statistics_back)
            module._trainfast_stats_once = True


def _recomputing() -> bool:
    """A forward inside the autograd engine's backward pass: the checkpoint's recomputation."""
    return torch._C._current_graph_task_id() != -1


def _statistics(module: _BatchNorm) -> list[torch.Tensor]:
    return [b for b in (module.running_mean, module.running_var, module.num_batches_tracked) if b is not None]


def _keep_statistics(module: _BatchNorm, args) -> None:
    if module.training and _recomputing():
        module._trainfast_kept = [b.clone() for b in _statistics(module)]


def _put_statistics_back(module: _BatchNorm, args, output) -> None:
    kept = module.__dict__.pop("_trainfast_kept", None)
    if kept is not None:
        with torch.no_grad():
            for buffer, saved in zip(_statistics(module), kept):
                buffer.copy_(saved)


def set_checkpointing(model: nn.Module, enabled: bool) -> None:
    """On or off through the model's own switch: a framework's baseline turns off what its script turned on."""
    if enabled:
        count_norm_statistics_once(model)
    if hasattr(model, "set_grad_checkpointing"):
        model.set_grad_checkpointing(enabled)
    elif enabled:
        model.gradient_checkpointing_enable()
    elif hasattr(model, "gradient_checkpointing_disable"):
        model.gradient_checkpointing_disable()


def is_checkpointing(model: nn.Module) -> bool:
    """Read back: transformers' flag, or timm's (`grad_checkpointing` on the model or its stages)."""
    if getattr(model, "is_gradient_checkpointing", False):
        return True
    return any(getattr(m, "grad_checkpointing", False) for m in model.modules())


def holder(model: nn.Module) -> nn.Module:
    """The outermost module with a checkpointing switch of its own (a LightningModule or a script's wrapper holds
    the timm/transformers model inside), `model` itself when none has one."""
    return next((m for m in model.modules() if supports(m)), model)


def switch_checkpointing(model: nn.Module, enabled: bool) -> nn.Module:
    set_checkpointing(model, enabled)
    return model


SWITCHES = (
    Switch(("activation_checkpointing",),
           rungs=(RungSpec("checkpointing", {"activation_checkpointing": True}, place=71, tune_memory=2),),
           model_effect=effect,
           shrinks={"activations": "activation_checkpointing"},
           model=ModelSwitch("activation checkpointing", switch_checkpointing, is_checkpointing, target=holder),
           frameworks={"transformers": "TrainingArguments.gradient_checkpointing",
                       "lightning": ON_MODEL, "accelerate": ON_MODEL}),
)
