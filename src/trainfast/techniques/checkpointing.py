"""Activation checkpointing: the forward pass keeps only some activations and the backward pass recomputes
the rest, so a step needs less memory for about one more forward's compute. A memory technique: a step gets
slower, and a larger batch or model fits. It acts through the model's own switch, which knows where its
blocks begin and end: timm's `set_grad_checkpointing`, transformers' `gradient_checkpointing_enable`."""
from __future__ import annotations

from torch import nn

from .base import ACTS, Effect


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
    return model


def set_checkpointing(model: nn.Module, enabled: bool) -> None:
    """On or off through the model's own switch: a framework's baseline turns off what its script turned on."""
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
