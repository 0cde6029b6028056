"""One small module per technique; each says whether it can act on the current device or model
(`effect`), and how it is applied (`apply_*` / `build_*`). `field_effect` maps a Recipe field to the
technique that owns it, so the ablation can tell a real measurement from a switch that does nothing here.

The package imports torch only when a function here is called: techniques/threads.py is read before torch loads.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from . import memory_reuse, threads      # neither imports torch

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .base import Effect


# The switches that reach a process through the environment it starts with (the OpenMP wait policy, glibc's
# malloc settings), whatever its code: the ablation starts a user's command with them, so they act on a script
# that the recipe cannot reach otherwise (no trainfast.Session, no framework adapter).
_PROCESS_MODULES = (threads, memory_reuse)
PROCESS_WIDE = tuple(m.FIELD for m in _PROCESS_MODULES)


def process_env(fields) -> dict[str, str]:
    """The variables a process must start with for the process-wide switches a recipe (or a run's dict of
    switched fields) turns on: what the ablation adds to a command's environment, and what keeps them."""
    return {k: v for m in _PROCESS_MODULES for k, v in m.process_env(fields).items()}


def process_wide_in_effect() -> dict[str, bool]:
    """Each process-wide switch read back in this process: whether it started with (or set) the setting."""
    return {m.FIELD: m.in_effect() for m in _PROCESS_MODULES}


def field_effect(field: str, device: torch.device, model: nn.Module | None, split=None) -> Effect:
    """`split`: the run's data (data.datasets.Split), for the techniques that act on files only; when
    it is not given they count as acting. `model` None (a user's script: its model is not known before it
    runs): the techniques that depend on the model count as acting."""
    from . import compile as compile_
    from . import checkpointing, device_decode, grouping, memory_format, memory_reuse, prefetch, runtime, threads
    from . import transfer
    from .base import ACTS, Effect

    if field == "decode_cache":
        from ..data.decoded_cache import effect as decode_cache_effect

        return decode_cache_effect(split)
    if field == "device_decode":
        from ..data.decoded_cache import effect as folder_effect

        acts = device_decode.effect(device)
        if acts.acts and not folder_effect(split).acts:
            return Effect(False, "device_decode decodes image-folder files; this data is already in memory",
                          applies=False)
        return acts
    if field in ("non_blocking", "pin_memory"):
        return transfer.effect(device)
    if field == "prefetch":
        return prefetch.effect(device)
    if field == "channels_last":
        return memory_format.effect(model) if model is not None else ACTS
    if field == "compile":
        return compile_.effect(device)
    if field == "cudnn_benchmark":
        return runtime.cudnn_effect(device)
    if field == "activation_checkpointing":
        return checkpointing.effect(model)
    if field == "group_aspect_ratio":
        return grouping.effect(model, split)
    if field == "passive_threads":
        return threads.effect()
    if field == memory_reuse.FIELD:
        return memory_reuse.effect()
    return ACTS


def changes_effect(changed: dict, device: torch.device, model: nn.Module | None, split=None,
                   effect_of: Callable[..., Effect] = field_effect) -> Effect:
    """A set of switched fields acts if any one of them acts; otherwise say why none does. `effect_of`: a
    task's own judgement of a field (tasks/detection.py), by default the techniques'."""
    from .base import Effect

    effects = [effect_of(name, device, model, split) for name in changed]
    if not effects or any(e.acts for e in effects):
        reasons = [e.reason for e in effects if e.reason]
        return Effect(True, "; ".join(reasons))
    return Effect(False, "; ".join(dict.fromkeys(e.reason for e in effects)), applies=all(e.applies for e in effects))
