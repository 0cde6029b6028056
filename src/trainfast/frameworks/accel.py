"""Accelerate: the switches Accelerate has a setting for go through the Accelerator's own arguments (set in a
wrapped Accelerator.__init__), the rest are applied to the objects the script hands to Accelerator.prepare()
before Accelerate wraps them; each is read back from what the Accelerator ended up with.

Where each switch is set in this framework, or why it cannot be, is declared on the switch (its module's
`frameworks=` / `unreachable=`) and listed in the `accelerate` column of `trainfast switches` and
docs/frameworks.md, generated from those declarations.

The explicit arguments win over Accelerate's environment (ACCELERATE_MIXED_PRECISION, ACCELERATE_DYNAMO_BACKEND,
which `accelerate launch` fills from `accelerate config`), so every run sets them; the script's own value (its
argument, else that environment) is reported as what it had.

Only one loader per Accelerator is switched, the training loader: of the loaders in the first prepare() call
that has any, the first that shuffles, else the first. The probe times optimizer steps, so the loader feeding
them is the one whose settings count; evaluation loaders stay as the script made them (their workers would
only cost start-up time). Its batch, times the Accelerator's gradient_accumulation_steps, is the probe's
samples per optimizer step (a script that accumulates by skipping optimizer.step() itself, not through
Accelerate, is counted one batch per step).

set_to_none=True forces zero_grad(set_to_none=True), which changes something only in a script that zeroes in
place (zero_grad(set_to_none=False)); a script that calls zero_grad() frees the gradients already, and the
switch is reported as having no setting to act on. The seed is the script's own (it calls set_seed itself).

The evaluation is what the script passes to accelerator.log() (read there, whether or not a tracker is
configured): its numbers join the run's reported metrics under the names the script gave them. The seed goes
through Accelerate's set_seed: the script's call seeds with the run's seed (read back from torch's initial seed).

Not applicable, said before a rung runs: the switches a DeepSpeed or FSDP plugin owns (common.PLUGIN_OWNS: a
deepspeed_plugin / fsdp_plugin argument, or ACCELERATE_USE_DEEPSPEED / ACCELERATE_USE_FSDP from `accelerate
config`), the compile switch on a model with a submodule the script compiled itself, and the loader switches
(the padding switches too) when no training loader passed through prepare() (the script iterates its own
DataLoader, which Accelerate never sees). After the baseline: padding_free on a model with no module that takes
position_ids (the model of the loader's prepare() call, else one prepared before), both padding switches on
batches with no padding, group_by_length on a loader that keeps an order of its own.

transformers' Trainer builds an Accelerator of its own: that one is left alone (the transformers adapter
switches the Trainer through its arguments, and a second switch would report the same setting twice).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

from ..techniques import optimizer_fields
from ..techniques.memory_format import memory_format_of
from ..techniques.optimizer import rebind_scheduler
from .board import UNSET, Board, FrameworkRecord
from .common import (COMPILED_INSIDE, LOADER_FIELDS, compiled_submodule, is_compiled, mark_plugin_owned,
                     mark_shared_switches, prove_loader, prove_optimizers, switch_cudnn_benchmark, switch_loader,
                     switch_models, switch_optimizers)
from .hooks import when_imported
from .packing import asks_batches, named_batches, prove_batches, switch_batches
from .wrapping import ddp_settings, hook_settings, prove_ddp_settings, switch_comm_hook, switch_ddp_settings

NAME = "accelerate"
PATCHED = "_trainfast_patched"
RUN = "_trainfast_run"           # on each Accelerator the script made: its Run (None: left alone)
MIXED = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
FREES = "the script's zero_grad() frees the gradients already (Accelerate's and torch's default set_to_none=True)"
NO_ZERO_GRAD = "no zero_grad() call on an optimizer prepared by the Accelerator was seen"


@dataclass
class Run:
    """One Accelerator the script made and what it prepared, held (not weakly) for the read-back: the proof is
    read when the result is written, which for a run that ends by itself is at exit, after the script has
    dropped them."""
    accelerator: Any
    models: list = field(default_factory=list)          # as prepare() returned them
    optimizers: list = field(default_factory=list)      # the prepared (AcceleratedOptimizer) ones
    loader: Any = None                                  # the prepared training loader
    replaced: dict = field(default_factory=dict)        # id(script's optimizer) -> (it, its rebuilt twin)
    set_to_none: Any = None                             # what zero_grad last passed on
    fields: dict = field(default_factory=dict)          # the run's switches less those a plugin owns
    packing: Any = None                                 # the training loader's packing collator (padding switches)


NOT_PREPARED = ("no training loader passed through accelerator.prepare(): the script iterates its own DataLoader, "
                "which Accelerate (and so this switch) never sees")
PLUGIN_ARGS = {"deepspeed": ("deepspeed_plugin", "deepspeed_plugins", "ACCELERATE_USE_DEEPSPEED"),
               "fsdp": ("fsdp_plugin", None, "ACCELERATE_USE_FSDP")}


def install(board: Board) -> None:
    when_imported("accelerate.accelerator", lambda m: patch_accelerator(m.Accelerator, board))
    if "seed" in board.fields:
        when_imported("accelerate.utils.random", lambda m: patch_seed(m, board))


def patch_seed(module: Any, board: Board) -> None:
    """set_seed seeds with the run's seed; patched in its own module as soon as it is imported, before
    accelerate.utils re-exports it, so `from accelerate.utils import set_seed` gets the patched one."""
    original = module.set_seed
    if getattr(original, PATCHED, False):
        return

    @functools.wraps(original)
    def set_seed(seed: int, *args: Any, **kwargs: Any) -> None:
        record = record_of(board)
        wanted = int(board.fields["seed"])
        record.set("seed", "set_seed", wanted, seed)
        if "set_seed" not in board.held:
            record.readers.append(lambda r: r.prove("set_seed", torch.initial_seed()))
        board.held["set_seed"] = True
        return original(wanted, *args, **kwargs)

    setattr(set_seed, PATCHED, True)
    module.set_seed = set_seed


def record_of(board: Board) -> FrameworkRecord:
    import accelerate

    return board.framework(NAME, accelerate.__version__)


def made_by_transformers() -> bool:
    """Whether the Accelerator being built is transformers' own (its Trainer's): the first caller outside this
    module and Accelerate itself (a script's Accelerator subclass is the script's)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != __name__ and module.split(".")[0] != "accelerate":
            return module.split(".")[0] == "transformers"
        frame = frame.f_back
    return False


def patch_accelerator(cls: type, board: Board) -> None:
    if getattr(cls.__init__, PATCHED, False):
        return
    init, prepare, log = cls.__init__, cls.prepare, cls.log
    latest: list[Run] = []          # the Accelerator the script made last: the one the proof is read from
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if made_by_transformers():
            setattr(self, RUN, None)
            init(self, *args, **kwargs)
            return
        record = record_of(board)
        bound = signature.bind(self, *args, **kwargs).arguments
        bound.pop(next(iter(signature.parameters)))       # self
        fields = without_plugin_owned(bound, record, board.fields)
        init(self, **switch_arguments(dict(bound), record, fields))
        run = Run(self, fields=fields)
        setattr(self, RUN, run)
        if not latest:
            record.readers.append(lambda r: read_back(r, latest[-1]))
        latest[:] = [run]

    @functools.wraps(prepare)
    def prepare_(self, *args: Any, **kwargs: Any):
        run = getattr(self, RUN, None)
        if run is None:             # transformers' Accelerator, or one made before the patch
            return prepare(self, *args, **kwargs)
        record = record_of(board)
        args, train_at = switch_prepared(self, run, record, run.fields, args)
        result = prepare(self, *args, **kwargs)
        keep_prepared(run, record, run.fields, args, result if len(args) != 1 else (result,), train_at)
        if train_at is not None:
            board.samples_per_step = samples_per_step(self, run.loader)
        return result

    @functools.wraps(log)
    def log_(self, values: dict, *args: Any, **kwargs: Any) -> Any:
        board.record_metrics(values if isinstance(values, dict) else {})
        return log(self, values, *args, **kwargs)

    setattr(__init__, PATCHED, True)
    cls.__init__, cls.prepare, cls.log = __init__, prepare_, log_


def env_or_unset(name: str) -> Any:
    """What Accelerate's environment sets for an argument the script left out (UNSET: its default)."""
    return os.environ[name].lower() if os.environ.get(name) else UNSET


def switch_arguments(kw: dict[str, Any], record: FrameworkRecord, fields: dict[str, Any]) -> dict[str, Any]:
    """The Accelerator's arguments with the run's switches (what the script passed is recorded)."""
    fields = without_plugin_owned(kw, record, fields)
    if "precision" in fields:
        wanted = MIXED[fields["precision"]]
        had = kw.get("mixed_precision")
        record.set("precision", "mixed_precision", wanted,
                   env_or_unset("ACCELERATE_MIXED_PRECISION") if had is None else str(had))
        record.set("precision", "autocast", wanted != "no")
        kw["mixed_precision"] = wanted
    if "compile" in fields:
        switch_dynamo(kw, record, bool(fields["compile"]))
    if "non_blocking" in fields:
        from accelerate.utils import DataLoaderConfiguration

        config = kw.get("dataloader_config")
        record.set("non_blocking", "non_blocking", bool(fields["non_blocking"]),
                   UNSET if config is None else config.non_blocking)
        kw["dataloader_config"] = (DataLoaderConfiguration(non_blocking=bool(fields["non_blocking"]))
                                   if config is None else
                                   dataclasses.replace(config, non_blocking=bool(fields["non_blocking"])))
    if "set_to_none" in fields:
        record.unsupported.setdefault("set_to_none", NO_ZERO_GRAD)
    if ddp_settings(fields) or hook_settings(fields):
        switch_ddp_handler(kw, record, fields)
    mark_shared_switches(record, fields)
    if "cudnn_benchmark" in fields:
        switch_cudnn_benchmark(record, bool(fields["cudnn_benchmark"]))
    return kw


def switch_ddp_handler(kw: dict[str, Any], record: FrameworkRecord, fields: dict[str, Any]) -> None:
    """The wrap switches on the Accelerator's DistributedDataParallelKwargs, whose fields are DDP's keywords: the
    script's own handler among its kwargs_handlers, or one added there (a field at its default is not passed on to
    DDP: DDP's own default stands)."""
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    handlers = list(kw.get("kwargs_handlers") or [])
    script = next((h for h in handlers if isinstance(h, DistributedDataParallelKwargs)), None)
    handler = script if script is not None else DistributedDataParallelKwargs()
    defaults = DistributedDataParallelKwargs()
    switch_ddp_settings(record, fields, lambda k: getattr(script, k, None),
                        lambda k, v: setattr(handler, k, getattr(defaults, k) if v is None else v))

    def put_hook(hook: str | None, state: dict[str, Any]) -> None:
        handler.comm_hook = DDPCommunicationHookType(hook) if hook else defaults.comm_hook
        handler.comm_state_option = state
    had = None if script is None or script.comm_hook == defaults.comm_hook else str(script.comm_hook)
    switch_comm_hook(record, fields, had, put_hook)
    kw["kwargs_handlers"] = handlers if script is not None else [*handlers, handler]


def without_plugin_owned(kw: dict[str, Any], record: FrameworkRecord, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` less those a DeepSpeed or FSDP plugin of this Accelerator decides (marked not applicable)."""
    for plugin, (arg, args, env) in PLUGIN_ARGS.items():
        where = next((f"the script's Accelerator({a}=...)" for a in (arg, args) if a and kw.get(a) is not None),
                     f"{env}=true in Accelerate's environment" if env_flag(env) else None)
        if where is not None:
            owned = mark_plugin_owned(record, fields, plugin, where)
            fields = {k: v for k, v in fields.items() if k not in owned}
    return fields


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def switch_dynamo(kw: dict[str, Any], record: FrameworkRecord, enabled: bool) -> None:
    """dynamo_backend, or the backend of the script's own dynamo_plugin (its mode and options kept): the
    Accelerator refuses both at once."""
    from accelerate.utils import DynamoBackend

    wanted = "inductor" if enabled else "no"
    plugin = kw.get("dynamo_plugin")
    if plugin is not None:
        had = str(getattr(plugin.backend, "value", plugin.backend)).lower()
        plugin = copy.copy(plugin)
        plugin.backend = DynamoBackend(wanted.upper())
        kw["dynamo_plugin"] = plugin
    else:
        backend = kw.get("dynamo_backend")
        had = env_or_unset("ACCELERATE_DYNAMO_BACKEND") if backend is None else \
            str(getattr(backend, "value", backend)).lower()
        kw["dynamo_backend"] = wanted
    record.set("compile", "dynamo_backend", wanted, had)
    record.set("compile", "compiled model", enabled)


def training_loader_at(run: Run, args: tuple) -> int | None:
    """Where the training loader is among prepare()'s arguments: the first loader that shuffles, else the
    first; None once one is chosen (an Accelerator has one training loader) or with no loader."""
    if run.loader is not None:
        return None
    loaders = [i for i, a in enumerate(args) if isinstance(a, DataLoader)]
    shuffled = [i for i in loaders if isinstance(getattr(args[i], "sampler", None), RandomSampler)]
    return (shuffled or loaders or [None])[0]


def switch_prepared(accelerator: Any, run: Run, record: FrameworkRecord, fields: dict[str, Any],
                    args: tuple) -> tuple[tuple, int | None]:
    """prepare()'s arguments with the switches Accelerate has no setting for applied; the script keeps what
    prepare() returns, so replacing an object before Accelerate wraps it replaces it for the script. A switch
    the plugin owns (switch_arguments marked it) is left alone."""
    args = list(args)
    train_at = training_loader_at(run, tuple(args))
    for i, obj in enumerate(args):
        if isinstance(obj, torch.nn.Module):
            args[i] = switch_model(record, obj, fields, accelerator)
        elif isinstance(obj, torch.optim.Optimizer) and any(name in fields for name in optimizer_fields()):
            rebuilt = switch_optimizers(record, obj, fields)
            if rebuilt is not obj:
                run.replaced[id(obj)] = (obj, rebuilt)
                args[i] = rebuilt
        elif i == train_at:
            args[i] = switch_loader(record, obj, fields)
    if train_at is not None and asks_batches(fields):
        # After the model's switches (its attention backend decides how packed rows are laid out): the model of
        # this call, else one prepared before, is the one the batches go to.
        models = [a for a in args if isinstance(a, torch.nn.Module)] + run.models
        args[train_at], run.packing = switch_batches(record, args[train_at], fields, (models or [None])[0])
    rebind_schedulers(accelerator, run, args)
    return tuple(args), train_at


def switch_model(record: FrameworkRecord, model: torch.nn.Module, fields: dict[str, Any],
                 accelerator: Any = None) -> torch.nn.Module:
    """channels_last on (or, when off, the script's own channels_last undone), and the script's own
    torch.compile undone when compile is off (Accelerate compiles itself when it is on)."""
    model = switch_models(record, model, fields, NAME)
    inside = compiled_submodule(model)
    if "compile" in fields and inside is not None:
        record.unsupported["compile"] = COMPILED_INSIDE.format(name=inside)
        restore_dynamo(record, accelerator)
        return model
    compiled = record.switches.get("compiled model")
    if compiled is not None and is_compiled(model):
        if compiled.script == UNSET:
            compiled.script = True              # the script compiled it itself
        if compiled.wanted:
            return model
        if type(model).__name__ == "OptimizedModule":
            model = model._orig_mod
        if getattr(model, "_compiled_call_impl", None) is not None:     # Module.compile(), in place
            model._compiled_call_impl = None
    return model


def restore_dynamo(record: FrameworkRecord, accelerator: Any) -> None:
    """The compile switch withdrawn: the Accelerator's dynamo backend back to the script's own (prepare() would
    otherwise compile the whole model around the script's compiled submodule), and its switches dropped."""
    from accelerate.utils import DynamoBackend

    switch = record.switches.pop("dynamo_backend", None)
    record.switches.pop("compiled model", None)
    had = switch.script if switch is not None and switch.script != UNSET else "no"
    plugin = getattr(getattr(accelerator, "state", None), "dynamo_plugin", None)
    if plugin is not None:
        plugin.backend = DynamoBackend(str(had).upper())


def rebind_schedulers(accelerator: Any, run: Run, args: list) -> None:
    """Every LR scheduler built on an optimizer the run replaced points at its replacement: those passed to
    this prepare() call, those prepared before (Accelerate wraps them), and those the script steps without
    preparing (found through what refers to the replaced optimizer)."""
    if not run.replaced:
        return
    Scheduler = torch.optim.lr_scheduler.LRScheduler
    schedulers = [a for a in args if isinstance(a, Scheduler)]
    schedulers += [getattr(s, "scheduler", s) for s in getattr(accelerator, "_schedulers", [])]
    for old, _ in run.replaced.values():
        for ref in gc.get_referrers(old):
            if isinstance(ref, Scheduler):
                schedulers.append(ref)
            elif isinstance(ref, dict) and ref.get("optimizer") is old and "base_lrs" in ref:   # its __dict__
                schedulers += [s for s in gc.get_referrers(ref) if isinstance(s, Scheduler)]
    for scheduler in schedulers:
        pair = run.replaced.get(id(getattr(scheduler, "optimizer", None)))
        if pair is not None and scheduler.optimizer is pair[0]:
            rebind_scheduler(scheduler, pair[1])


def keep_prepared(run: Run, record: FrameworkRecord, fields: dict[str, Any], args: tuple, result: tuple,
                  train_at: int | None) -> None:
    """Hold what prepare() returned for the read-back; the prepared optimizers' zero_grad switched."""
    for i, obj in enumerate(result):
        if isinstance(args[i], torch.nn.Module):
            run.models.append(obj)
        elif isinstance(args[i], torch.optim.Optimizer):
            run.optimizers.append(obj)
            if "set_to_none" in fields:
                switch_zero_grad(run, record, obj, bool(fields["set_to_none"]))
    if train_at is not None:
        run.loader = result[train_at]


def switch_zero_grad(run: Run, record: FrameworkRecord, optimizer: Any, force: bool) -> None:
    """set_to_none=True forces zero_grad(set_to_none=True); it has something to change only where the script
    zeroes in place (zero_grad(set_to_none=False)). A script that frees already has nothing to switch."""
    zero_grad = optimizer.zero_grad

    @functools.wraps(zero_grad)
    def switched(set_to_none: bool | None = None) -> None:
        if set_to_none is False:
            if "zero_grad(set_to_none)" not in record.switches:
                record.set("set_to_none", "zero_grad(set_to_none)", force, False)
                record.unsupported.pop("set_to_none", None)
            set_to_none = force
        elif "zero_grad(set_to_none)" not in record.switches:
            record.unsupported["set_to_none"] = FREES
        run.set_to_none = True if set_to_none is None else set_to_none
        zero_grad(set_to_none=set_to_none)

    optimizer.zero_grad = switched


def samples_per_step(accelerator: Any, loader: Any) -> int | None:
    """The samples one process's optimizer step takes: its share of the training loader's batch times the
    Accelerator's accumulation steps (while it accumulates, Accelerate skips the optimizer's step, so the
    probe's step hook fires once per accumulated step). None where the loader does not say (batch_size=None)."""
    try:
        batch = loader.total_batch_size // max(1, accelerator.num_processes)
    except (AttributeError, TypeError):
        return None
    return batch * accelerator.gradient_accumulation_steps if batch else None


def autocast_on(run: Run) -> bool:
    """Whether the prepared models run under autocast: Accelerate's native AMP, its autocast handler not
    turning it off, and each prepared model's forward wrapped in it."""
    accelerator = run.accelerator
    handler = getattr(accelerator, "autocast_handler", None)
    on = bool(accelerator.native_amp) and (handler is None or handler.enabled)
    for model in run.models:
        seen = 0
        while model is not None and not hasattr(model, "_original_forward") and seen < 8:
            model = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
            seen += 1
        on = on and model is not None and hasattr(model, "_original_forward")
    return on


def read_back(record: FrameworkRecord, run: Run) -> None:
    """Each switch as the Accelerator and the objects it prepared ended up with (the run's proof)."""
    accelerator = run.accelerator
    if run.loader is None:
        for name in [*LOADER_FIELDS, *named_batches(run.fields), "non_blocking"]:
            if name in run.fields:
                record.unsupported[name] = NOT_PREPARED
        record.switches.pop("non_blocking", None)
    record.prove("mixed_precision", str(accelerator.mixed_precision))
    record.prove("autocast", autocast_on(run))
    backend = accelerator.state.dynamo_plugin.backend
    record.prove("dynamo_backend", str(getattr(backend, "value", backend)).lower())
    if run.models:
        compiled = sorted({is_compiled(m) for m in run.models})
        record.prove("compiled model", compiled[0] if len(compiled) == 1 else compiled)
        formats = {memory_format_of(m) for m in run.models} - {None}
        if formats:
            record.prove("memory format", formats.pop() if len(formats) == 1 else sorted(formats))
    prove_optimizers(record, [getattr(o, "optimizer", o) for o in run.optimizers])
    prove_loader(record, run.loader)
    prove_batches(record, run.packing, run.loader, run.fields)
    loader_copies = getattr(run.loader, "_non_blocking", None)
    record.prove("non_blocking", accelerator.non_blocking if loader_copies is None else loader_copies)
    if run.set_to_none is not None:
        record.prove("zero_grad(set_to_none)", run.set_to_none)
    handler = accelerator.ddp_handler
    prove_ddp_settings(record, run.models[0] if run.models else None, lambda k: getattr(handler, k, None))
