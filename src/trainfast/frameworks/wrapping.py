"""The wrap switches (techniques/switch.py: WrapSwitch: DDP's bucket size, gradients as bucket views, a
communication hook) through a framework's own DDP settings, set and read back the same way for every adapter.

Each framework builds its DDP wrapper from a settings object of its own: Lightning's DDPStrategy passes its keyword
arguments to DistributedDataParallel, Accelerate's DistributedDataParallelKwargs (among the Accelerator's
kwargs_handlers) holds DDP's keywords as fields, and the transformers Trainer fills one of those from its
TrainingArguments (`ddp_bucket_cap_mb`). A wrap switch declares the DDP keyword that holds it (WrapSwitch.keyword)
and the Trainer's argument (WrapSwitch.trainer_argument), so each adapter hands this module how to read and set a
keyword on its object, and the proof is read from the DDP wrapper the framework built (a job of several processes)
or, where there is none (one process), from the settings object it would be built from. A communication hook is no
DDP keyword: Accelerate's handler names the one it registers (`comm_hook`, WrapSwitch.comm_hook).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..techniques import WrapSwitch, wrap_switches
from .board import UNSET, FrameworkRecord

COMM_HOOK = "comm_hook"      # Accelerate's DistributedDataParallelKwargs field that names the hook it registers


def ddp_settings(fields: dict[str, Any], trainer: bool = False) -> list[tuple[str, WrapSwitch, str]]:
    """(field, hooks, setting) of the DDP wrap switches among `fields` that a framework's settings hold: the DDP
    keyword (Lightning, Accelerate), or with `trainer` the Trainer's argument."""
    found = []
    for name, hooks in wrap_switches("ddp"):
        setting = hooks.trainer_argument if trainer else hooks.keyword
        if name in fields and setting:
            found.append((name, hooks, setting))
    return found


def switch_ddp_settings(record: FrameworkRecord, fields: dict[str, Any], had: Callable[[str], Any],
                        put: Callable[[str, Any], None], trainer: bool = False) -> None:
    """Each wrap switch the run asks for, on a framework's DDP settings: `had(setting)` the script's own value
    (None: unset), `put(setting, value)` sets it (None: back to DDP's own default, which the baseline asks for).
    Recorded as the state the wrapper will read back (WrapSwitch.show), beside the script's own."""
    for name, hooks, setting in ddp_settings(fields, trainer):
        value = hooks.options(fields[name]).get(hooks.keyword)
        script = had(setting)
        record.set(name, setting, hooks.show(value), UNSET if script is None else hooks.show(script))
        put(setting, value)


def hook_settings(fields: dict[str, Any]) -> list[tuple[str, WrapSwitch, str]]:
    """(field, hooks, setting) of the communication hooks among `fields` that Accelerate's
    DistributedDataParallelKwargs(comm_hook=...) registers (WrapSwitch.comm_hook): one setting each, named
    "comm_hook=<its name>", whose value is whether DDP all-reduces through that hook."""
    return [(name, hooks, f"{COMM_HOOK}={hooks.comm_hook}") for name, hooks in wrap_switches("ddp")
            if hooks.comm_hook and name in fields]


def switch_comm_hook(record: FrameworkRecord, fields: dict[str, Any], had: str | None,
                     put: Callable[[str | None, dict[str, Any]], None]) -> None:
    """The communication hook switches on a handler that holds one hook (DDP takes one): `put(name, state
    options)` the hook the run turns on (None: none, the baseline's), `had` the script's own hook's name (None:
    none). Each recorded as whether its hook is registered, beside whether the script's was it."""
    found = hook_settings(fields)
    on = next(((hooks.comm_hook, dict(hooks.comm_state(fields[name]))) for name, hooks, _ in found if fields[name]),
              (None, {}))
    for name, hooks, setting in found:
        record.set(name, setting, bool(fields[name]), UNSET if had is None else had == hooks.comm_hook)
    if found:
        put(*on)


def prove_ddp_settings(record: FrameworkRecord, model: Any, read: Callable[[str], Any]) -> None:
    """Each wrap switch set on this framework, read back from the DDP wrapper around `model` (WrapSwitch.state), or
    where there is none (one process builds no wrapper) from its settings object: `read(setting)`."""
    wrapped = find_ddp(model)
    for _, hooks in wrap_switches("ddp"):
        for setting in {hooks.keyword, hooks.trainer_argument} & set(record.switches):
            record.prove(setting, hooks.state(wrapped) if wrapped is not None else hooks.show(read(setting)))
        setting = f"{COMM_HOOK}={hooks.comm_hook}"
        if hooks.comm_hook and setting in record.switches:      # registered: the hook DDP all-reduces through
            record.prove(setting, bool(hooks.state(wrapped)) if wrapped is not None
                         else str(read(COMM_HOOK)) == hooks.comm_hook)


def find_ddp(model: Any) -> torch.nn.parallel.DistributedDataParallel | None:
    """The DistributedDataParallel object at or inside `model` (through a compiled wrapper or a framework's own
    module wrappers), or None."""
    for _ in range(6):
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model
        model = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if model is None:
            return None
    return None
