"""The switches every adapter applies the same way, on the torch objects a framework hands over: the training
DataLoader's settings, the optimizer switches (techniques.OPTIMIZER_ORDER), the model's memory format,
cudnn.benchmark, and their read-backs. Each uses the technique's own object (techniques/), so a framework's run
and the built-in loop switch a technique through the same code."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader

from ..techniques import model_switches, optimizer_switches, process_wide_switches, unreachable
from .board import UNSET, FrameworkRecord

LOADER_FIELDS = {"num_workers": "num_workers", "pin_memory": "pin_memory",
                 "persistent_workers": "persistent_workers", "prefetch_factor": "prefetch_factor"}
AUTO_WORKERS = "num_workers='auto' is measured on trainfast's built-in data only"


# What a DeepSpeed or FSDP configuration decides itself, so a switch of trainfast's cannot be what it measures.
PLUGIN_OWNS = {
    "deepspeed": {
        "precision": "DeepSpeed's configuration decides the precision (its bf16/fp16 sections and loss scaling), "
                     "not the framework's mixed-precision setting this rung switches",
        "precision_level": "DeepSpeed's configuration decides the precision",
    },
    "fsdp": {
        "precision": "FSDP's mixed-precision policy casts the parameters and gradients itself, not the autocast "
                     "this rung switches",
        "precision_level": "FSDP's mixed-precision policy decides the precision",
    },
}
COMPILED_INSIDE = ("the script compiles a submodule ({name}) itself: compiling the whole model around it, or "
                   "undoing it, is not the one switch this rung measures")


def mark_plugin_owned(record: FrameworkRecord, fields: dict[str, Any], plugin: str, where: str) -> set[str]:
    """Mark the fields of `fields` that `plugin` ("deepspeed", "fsdp", configured at `where`) owns as not
    applicable here, with the reason; those fields, which the caller then leaves as the script has them."""
    owns = plugin_owns(plugin)
    owned = {name for name in owns if name in fields}
    for name in owned:
        record.unsupported[name] = f"{where} is a {plugin} configuration: {owns[name]}"
    return owned


def plugin_owns(plugin: str) -> dict[str, str]:
    """The fields `plugin` decides itself, each with why: PLUGIN_OWNS's and the optimizer switches' own
    (OptimizerSwitch.plugins)."""
    return {**PLUGIN_OWNS[plugin], **{name: how.plugins[plugin] for name, how in optimizer_switches()
                                      if plugin in how.plugins}}


def compiled_submodule(model: Any) -> str | None:
    """The name of a submodule the script compiled inside `model` (not `model` itself), or None."""
    if not isinstance(model, torch.nn.Module):
        return None
    for name, module in model.named_modules():
        if name and (type(module).__name__ == "OptimizedModule"
                     or getattr(module, "_compiled_call_impl", None) is not None):
            return name
    return None


def loader_settings(fields: dict[str, Any], current: DataLoader | None = None) -> dict[str, Any]:
    """The loader settings a run asks for (those of `fields` that are loader settings), made consistent: with
    no workers, no persistent workers and no prefetch factor (DataLoader refuses them)."""
    wanted = {LOADER_FIELDS[k]: v for k, v in fields.items() if k in LOADER_FIELDS}
    workers = wanted.get("num_workers", getattr(current, "num_workers", 0))
    if not workers:
        if "persistent_workers" in wanted:
            wanted["persistent_workers"] = False
        if "prefetch_factor" in wanted:
            wanted["prefetch_factor"] = None
    return wanted


def rebuild_loader(loader: DataLoader, settings: dict[str, Any]) -> DataLoader:
    """The same loader (dataset, batches, order, collate) with other `settings` (its workers; a collate_fn or a
    sampler for the padding switches); `loader` itself when nothing changes. Only a plain torch DataLoader is
    rebuilt: a subclass may keep state its constructor needs."""
    if not settings or all(getattr(loader, k, None) == v for k, v in settings.items()):
        return loader
    if type(loader) is not DataLoader:
        raise TypeError(f"{type(loader).__module__}.{type(loader).__name__} is not a plain torch DataLoader")
    kwargs: dict[str, Any] = dict(
        dataset=loader.dataset, collate_fn=loader.collate_fn, num_workers=loader.num_workers,
        pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
        persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device,
        in_order=getattr(loader, "in_order", True))
    if loader.num_workers:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    batches = loader.batch_sampler
    if type(batches) is BatchSampler:      # torch's own batching: its sampler kept, so the loader still names it
        kwargs.update(batch_size=batches.batch_size, drop_last=batches.drop_last, sampler=batches.sampler)
    elif batches is not None:              # a batch sampler of the script's own: its batches as they are
        kwargs["batch_sampler"] = batches
    else:                                  # iterable dataset, or batch_size=None
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last, sampler=loader.sampler)
    kwargs.update(settings)
    if not kwargs["num_workers"]:
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    return DataLoader(**kwargs)


def switch_loader(record: FrameworkRecord, loader: Any, fields: dict[str, Any]) -> Any:
    """The training loader with the run's worker settings, each recorded (the script's value kept)."""
    if not isinstance(loader, DataLoader):
        return loader
    settings = loader_settings(fields, loader)
    if "num_workers" in settings and not isinstance(settings["num_workers"], int):
        record.unsupported["num_workers"] = AUTO_WORKERS
        settings.pop("num_workers")
    try:
        rebuilt = rebuild_loader(loader, settings)
    except TypeError as exc:
        for name in settings:
            record.unsupported[name] = f"the training loader could not be rebuilt: {exc}"
        return loader
    for name, value in settings.items():
        record.set(name, f"DataLoader.{name}", value, getattr(loader, name, None))
    return rebuilt


def prove_loader(record: FrameworkRecord, loader: Any) -> None:
    for name in LOADER_FIELDS.values():
        if loader is not None:
            record.prove(f"DataLoader.{name}", getattr(loader, name, None))


def switch_optimizers(record: FrameworkRecord, optimizer: Any, fields: dict[str, Any], scheduler=None) -> Any:
    """`optimizer` with the run's optimizer switches (those in `fields`), in techniques.OPTIMIZER_ORDER, each
    recorded with the script's own setting and rebuilt where it differs (same groups, scheduler rebound); one
    that cannot act on this optimizer is said so and left as the script has it. A switch that replaces the class
    (the low-bit states) rules out the ones after it: said where the run asks for the class, silent where it
    keeps the script's own (its low-bit optimizer under a run asking for full states)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    ruled_out = None                     # None: nothing rules the later switches out; "": silently
    for name, how in optimizer_switches():
        if name not in fields:
            continue
        if ruled_out is not None:
            if ruled_out:
                record.unsupported[name] = ruled_out
            continue
        value, had = fields[name], how.state(optimizer)
        record.set(name, how.label, value, had)
        if had != value:
            try:
                optimizer = how.rebuild(optimizer, value, scheduler)
            except ValueError as exc:        # RecipeError: why, the class named
                record.unsupported[name] = str(exc)
            except (TypeError, RuntimeError) as exc:         # the class's own constructor or load_state_dict
                record.unsupported[name] = f"{type(optimizer).__name__}: {exc}"
        if how.replaces and value != how.default:
            ruled_out = how.replaces
        elif how.replaces and how.state(optimizer) != how.default:
            ruled_out = ""
    return optimizer


def prove_optimizers(record: FrameworkRecord, optimizers: list) -> None:
    """The optimizer switches read back from the optimizers the framework steps."""
    if not optimizers:
        return
    for _, how in optimizer_switches():
        values = sorted({how.state(o) for o in optimizers})
        record.prove(how.label, values[0] if len(values) == 1 else values)


def switch_models(record: FrameworkRecord, model: torch.nn.Module, fields: dict[str, Any],
                  adapter: str) -> torch.nn.Module:
    """The run's switches that act on the model object (techniques/: Switch.model, those `adapter` sets ON_MODEL),
    each on or off as the run asks (off undoes what the script did itself), recorded with the script's own
    state and read back from the model when the result is written. One that cannot act on this model (no
    convolutions for channels_last, no checkpointing switch of its own) is recorded as not applicable, why."""
    for name, switch in model_switches(adapter):
        how = switch.model
        if name not in fields or fields[name] in how.idle:
            continue
        target = how.target(model) if how.target is not None else model
        why = switch.model_effect(target) if switch.model_effect is not None else None
        if why is not None and not why.acts:
            record.unsupported[name] = why.reason
            continue
        had = how.state(target)
        record.set(name, how.label, how.show(fields[name]), UNSET if had == how.default else had)
        switched = how.apply(target, fields[name])
        model = switched if target is model else model
        record.readers.append(lambda r, how=how, target=switched: r.prove(how.label, how.state(target)))
    return model


def is_compiled(model: Any) -> bool:
    """Whether `model` runs through torch.compile: a compiled wrapper, or a module compiled in place."""
    seen = 0
    while model is not None and seen < 8:            # through the wrappers (DDP, accelerate, Lightning)
        if type(model).__name__ == "OptimizedModule" or getattr(model, "_compiled_call_impl", None) is not None:
            return True
        model = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        seen += 1
    return False


def switch_cudnn_benchmark(record: FrameworkRecord, enabled: bool) -> None:
    record.set("cudnn_benchmark", "torch.backends.cudnn.benchmark", enabled, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.benchmark = enabled
    record.readers.append(lambda r: r.prove("torch.backends.cudnn.benchmark", torch.backends.cudnn.benchmark))


def mark_shared_switches(record: FrameworkRecord, fields: dict[str, Any]) -> None:
    """What every framework gets alike: the switches its adapter cannot set (trainfast's own pipeline's, which
    have nothing to act on in it, and those each switch declares unreachable for it) are said so; the
    thread policy (passive_threads) is the process's, started with it whatever the framework, proven here from
    the environment the process started with; a process switch a running process can set (glibc's malloc keeping
    freed memory, a library-wide flag) is set here too, in case the process started without it."""
    record.unsupported.update(unreachable(record.name, fields))
    for name, hooks in process_wide_switches():
        if name not in fields:
            continue
        record.set(name, hooks.label, bool(fields[name]))
        if hooks.apply is not None:
            hooks.apply(bool(fields[name]))
        record.readers.append(lambda r, hooks=hooks: r.prove(hooks.label, hooks.in_effect()))
