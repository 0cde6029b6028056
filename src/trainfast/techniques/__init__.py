"""One small module per technique; each declares its switch once (`SWITCHES`, techniques/switch.py), says whether
it can act on the current device or model, and how it is applied (`apply_*` / `build_*`).

Everything other parts of trainfast keep about the switches is derived here from those declarations: the
ablation's ladders (`rung_table`, `default_ladder`), the fields paired timing must not split (`own_process_fields`),
the fields a resume may change (`resumable_fields`), the tune's priorities, what the framework adapters cannot
set (`unreachable`), and `device_model_effect`, which tells a real measurement from a switch that does nothing here.

The process switches (ProcessWideSwitch: a thread policy, the allocator, a library-wide flag) are looped over here
too: the environment a run starts with (`process_env`, `starting_with`), `trainfast train`'s start-up before torch
loads (`set_before_torch`), a running process's setting (`apply_process_wide_switches`), every run's read-back
(`process_wide_in_effect`) and the guard that never times the default under a switch's name (`not_in_effect`).

The package imports torch only when a function here is called: the process switches' modules are read before
torch loads, so the declarations are collected on first use, not at import.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
import pkgutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Iterator

from .switch import (ADAPTERS, AMP, EVERY_ADAPTER, ON_MODEL, BatchSwitch, OptimizerSwitch, ProcessWideSwitch, RungSpec,
                     Switch, TrainBatches, WrapSwitch)

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .base import Effect

__all__ = ["ADAPTERS", "AMP", "EVERY_ADAPTER", "ON_MODEL", "ProcessWideSwitch",
           "RungSpec", "Switch", "switches", "owner",
           "rung_table", "default_ladder", "own_process_fields", "math_fields", "resumable_fields", "tune_priority",
           "input_switches", "input_rung_specs",
           "unreachable", "MODEL_ORDER", "model_switches", "apply_model_switches", "device_model_effect",
           "process_wide_switches",
           "OptimizerSwitch", "OPTIMIZER_ORDER", "optimizer_switches", "optimizer_fields", "build_run_optimizer",
           "apply_optimizer_switches",
           "process_env", "process_wide_in_effect", "process_wide_fields", "starting_with", "set_before_torch",
           "apply_process_wide_switches", "not_in_effect", "needs_fresh_process", "WrapSwitch", "WRAP_ORDER",
           "wrap_switches", "wrap_options", "apply_wrap_switches", "read_wrap_switches", "ranks_effect",
           "BatchSwitch", "TrainBatches",
           "batch_switches", "batch_fields", "asked_batches", "collate_batches", "choose_sampler",
           "choose_batch_sampler", "batch_refusals",
           "loss_switches", "task_loss", "unreached_losses", "recipe_rewrites", "apply_recipe_rewrites",
           "unapplied_rewrites", "rewritten_settings", "memory_rung_specs", "target_rung_specs", "memory_shrinkers",
           "prepare_once", "held_input_rungs"]

# The modules that declare a process switch (Switch.process_wide): a process's start-up reads them before torch
# loads (`trainfast train`'s early start, the environment the ablation spawns a run with), so they are named here
# and imported by name, never by collecting every technique module (most import torch). None of them imports
# torch at its top. tests/test_switches.py checks this list against the declarations.
PROCESS_WIDE_MODULES = ("threads", "memory_reuse", "matmul_precision")


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


def own_process_fields() -> tuple[str, ...]:
    """The fields whose setting belongs to the process, not to a run (never paired inside one process)."""
    return tuple(f for s in switches() if s.own_process or s.process_wide for f in s.fields)


def math_fields() -> frozenset[str]:
    """The fields whose switch changes the arithmetic of training (Switch.changes_math): a rung that changes one
    follows another trajectory, so it is judged on its time to a target, not on its rate alone."""
    return frozenset(f for s in switches() if s.changes_math for f in s.fields)


def resumable_fields() -> frozenset[str]:
    """The fields a run may change when it resumes from a checkpoint without changing its trajectory."""
    return frozenset(f for s in switches() for f in s.resumable_fields)


def tune_priority(task: str | None = None) -> tuple[str, ...]:
    """The tune's first stage, after the precision levels, in its priority order (a tight budget cuts the last);
    with `task`, only the rungs that task can name."""
    return tuple(r.name for r in sorted((r for r in _rungs() if r.tune is not None
                                         and (task is None or r.named_in(task))), key=lambda r: r.tune))


def input_rung_specs() -> tuple[RungSpec, ...]:
    """The rungs the tune's input stage tries once a recipe waits for its batches, in its order; each says the
    recipe changes it tries (RungSpec.tune_steps)."""
    return tuple(sorted((r for r in _rungs() if r.tune_inputs is not None), key=lambda r: r.tune_inputs))


def memory_rung_specs(task: str | None = None) -> tuple[RungSpec, ...]:
    """The rungs the tune's memory stage tries (RungSpec.tune_memory), in its order; with `task`, those it can name."""
    return tuple(sorted((r for r in _rungs() if r.tune_memory is not None and (task is None or r.named_in(task))),
                        key=lambda r: r.tune_memory))


def target_rung_specs(task: str | None = None) -> tuple[RungSpec, ...]:
    """The rungs the tune's to-target stage tries on the rate pick (RungSpec.tune_target), in its order; with
    `task`, those it can name."""
    return tuple(sorted((r for r in _rungs() if r.tune_target is not None and (task is None or r.named_in(task))),
                        key=lambda r: r.tune_target))


def prepare_once(split, recipes) -> None:
    """Each switch with a `prepare` hook (Switch.prepare) that one of `recipes` turns on: what its runs read, made
    once, before them, from the first recipe that turns it on."""
    for switch in (s for s in switches() if s.prepare is not None):
        on = next((r for r in recipes if any(getattr(r, f) for f in switch.fields)), None)
        if on is not None:
            switch.prepare(split, on)


def held_input_rungs() -> tuple[RungSpec, ...]:
    """The rungs the report names where an epoch is held by its input (RungSpec.held_note), in its order."""
    return tuple(sorted((r for r in _rungs() if r.held_note is not None), key=lambda r: r.held_note[0]))


def memory_shrinkers() -> dict[str, str]:
    """Memory category -> the switches that shrink it (Switch.shrinks), in words, in declaration order."""
    found: dict[str, list[str]] = {}
    for switch in switches():
        for item, how in switch.shrinks.items():
            found.setdefault(item, []).append(how)
    return {item: ", or ".join(hows) for item, hows in found.items()}


def input_switches() -> tuple[str, ...]:
    """The names of the input stage's rungs, in its order (what --switches takes for it)."""
    return tuple(r.name for r in input_rung_specs())


def unreachable(adapter: str, fields: dict[str, Any]) -> dict[str, str]:
    """Of a run's switched `fields`, those the framework `adapter` cannot set, each with why (the adapters record
    them before the run); a field at the value every framework gives it anyway (`served_value`) is not one."""
    return {f: why for s in switches() if (why := s.reason_unreachable(adapter))
            for f in s.fields if f in fields and not (s.served_value is not None and fields[f] == s.served_value)}


# The order the switches that act on the model object are applied in, written once, with why each sits where it
# does. The Session (so the built-in run), and every framework adapter apply them in this order, after the model
# reaches its device and before the precision level casts its weights, the process group wraps it and compile
# traces it (session/build.py); tests/test_switches.py fails when a model switch is missing here.
MODEL_ORDER: tuple[tuple[str, str], ...] = (
    ("attention", "first: it swaps the implementation inside every attention layer (transformers' "
                  "set_attn_implementation), so the layers checkpointing wraps already hold the backend that runs"),
    ("activation_checkpointing", "before the memory format, the precision cast, the wrap and compile: it changes "
                                 "which blocks keep their activations, and compile must trace the checkpointed "
                                 "blocks (compiling first would hide them from it)"),
    ("channels_last", "last of the model switches: it converts the weights' layout in place once the model is on its "
                      "device (the copy to the device would otherwise keep the old one), and the O2/O3 cast and "
                      "compile that follow keep the layout it set"),
)


def ordered_model_switches(found: list[tuple[str, Switch]]) -> list[tuple[str, Switch]]:
    """`found` (field, switch) pairs in MODEL_ORDER's order; a model switch the order does not place is an error
    (its place would otherwise be an accident of module names)."""
    place = {name: index for index, (name, _) in enumerate(MODEL_ORDER)}
    missing = [name for name, _ in found if name not in place]
    if missing:
        raise LookupError(f"model switch(es) {', '.join(missing)} not placed in techniques.MODEL_ORDER: add each "
                          "where it must run relative to the others, with why")
    return sorted(found, key=lambda pair: place[pair[0]])


def model_switches(adapter: str | None = None) -> list[tuple[str, Switch]]:
    """(field, switch) of the switches that act on the model object, in MODEL_ORDER; with `adapter`, those it
    sets on the model (ON_MODEL) rather than through a setting of its own."""
    return ordered_model_switches([(s.fields[0], s) for s in switches() if s.model is not None
                                   and (adapter is None or s.frameworks.get(adapter) == ON_MODEL)])


def apply_model_switches(model: nn.Module, recipe) -> nn.Module:
    """The recipe's switches that act on the model object (Switch.model: attention backend, checkpointing, memory
    format), those it turns on, in MODEL_ORDER. Off leaves the model as it is: a Session adopts the user's model as
    the user made it. One that cannot act on this model is left alone: the ablation rules it out before a run, why
    said."""
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


# The order the switches that act on the optimizer are applied in, written once, with why each sits where it does.
# The built-in run builds its optimizer with the first switch that chooses the class (OptimizerSwitch.build), a
# Session and every framework adapter rebuild a user's in this order (session/build.py, frameworks/common.py), and
# a switch whose value builds a class of its own (OptimizerSwitch.replaces) rules out every switch after it.
# tests/test_switches.py fails when an optimizer switch is missing here.
OPTIMIZER_ORDER: tuple[tuple[str, str], ...] = (
    ("optimizer_state", "first: the low-bit states replace the optimizer's class (torchao's Adam, whose update is "
                        "one compiled kernel per tensor), so the built-in run builds that class instead of torch's "
                        "and the switches after it, which act on torch's classes, do not apply while it is on"),
    ("optimizer_impl", "after the class is chosen: foreach/fused are flags of torch's own optimizers' constructors, "
                       "so it builds torch's AdamW/SGD when nothing before it chose another class, and rebuilds a "
                       "user's torch optimizer as the same class with the flag"),
    ("compile_optimizer", "last: it compiles the step of the object that will run, so every switch that rebuilds "
                          "the optimizer as another object comes before it (a step compiled earlier would stay on "
                          "the object they replace); the low-bit Adam rules it out (torchao compiles its update)"),
)


def optimizer_switches() -> list[tuple[str, OptimizerSwitch]]:
    """(field, hooks) of the switches that act on the optimizer, in OPTIMIZER_ORDER; one the order does not place
    is an error (its place would otherwise be an accident of module names)."""
    place = {name: index for index, (name, _) in enumerate(OPTIMIZER_ORDER)}
    found = [(s.fields[0], s.optimizer) for s in switches() if s.optimizer is not None]
    missing = [name for name, _ in found if name not in place]
    if missing:
        raise LookupError(f"optimizer switch(es) {', '.join(missing)} not placed in techniques.OPTIMIZER_ORDER: add "
                          "each where it must act relative to the others, with why")
    return sorted(found, key=lambda pair: place[pair[0]])


def optimizer_fields() -> tuple[str, ...]:
    """The fields of the switches that act on the optimizer, in OPTIMIZER_ORDER."""
    return tuple(name for name, _ in optimizer_switches())


def build_run_optimizer(params, recipe) -> tuple[str, torch.optim.Optimizer]:
    """The built-in run's optimizer on `params`: built by the first switch in OPTIMIZER_ORDER whose value chooses
    the class (the low-bit Adam), else by the implementation flag's (torch's own class); with that field."""
    for name, how in optimizer_switches():
        built = how.build(params, recipe)
        if built is not None:
            return name, built
    raise LookupError("no optimizer switch built the optimizer: one in OPTIMIZER_ORDER must build torch's own")


def apply_optimizer_switches(optimizer: torch.optim.Optimizer, recipe, scheduler=None,
                             built_by: str | None = None) -> torch.optim.Optimizer:
    """`optimizer` with the recipe's optimizer switches, those it turns on (a value other than the switch's
    default), in OPTIMIZER_ORDER: a user's optimizer rebuilt (param groups kept, `scheduler` rebound), or the
    built-in run's, which the switch `built_by` has built already. A switch that replaces the class rules out
    the ones after it. Raises where a switch cannot act on this optimizer, with why."""
    for name, how in optimizer_switches():
        value = getattr(recipe, name)
        if value == how.default:
            continue
        if name != built_by:
            optimizer = how.rebuild(optimizer, value, scheduler)
        if how.replaces:
            break
    return optimizer


# The order the switches that act on the DDP / FSDP2 wrapper are applied in, written once beside MODEL_ORDER. As a
# kind they act after the model switches and the precision cast (the wrapper buckets or shards the parameters as
# they are then, in their final dtype and layout), before the optimizer is built on the wrapped parameters (FSDP2
# replaces them with shards) and before compile traces the wrapper (session/build.py). Their constructor options
# are given all at once (the wrapper is built once, with every one of them); then each one's work on the built
# wrapper runs in this order: a communication hook may be registered only once and before the first forward, so a
# switch that changes the buckets it runs over comes first. tests/test_switches.py fails when a wrap switch is
# missing here.
WRAP_ORDER: tuple[tuple[str, str], ...] = (
    ("strategy", "the wrapper itself (DDP or FSDP2): it is chosen before any of its options; nothing to apply"),
    ("ddp_bucket_mb", "first: its bucket size is a constructor option and does nothing once the wrapper is built, "
                      "so it is in place before any switch that works on the built wrapper's buckets"),
    ("gradient_as_bucket_view", "a constructor option too (the reducer lays its buckets and the gradients' views "
                                "out as DDP is built), beside the bucket size it lays them out with"),
    ("static_graph", "a constructor option as well: the reducer records the first step's graph and rebuilds its "
                     "buckets once in the order it saw, out of the bucket size and views set above"),
    ("bf16_compress_hook", "a communication hook, registered on the built wrapper once and before the "
                           "first forward, and compresses the buckets the options above laid out"),
    ("fp16_compress_hook", "beside bf16's, the same kind of hook: DDP takes only one (Recipe refuses two)"),
    ("powersgd_rank", "another communication hook, beside the two above (one at a time)"),
    ("reshard_after_forward", "FSDP2's fully_shard keyword, given to every call with the wrapper's other options"),
)


def wrap_switches(strategy: str | None = None) -> list[tuple[str, WrapSwitch]]:
    """(field, hooks) of the switches that act on the wrapper, in WRAP_ORDER; with `strategy`, those that act on
    that wrapper ("ddp", "fsdp"). A wrap switch the order does not place is an error, as for MODEL_ORDER."""
    place = {name: index for index, (name, _) in enumerate(WRAP_ORDER)}
    found = [(s.fields[0], s.wrap) for s in switches() if s.wrap is not None]
    missing = [name for name, _ in found if name not in place]
    if missing:
        raise LookupError(f"wrap switch(es) {', '.join(missing)} not placed in techniques.WRAP_ORDER: add each "
                          "where it must run relative to the others, with why")
    return sorted(((name, hooks) for name, hooks in found if strategy is None or strategy in hooks.strategies),
                  key=lambda pair: place[pair[0]])


def wrap_options(recipe, strategy: str) -> dict[str, Any]:
    """The `strategy` wrapper's constructor keywords the recipe's wrap switches ask for."""
    return {k: v for name, hooks in wrap_switches(strategy) for k, v in hooks.options(getattr(recipe, name)).items()}


def apply_wrap_switches(wrapped: nn.Module, recipe, strategy: str) -> None:
    """Each wrap switch's work on the built `strategy` wrapper (a communication hook), in WRAP_ORDER."""
    for name, hooks in wrap_switches(strategy):
        hooks.apply(wrapped, getattr(recipe, name))


def read_wrap_switches(wrapped: nn.Module, strategy: str) -> dict[str, Any]:
    """Each wrap switch of `strategy` read back from the wrapper a run built: field -> its state, the proof."""
    return {name: hooks.state(wrapped) for name, hooks in wrap_switches(strategy)}


def ranks_effect(field: str, ranks: int, strategy: str | None = None) -> Effect:
    """Whether the switch owning `field` can act in a job of `ranks` processes wrapped by `strategy` (Switch.ranks,
    WrapSwitch.strategies): a wrap switch in one process has no wrapper to act on, and one declared for DDP has
    nothing to act on in an FSDP2 job, so it is not applicable there, never timed as noise."""
    from .base import ACTS, Effect

    switch = owners().get(field)
    if switch is None:
        return ACTS
    if ranks < switch.ranks:
        return Effect(False, f"{field} acts on the data-parallel wrapper of a job of {switch.ranks} or more "
                             f"processes; this one runs {ranks} (ablate --nproc {switch.ranks}, torchrun "
                             f"--nproc-per-node {switch.ranks})", applies=False)
    if switch.wrap is not None and strategy is not None and strategy not in switch.wrap.strategies:
        return Effect(False, f"{field} acts on the {' / '.join(switch.wrap.strategies)} wrapper; this job wraps with "
                             f"strategy={strategy}", applies=False)
    return ACTS


def batch_switches() -> list[tuple[str, BatchSwitch]]:
    """(field, hooks) of the switches that act on the training batches (Switch.batch), in declaration order."""
    return [(s.fields[0], s.batch) for s in switches() if s.batch is not None]


def batch_fields() -> tuple[str, ...]:
    return tuple(name for name, _ in batch_switches())


def asked_batches(recipe) -> dict[str, Any]:
    """The batch switches a recipe turns on, with their values: what the built-in run and a Session act on."""
    return {name: getattr(recipe, name) for name in batch_fields() if getattr(recipe, name)}


def collate_batches(batches: TrainBatches, values: Mapping[str, Any], count: bool = False) -> Any:
    """The training collate function with the batch switches at `values` (field -> value; a switch not named is left
    alone): first those that set the collate function (the script's own collator, whose attribute a wrapper would
    hide), then, with `count`, the counting collator around it (text/packing.py: the padding of the script's
    batches, the proof of the switches that remove it), then those that wrap it. Also batches.collate."""
    for wrapping in (False, True):
        if wrapping and count:
            from ..text.packing import PackingCollator

            batches.collate = PackingCollator(batches.collate, pack=False, cannot=batches.cannot)
        for name, hooks in batch_switches():
            if name in values and hooks.collate is not None and hooks.wraps == wrapping:
                batches.collate = hooks.collate(batches, values[name])
    return batches.collate


def choose_sampler(batches: TrainBatches, values: Mapping[str, Any]) -> Any:
    """The sampler the batch switches at `values` draw the training order from (None: the loader's own stands)."""
    return _last_drawn(batches, values, "sampler")


def choose_batch_sampler(batches: TrainBatches, values: Mapping[str, Any]) -> Any:
    """The batch sampler a batch switch at `values` draws whole batches from (None: batch_size at a time)."""
    return _last_drawn(batches, values, "batch_sampler")


def _last_drawn(batches: TrainBatches, values: Mapping[str, Any], hook: str) -> Any:
    """What the last batch switch at `values` with the hook `hook` (BatchSwitch.sampler / .batch_sampler) returned
    other than None; each such switch is called in declaration order (one may note why it cannot act)."""
    chosen = None
    for name, hooks in batch_switches():
        draw = getattr(hooks, hook)
        if name in values and draw is not None:
            drawn = draw(batches, values[name])
            chosen = drawn if drawn is not None else chosen
    return chosen


def batch_refusals(collate_fn: Any, values: Mapping[str, Any]) -> dict[str, str]:
    """Of the batch switches at `values`, those that could not act on the batches `collate_fn` (the one the run
    ended up with) made, each with why: asked of each switch, then what its hooks wrote down as they were set."""
    cannot = getattr(collate_fn, "cannot", None) or {}
    found = {}
    for name, hooks in batch_switches():
        if name in values:
            why = (hooks.refuse(collate_fn, values[name]) if hooks.refuse is not None else None) or cannot.get(name)
            if why:
                found[name] = why
    return found


def loss_switches() -> tuple[tuple[str, Switch], ...]:
    """(field, switch) of every switch that replaces a task's own loss (Switch.loss), in module order."""
    return tuple((s.fields[0], s) for s in switches() if s.loss is not None)


def task_loss(recipe, task: str):
    """The LossSwitch the recipe turns on for `task`'s loss, or None (the task's own loss). Two on at once, or one
    with a switch it excludes, is refused: a task has one loss. `recipe` None: none."""
    from ..recipe import RecipeError

    if recipe is None:
        return None
    on = [(name, s) for name, s in loss_switches() if getattr(recipe, name) and s.loss.task == task]
    if len(on) > 1:
        raise RecipeError(f"{' and '.join(name for name, _ in on)} each replace the task's loss: turn on one")
    for name, s in on:
        for other, why in s.loss.excludes.items():
            if getattr(recipe, other):
                raise RecipeError(f"{name} cannot be combined with {other}: {why}")
    return on[0][1].loss if on else None


def unreached_losses(recipe) -> dict[str, str]:
    """The loss switches a recipe turns on, each with why it cannot reach a script's own loss (a Session whose
    loop is the script's says it in unsupported())."""
    return {name: s.loss.unreachable for name, s in loss_switches() if getattr(recipe, name)}


def recipe_rewrites() -> tuple[tuple[str, Switch], ...]:
    """(field, switch) of every switch made concrete on the recipe's other fields (Switch.rewrite)."""
    return tuple((s.fields[0], s) for s in switches() if s.rewrite is not None)


def apply_recipe_rewrites(recipe, concrete: bool = True):
    """The concrete recipe: every rewrite the recipe asks for applied (each resets its own switch, so applying this
    twice is applying it once). Where a recipe becomes concrete, once: the built-in run's Session, the step count of
    `trainfast train`, the tune's candidates. `concrete=False`: `recipe` as it is (a Session adopting a script's
    own loop, which keeps its own batch)."""
    for _, switch in recipe_rewrites() if concrete else ():
        recipe = switch.rewrite.apply(recipe)
    return recipe


def unapplied_rewrites(recipe) -> dict[str, str]:
    """The rewrites a recipe still asks for, each with why a script's own loop cannot get it (a Session adopting the
    script's loader, optimizer and schedule says it in unsupported())."""
    return {name: s.rewrite.own_loop for name, s in recipe_rewrites() if s.rewrite.asks(recipe)}


def rewritten_settings(fields: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """For a framework that keeps the rewritten numbers as settings of its own: {Recipe field: (value, the switched
    field that decides it)} from the run's switched `fields` and the framework's `current` values."""
    found: dict[str, tuple[Any, str]] = {}
    for _, switch in recipe_rewrites():
        if switch.rewrite.settings is not None:
            found.update(switch.rewrite.settings(fields, current))
    return found


@functools.cache
def process_wide_switches() -> tuple[tuple[str, ProcessWideSwitch], ...]:
    """(field, hooks) of every process switch, in PROCESS_WIDE_MODULES order; reads no module that imports torch."""
    found = []
    for name in PROCESS_WIDE_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        found.extend((s.fields[0], s.process_wide) for s in module.SWITCHES if s.process_wide is not None)
    return tuple(found)


def process_wide_fields() -> tuple[str, ...]:
    """The process switches' fields: each reaches any process of a run (its start environment, or set as torch
    is imported), so a script with neither a Session nor a framework adapter is measured with them too."""
    return tuple(name for name, _ in process_wide_switches())


def _wanted(fields, name: str) -> bool:
    """Whether a recipe (or a run's dict of switched fields) turns the process switch `name` on."""
    return bool(fields.get(name) if isinstance(fields, Mapping) else getattr(fields, name, False))


def process_env(fields) -> dict[str, str]:
    """The variables a process must start with for the process switches a recipe (or a run's dict of switched
    fields) turns on: what the ablation adds to a run's environment, and what keeps them in a user's script."""
    return {k: v for name, hooks in process_wide_switches() if _wanted(fields, name)
            for k, v in hooks.environ().items()}


def process_wide_in_effect() -> dict[str, bool]:
    """Each process switch read back in this process: whether it has the setting."""
    return {name: bool(hooks.in_effect()) for name, hooks in process_wide_switches()}


@contextlib.contextmanager
def starting_with(fields) -> Iterator[None]:
    """While the block runs, processes started from this one (spawned, not forked: a fork keeps the parent's
    runtimes as they loaded) begin with the recipe's process switches in their environment; this process's
    own environment is restored afterwards."""
    added = process_env(fields)
    saved = {k: os.environ.get(k) for k in added}
    os.environ.update(added)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def set_before_torch(recipe) -> None:
    """`trainfast train`'s start-up, before torch is imported: each process switch the recipe turns on that a
    runtime reads once as it loads (ProcessWideSwitch.before_torch) is put in place."""
    for name, hooks in process_wide_switches():
        if hooks.before_torch is not None and _wanted(recipe, name):
            hooks.before_torch()


def needs_fresh_process(fields) -> bool:
    """Whether a run with these fields must start as a fresh process (a switch read as a runtime loads)."""
    return any(hooks.before_torch is not None and _wanted(fields, name) for name, hooks in process_wide_switches())


def apply_process_wide_switches(recipe, warn: bool = True) -> None:
    """In a running process (a Session's start, a framework adapter's, a command's process once torch is
    imported): each process switch set as the recipe says, where a running process can set it (and undone where
    this process set it before and the recipe turns it off); one only a process's start can set is said once
    if the process started without it."""
    import warnings

    for name, hooks in process_wide_switches():
        on = _wanted(recipe, name)
        if hooks.apply is not None:
            hooks.apply(on)
        elif on and warn and hooks.late and not hooks.in_effect():
            warnings.warn(hooks.late, RuntimeWarning, stacklevel=3)


def not_in_effect(recipe) -> list[str]:
    """The process switches the recipe turns on that this process does not have, each with its setting: a run
    that would time the default under the switch's name (its guard refuses to)."""
    return [f"{name}: {hooks.label} is not in effect in this process"
            for name, hooks in process_wide_switches() if _wanted(recipe, name) and not hooks.in_effect()]


def device_model_effect(field: str, device: torch.device, model: nn.Module | None, value: Any = None) -> Effect:
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
