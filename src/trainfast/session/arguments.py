"""What Session.setup() refuses before it builds anything: its arguments out of order (the model first, then the
optimizer or None), and strategy=dp with a script's own optimizer or loaders."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..recipe import Recipe, RecipeError


def check_setup(model: Any, optimizer: Any, loaders: bool, recipe: Recipe) -> None:
    """What Session.setup() refuses before it builds anything: arguments out of order, and strategy=dp with the
    script's own optimizer or loaders."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"Session.setup(): the first argument must be the model (an nn.Module), got "
                        f"{type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"Session.setup(): the second argument must be the optimizer (or None), got "
                        f"{type(optimizer).__name__}: tf.setup(model, optimizer, loader)")
    if recipe.strategy == "dp" and (optimizer is not None or loaders):
        raise RecipeError("strategy=dp computes the loss inside each replica, which only the built-in loop "
                          "can do (trainfast.train); use strategy=ddp under torchrun")
