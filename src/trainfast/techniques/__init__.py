"""One small module per technique; each declares its switch once (`SWITCHES`, techniques/switch.py), says whether
it can act on the current device or model, and how it is applied (`apply_*` / `build_*`).

Everything other parts of trainfast keep about the switches is derived here from those declarations: the
ablation's ladders (`rung_table`, `default_ladder`), the fields paired timing must not split (`process_fields`),
the fields a resume may change (`resumable_fields`), the tune's priorities, what the framework adapters cannot
set (`unreachable`), and `field_effect`, which tells a real measurement from a switch that does nothing here.

The package imports torch only when a function here is called: techniques/threads.py is read before torch loads,
so the declarations are collected on first use, not at import.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from . import memory_reuse, threads  # neither imports torch
from .switch import ADAPTERS, AMP, EVERY_ADAPTER, ON_MODEL, RungSpec, Switch

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .base import Effect

__all__ = ["ADAPTERS", "AMP", "EVERY_ADAPTER", "ON_MODEL", "RungSpec", "Switch", "switches", "owner", "rung_table",
           "default_ladder", "process_fields", "resumable_fields", "tune_priority", "input_switches",
           "unreachable", "model_switches", "apply_model_switches", "field_effect",
           "process_env", "process_wide_in_effect", "PROCESS_WIDE"]

# The switches that reach a process through the environment it starts with (the OpenMP wait policy, glibc's
# malloc settings), whatever its code: the ablation starts a user's command with them, so they act on a script
# that the recipe cannot reach otherwise (no trainfast.Session, no framework adapter). Read before torch loads,
# so named here from the two modules that do not import it; tests/test_switches.py checks it equals the
# declarations' `environment` switches.
_PROCESS_MODULES = (threads, memory_reuse)
PROCESS_WIDE = tuple(m.FIELD for m in _PROCESS_MODULES)



@functools.cache
def switches() -> tuple[Switch, ...]:
    """Every declaration, from every module of this package (and the run's settings, settings.py), in module
    order. A new technique module is found by itself: its SWITCHES tuple is all it needs."""
    found: list[Switch] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.extend(getattr(module, "SWITCHES", ()))
    return tuple(found)


@functools.cache
def owners() -> dict[str, Switch]:
    """Recipe field -> the switch that owns it. Two owners of one field is a declaration error."""
    table: dict[str, Switch] = {}
    for switch in switches():
        for name in switch.fields:
            if name in table:
                raise LookupError(f"Recipe field {name!r} is declared by two switches: {table[name].name!r} and "
                                  f"{switch.name!r}")
            table[name] = switch
    return table


def owner(field: str) -> Switch:
    try:
        return owners()[field]
    except KeyError:
        raise LookupError(f"Recipe field {field!r} has no switch declaration (techniques/*.py SWITCHES)") from None


def _rungs() -> list[RungSpec]:
    return [rung for switch in switches() for rung in switch.rungs]


def rung_table(task: str | None = "classification") -> dict[str, dict[str, Any]]:
    """Every rung `task` can name (None: a user's script, every rung), in ladder order (baseline first): name ->
    the fields it changes ("{amp}" for the device's half type). Ties in place keep declaration order."""
    named = sorted((r for r in _rungs() if r.named_in(task)), key=lambda r: r.place_in(task or ""))
    return {"baseline": {}, **{r.name: dict(r.changes) for r in named}}


def default_ladder(task: str = "classification") -> dict[str, dict[str, Any]]:
    """The rungs `task` runs when --switches names none, in ladder order."""
    keep = {r.name for r in _rungs() if task in r.default_in}
    return {name: changes for name, changes in rung_table(task).items() if name == "baseline" or name in keep}


def process_fields() -> tuple[str, ...]:
    """The fields whose setting belongs to the process, not to a run (never paired inside one process)."""
    return tuple(f for s in switches() if s.process for f in s.fields)


def resumable_fields() -> frozenset[str]:
    """The fields a run may change when it resumes from a checkpoint without changing its trajectory."""
    return frozenset(f for s in switches() for f in s.resumable_fields)


def tune_priority(task: str | None = None) -> tuple[str, ...]:
    """The tune's first stage, after the precision levels, in its priority order (a tight budget cuts the last);
    with `task`, only the rungs that task can name."""
    return tuple(r.name for r in sorted((r for r in _rungs() if r.tune is not None
                                         and (task is None or r.named_in(task))), key=lambda r: r.tune))


def input_switches() -> tuple[str, ...]:
    """The rungs the tune's input stage tries once a recipe waits for its batches, in its order."""
    return tuple(r.name for r in sorted((r for r in _rungs() if r.tune_inputs is not None),
                                        key=lambda r: r.tune_inputs))


def unreachable(adapter: str, fields: dict[str, Any]) -> dict[str, str]:
    """Of a run's switched `fields`, those the framework `adapter` cannot set, each with why (the adapters record
    them before the run); a field at the value every framework gives it anyway (`served_value`) is not one."""
    return {f: why for s in switches() if (why := s.reason_unreachable(adapter))
            for f in s.fields if f in fields and not (s.served_value is not None and fields[f] == s.served_value)}


def model_switches(adapter: str | None = None) -> list[tuple[str, Switch]]:
    """(field, switch) of the switches that act on the model object; with `adapter`, those it sets on the model
    (ON_MODEL) rather than through a setting of its own."""
    return [(s.fields[0], s) for s in switches() if s.model is not None
            and (adapter is None or s.frameworks.get(adapter) == ON_MODEL)]


def apply_model_switches(model: nn.Module, recipe) -> nn.Module:
    """The recipe's switches that act on the model object (Switch.model: checkpointing, memory format), those it
    turns on, in declaration order. Off leaves the model as it is: a Session adopts the user's model as the user
    made it. One that cannot act on this model is left alone: the ablation rules it out before a run, why said."""
    for name, switch in model_switches():
        value = getattr(recipe, name)
        if not value:
            continue
        how = switch.model
        target = how.target(model) if how.target is not None else model
        if switch.model_effect is not None and not switch.model_effect(target).acts:
            continue
        switched = how.apply(target, value)
        model = switched if target is model else model
    return model


def process_env(fields) -> dict[str, str]:
    """The variables a process must start with for the process-wide switches a recipe (or a run's dict of
    switched fields) turns on: what the ablation adds to a command's environment, and what keeps them."""
    return {k: v for m in _PROCESS_MODULES for k, v in m.process_env(fields).items()}


def process_wide_in_effect() -> dict[str, bool]:
    """Each process-wide switch read back in this process: whether it started with (or set) the setting."""
    return {m.FIELD: m.in_effect() for m in _PROCESS_MODULES}


def field_effect(field: str, device: torch.device, model: nn.Module | None, value: Any = None) -> Effect:
    """Whether the switch owning `field` can act on `device` and `model` (None: a user's script, whose model is
    not known before it runs, counts as acting). The data's part (decode_cache on an image folder, ...) is the
    task's (tasks/effects.py: data_effect)."""
    from .base import ACTS

    switch = owners().get(field)
    on_device = ACTS
    if switch is not None and switch.device_effect is not None:
        on_device = switch.device_effect(device)
        if not on_device.acts:
            return on_device
    if switch is not None and switch.model_effect is not None and model is not None:
        on_model = switch.model_effect(model)
        if not on_model.acts:
            return on_model
    if switch is not None and switch.value_effect is not None and value is not None:
        return switch.value_effect(value, device, model)
    return on_device
