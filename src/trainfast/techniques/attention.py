"""The attention backend of a transformers model: which kernel computes softmax(QK^T)V. `eager` is the model's
own matrix products (the whole score matrix in memory), `sdpa` torch's scaled_dot_product_attention (fused
kernels where the device has them: flash and memory-efficient on CUDA, a fused kernel on CPU; transformers'
default where torch has it), `flex` torch's flex_attention (a compiled kernel that skips the blocks a mask
rules out: packed documents never attend across each other at no cost), `flash` the flash-attn package's
kernels (CUDA, with a variable-length path for packed batches). They compute the same attention; they differ by
large factors in time and memory, and by device. Set through the model's own `set_attn_implementation`, read back
from its config."""
from __future__ import annotations

import importlib.util
from typing import Any

import torch

from ..recipe import ATTENTION
from .base import ACTS, Effect
from .switch import ON_MODEL, ModelSwitch, RungSpec, Switch

# the Recipe's names -> transformers' attn_implementation
BACKENDS = {"eager": "eager", "sdpa": "sdpa", "flex": "flex_attention", "flash": "flash_attention_2"}
CHOICES = ATTENTION               # "model": whatever the model was built with (transformers' default)
SUPPORT_FLAG = {"sdpa": "_supports_sdpa", "flex": "_supports_flex_attn", "flash": "_supports_flash_attn"}


def holder(model: Any) -> Any:
    """The transformers model inside `model` (a LightningModule or a wrapper holds it), `model` itself when none."""
    if hasattr(model, "set_attn_implementation"):
        return model
    modules = model.modules() if hasattr(model, "modules") else ()
    return next((m for m in modules if hasattr(m, "set_attn_implementation")), model)


def in_use(model: Any) -> str | None:
    """The backend the model's config names, in the Recipe's names (None: not a transformers model)."""
    config = getattr(model, "config", None)
    name = getattr(config, "_attn_implementation", None)
    return next((ours for ours, theirs in BACKENDS.items() if theirs == name), name)


def set_attention(model: Any, value: str) -> Any:
    if value != "model":
        model.set_attn_implementation(BACKENDS[value])
    return model


def backend_effect(value: str, device: torch.device, model: Any) -> Effect:
    """Whether backend `value` can run on `device` for `model` (None: a script's, not known before it runs), and
    whether the model already uses it."""
    if value == "model":
        return ACTS
    if value == "flash":
        if device.type != "cuda":
            return Effect(False, "flash attention (the flash-attn package) runs on CUDA GPUs only", applies=False)
        if importlib.util.find_spec("flash_attn") is None:
            return Effect(False, "flash attention needs the flash-attn package (pip install flash-attn), not "
                                 "installed here", applies=False)
    if model is None:
        return ACTS
    target = holder(model)
    if not hasattr(target, "set_attn_implementation"):
        return Effect(False, "the attention backend is a transformers model's setting; this model computes its "
                             "attention in its own code", applies=False)
    if not getattr(target, SUPPORT_FLAG.get(value, ""), True):
        return Effect(False, f"{type(target).__name__} has no {value} attention in transformers", applies=False)
    if in_use(target) == value:
        return Effect(False, f"already on: the model computes its attention with {value}", applies=False)
    return ACTS


# The backends with a variable-length path: they skip the blocks across documents, so padding-free batches pack a
# whole batch in one row (the others keep rows bounded: their cost grows with a row's length squared).
VARLEN = ("flex", "flash")


def packs_one_row(recipe) -> bool:
    """Whether the recipe's backend packs a padding-free batch in one row (text/batching.py: PackCollate)."""
    return recipe.attention in VARLEN


SWITCHES = (
    Switch(("attention",),
           rungs=(RungSpec("eager", {"attention": "eager"}, place=35.5, tasks=("lm",)),    # what sdpa buys, named
                  RungSpec("sdpa", {"attention": "sdpa"}, place=36, tasks=("lm",), default_in=("lm",)),
                  RungSpec("flex", {"attention": "flex"}, place=37, tasks=("lm",)),
                  RungSpec("flash", {"attention": "flash"}, place=38, tasks=("lm",), default_in=("lm",))),
           value_effect=backend_effect,
           model=ModelSwitch("attention backend", set_attention, in_use, show=lambda v: v, default=None,
                             target=holder, idle=("model",)),
           frameworks={"transformers": ON_MODEL, "lightning": ON_MODEL, "accelerate": ON_MODEL}),
)
