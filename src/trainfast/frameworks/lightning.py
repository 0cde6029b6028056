"""PyTorch Lightning's Trainer (both package names, `lightning.pytorch` and the older `pytorch_lightning`): each
switch through the Trainer's own argument where it has one, set in Trainer.__init__, and otherwise on the torch
objects Lightning is handed at fit(): the LightningModule, what configure_optimizers() returns, the training
DataLoader. Each is read back from what the Trainer ended up with while it trains.

Where each switch is set in this framework, or why it cannot be, is declared on the switch (its module's
`frameworks=` / `unreachable=`) and listed in the `lightning` column of `trainfast switches` and
docs/frameworks.md, generated from those declarations.

Lightning on a CPU turns "16-mixed" into "bf16-mixed" by itself; the read-back shows it, and the rung is
reported as not applied rather than timed as fp16. The seed goes through Lightning's own seed_everything: the
script's call seeds with the run's seed instead (read back from PL_GLOBAL_SEED), so the baseline's noise seeds
differ as a Session script's do.

Lightning's own evaluation is read where it keeps it: the Trainer's callback_metrics (everything the module
logged, validation metrics included) when fit() or validate() returns join the run's reported metrics, and the
monitor and mode of the script's ModelCheckpoint (else its EarlyStopping) are its declared metric. A DeepSpeed
or FSDP strategy owns the switches it decides (common.PLUGIN_OWNS), and a LightningModule with a submodule the
script compiled itself has no compile switch: both are said not applicable, and left as the script has them. So
are the padding switches where they cannot act: padding_free on a LightningModule with no module inside that takes
position_ids (packed rows need them to keep attention inside each document), both on batches with no padding,
group_by_length on a loader that keeps an order of its own (no shuffle, a sampler or batch sampler of its own)."""
from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from ..techniques import optimizer_fields
from ..techniques.memory_format import memory_format_of
from ..techniques.optimizer import rebind_scheduler
from .board import UNSET, Board, FrameworkRecord
from .common import (COMPILED_INSIDE, LOADER_FIELDS, compiled_submodule, is_compiled, mark_plugin_owned,
                     mark_shared_switches, prove_loader, prove_optimizers, switch_loader, switch_models,
                     switch_optimizers)
from .hooks import when_imported
from .packing import asks_batches, prove_batches, switch_batches
from .wrapping import ddp_settings, prove_ddp_settings, switch_ddp_settings

NAME = "lightning"
PACKAGES = ("lightning.pytorch", "pytorch_lightning")
PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
# Lightning's other spellings of a precision -> the name it converts them to.
PRECISION_ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}
PATCHED = "_trainfast_patched"
FIT_STATE = "_trainfast_fit"          # what the adapter noted on a Trainer when its fit started


SEED_MODULES = {"lightning.pytorch": "lightning.fabric.utilities.seed",
                "pytorch_lightning": "lightning_fabric.utilities.seed"}


def install(board: Board) -> None:
    for package in PACKAGES:
        when_imported(f"{package}.trainer.trainer", functools.partial(patch_package, package, board))
        if "seed" in board.fields:
            when_imported(SEED_MODULES[package], functools.partial(patch_seed, package, board))


def patch_seed(package: str, board: Board, module: Any) -> None:
    """seed_everything seeds with the run's seed. Patched in its own module right after that module is imported,
    before lightning's packages re-export it, so every name the script can import it by is the patched one."""
    original = module.seed_everything
    if getattr(original, PATCHED, False):
        return

    @functools.wraps(original)
    def seed_everything(seed: Any = None, *args: Any, **kwargs: Any) -> int:
        record = record_of(board, package)
        wanted = int(board.fields["seed"])
        record.set("seed", "seed_everything", wanted, UNSET if seed is None else seed)
        if not any(r is read_seed for r in record.readers):
            record.readers.append(read_seed)
        return original(wanted, *args, **kwargs)

    setattr(seed_everything, PATCHED, True)
    module.seed_everything = seed_everything


def read_seed(record: FrameworkRecord) -> None:
    import os

    seed = os.environ.get("PL_GLOBAL_SEED")
    record.prove("seed_everything", int(seed) if seed is not None else None)


def record_of(board: Board, package: str) -> FrameworkRecord:
    top = importlib.import_module(package.split(".")[0])
    return board.framework(NAME, getattr(top, "__version__", ""))


def patch_package(package: str, board: Board, trainer_module: Any) -> None:
    """Patch one Lightning package: the Trainer, the parsing of configure_optimizers()'s result and the
    training loader's source (all three are class or module attributes looked up at each call)."""
    record = functools.partial(record_of, board, package)
    fitting: dict[str, Any] = {}             # the Trainer whose fit() runs now
    patch_trainer(trainer_module.Trainer, board, package, record, fitting)
    patch_optimizer_conf(importlib.import_module(f"{package}.core.optimizer"), board, record)
    source = importlib.import_module(f"{package}.trainer.connectors.data_connector")._DataLoaderSource
    patch_loader_source(source, board, record, fitting)


def canonical_precision(value: Any) -> Any:
    """The script's precision as Lightning names it ("bf16" -> "bf16-mixed", 16 -> "16-mixed"), so a script that
    spells the run's own setting differently is not reported as overridden."""
    if value is UNSET or value is None:
        return UNSET
    return PRECISION_ALIASES.get(str(value), str(value))


def switch_trainer_arguments(kwargs: dict[str, Any], record: FrameworkRecord, fields: dict[str, Any],
                             package: str = "lightning.pytorch") -> None:
    """Set the run's switches among the Trainer's keyword arguments, before the Trainer builds its plugins."""
    plugin = sharded_strategy(kwargs.get("strategy"))
    if plugin is not None:
        owned = mark_plugin_owned(record, fields, plugin,
                                  f"the script's Trainer(strategy={describe(kwargs['strategy'])})")
        fields = {k: v for k, v in fields.items() if k not in owned}
    if "precision" in fields:
        switch_precision(kwargs, record, fields)
    if "cudnn_benchmark" in fields:
        wanted = bool(fields["cudnn_benchmark"])
        record.set("cudnn_benchmark", "benchmark", wanted, kwargs.get("benchmark", UNSET))
        kwargs["benchmark"] = wanted
    mark_shared_switches(record, fields)
    if "async_checkpoint" in fields:
        switch_async_checkpoint(kwargs, record, bool(fields["async_checkpoint"]), package)


def switch_strategy(strategy: Any, record: FrameworkRecord, fields: dict[str, Any]) -> None:
    """The wrap switches on the Trainer's DDP strategy, whose keyword arguments go to DistributedDataParallel when
    fit builds it (DDPStrategy(bucket_cap_mb=...)); a strategy that builds no DDP (one device, FSDP) is said."""
    asked = ddp_settings(fields)
    kwargs = getattr(strategy, "_ddp_kwargs", None)
    if not asked or kwargs is None:
        for name, _, _ in asked:
            record.unsupported[name] = (f"the Trainer's strategy ({type(strategy).__name__}) builds no "
                                        "DistributedDataParallel to act on")
        return
    switch_ddp_settings(record, fields, kwargs.get,
                        lambda k, v: kwargs.pop(k, None) if v is None else kwargs.__setitem__(k, v))


def sharded_strategy(strategy: Any) -> str | None:
    """"deepspeed" or "fsdp" for a strategy of that kind (its name, as "deepspeed_stage_2", or an instance of a
    DeepSpeedStrategy / FSDPStrategy class), None for any other."""
    if strategy is None:
        return None
    names = [strategy.lower()] if isinstance(strategy, str) else [c.__name__.lower() for c in type(strategy).__mro__]
    for plugin in ("deepspeed", "fsdp"):
        if any(n.startswith(plugin) for n in names):
            return plugin
    return None


def describe(value: Any) -> str:
    return repr(value) if isinstance(value, str) else f"{type(value).__name__}(...)"


ASYNC_IO = "plugins: AsyncCheckpointIO"


def switch_async_checkpoint(kwargs: dict[str, Any], record: FrameworkRecord, wanted: bool, package: str) -> None:
    """Lightning's own background checkpoint writer, its AsyncCheckpointIO plugin: on, it wraps the script's own
    CheckpointIO plugin (or the strategy's default); off, a script's AsyncCheckpointIO is unwrapped."""
    io = importlib.import_module(f"{package}.plugins.io")
    plugins = kwargs.get("plugins") or []
    plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    script = any(isinstance(p, io.AsyncCheckpointIO) for p in plugins)
    if wanted and not script:
        inner = [p for p in plugins if isinstance(p, io.CheckpointIO)]
        plugins = [p for p in plugins if p not in inner] + [io.AsyncCheckpointIO(inner[0] if inner else None)]
    elif not wanted and script:
        plugins = [(p.checkpoint_io if isinstance(p, io.AsyncCheckpointIO) else p) for p in plugins]
        plugins = [p for p in plugins if p is not None]
    record.set("async_checkpoint", ASYNC_IO, wanted, script)
    kwargs["plugins"] = plugins


def switch_precision(kwargs: dict[str, Any], record: FrameworkRecord, fields: dict[str, Any]) -> None:
    wanted = PRECISION.get(fields["precision"])
    plugins = kwargs.get("plugins") or []
    plugins = plugins if isinstance(plugins, (list, tuple)) else [plugins]
    own_plugin = next((p for p in plugins if any(c.__name__ == "Precision" for c in type(p).__mro__)), None)
    if own_plugin is not None or wanted is None:
        why = (f"the script passes its own precision plugin ({type(own_plugin).__name__})" if own_plugin is not None
               else f"the Trainer has no precision for {fields['precision']!r}")
        record.unsupported["precision"] = why
        return
    record.set("precision", "precision", wanted, canonical_precision(kwargs.get("precision", UNSET)))
    kwargs["precision"] = wanted


def patch_trainer(cls: type, board: Board, package: str, record: Callable[[], FrameworkRecord],
                  fitting: dict[str, Any]) -> None:
    if getattr(cls.__init__, PATCHED, False):
        return
    init, fit, validate = cls.__init__, cls.fit, cls.validate
    fit_signature = inspect.signature(fit)

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        switch_trainer_arguments(kwargs, record(), board.fields, package)
        init(self, *args, **kwargs)
        switch_strategy(self.strategy, record(), board.fields)

    @functools.wraps(fit)
    def fit_(self, *args: Any, **kwargs: Any) -> Any:
        bound = fit_signature.bind(self, *args, **kwargs)
        if "model" in bound.arguments:
            bound.arguments["model"] = switch_model(bound.arguments["model"], record(), board.fields, package)
        setattr(self, FIT_STATE, {"benchmark": torch.backends.cudnn.benchmark})
        fitting["trainer"] = self
        # Held, not weakly: the proof is read when the result is written, which for a run that ends by itself
        # is at exit, after the script has dropped its Trainer. The Trainer that fits is the one to read: a
        # previous fit's reader is replaced, the process-wide switches' readers are kept.
        reader = functools.partial(read_back, trainer=self)
        record().readers[:] = [r for r in record().readers if r is not fitting.get("reader")] + [reader]
        fitting["reader"] = reader
        declare_metric(board, self)
        add_curve_points(self, board, package)
        try:
            return fit(*bound.args, **bound.kwargs)
        finally:
            board.record_metrics(dict(self.callback_metrics))
            # A test() or predict() after fit drops the Trainer's training loader: the one fit ran is kept.
            getattr(self, FIT_STATE)["train_loader"] = first_loader(self.train_dataloader)

    @functools.wraps(validate)
    def validate_(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return validate(self, *args, **kwargs)
        finally:
            board.record_metrics(dict(self.callback_metrics))

    setattr(__init__, PATCHED, True)
    cls.__init__, cls.fit, cls.validate = __init__, fit_, validate_


CURVE = "_trainfast_curve"


def add_curve_points(trainer: Any, board: Board, package: str) -> None:
    """A callback on the Trainer that hands each validation it runs during fit (not its sanity check) to the board:
    with the logged metrics, a point of the run's curve (instruments/curve.py), where --target reads them."""
    if board.on_metrics is None or any(getattr(c, CURVE, False) for c in trainer.callbacks):
        return
    base = importlib.import_module(package).Callback

    class CurvePoint(base):
        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.sanity_checking:
                board.record_metrics(dict(trainer.callback_metrics))

    point = CurvePoint()
    setattr(point, CURVE, True)
    trainer.callbacks.append(point)


def declare_metric(board: Board, trainer: Any) -> None:
    """The metric the script's callbacks watch: its ModelCheckpoint's monitor and mode (the checkpoint it
    keeps), else its EarlyStopping's; none without a monitor."""
    callbacks = list(getattr(trainer, "checkpoint_callbacks", None) or [])
    callbacks += [c for c in getattr(trainer, "callbacks", None) or [] if type(c).__name__ == "EarlyStopping"]
    for callback in callbacks:
        monitor = getattr(callback, "monitor", None)
        if monitor:
            mode = getattr(callback, "mode", "min")
            board.declare(monitor, "max" if mode == "max" else "min",
                          f"the script's {type(callback).__name__}(monitor={monitor!r}, mode={mode!r})")
            return


def compiled(model: Any) -> bool:
    """Whether a model passed to fit, or the LightningModule Lightning trains, runs through torch.compile: a
    compiled wrapper, a module compiled in place, or Lightning's own unwrapping of one (its `_compiler_ctx`)."""
    if is_compiled(model):
        return True
    return bool(getattr(getattr(model, "_orig_mod", model), "_compiler_ctx", None))


def switch_model(model: Any, record: FrameworkRecord, fields: dict[str, Any], package: str) -> Any:
    """The model fit() gets: the LightningModule in the run's memory format, compiled or not as the run asks,
    the way Lightning's docs compile one (fit(torch.compile(model)))."""
    if not isinstance(model, torch.nn.Module):
        return model
    module = getattr(model, "_orig_mod", model)
    inside = compiled_submodule(module)
    if "compile" in fields and inside is not None:
        record.unsupported["compile"] = COMPILED_INSIDE.format(name=inside)
        fields = {k: v for k, v in fields.items() if k != "compile"}
    switch_models(record, module, fields, NAME)      # in place: Module.to, the model's own checkpointing switch
    if "compile" not in fields:
        return model
    wanted = bool(fields["compile"])
    had = compiled(model)
    record.set("compile", "torch.compile", wanted, had)
    if wanted:
        return model if had else torch.compile(module)
    if getattr(module, "_compiler_ctx", None):
        importlib.import_module(f"{package}.utilities.compile").to_uncompiled(module)
    if getattr(module, "_compiled_call_impl", None) is not None:     # nn.Module.compile() in place
        module._compiled_call_impl = None
    return module


def patch_optimizer_conf(module: Any, board: Board, record: Callable[[], FrameworkRecord]) -> None:
    original = module._configure_optimizers
    if getattr(original, PATCHED, False):
        return

    @functools.wraps(original)
    def _configure_optimizers(optim_conf: Any) -> Any:
        if any(name in board.fields for name in optimizer_fields()):
            optim_conf = switch_optim_conf(record(), optim_conf, board.fields)
        return original(optim_conf)

    setattr(_configure_optimizers, PATCHED, True)
    module._configure_optimizers = _configure_optimizers


def switch_optim_conf(record: FrameworkRecord, conf: Any, fields: dict[str, Any]) -> Any:
    """What configure_optimizers() returned (an optimizer, a list of them, ([optimizers], [schedulers]), a dict
    with "optimizer" and "lr_scheduler", a list of such dicts) with each torch optimizer rebuilt with the run's
    optimizer switches in `fields` (common.switch_optimizers), and every scheduler in it rebound to its
    optimizer's replacement."""
    swapped: dict[int, tuple[Any, Any]] = {}

    def swap(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if type(optimizer).__name__ == "_MockOptimizer":      # Lightning's stand-in when it returned None
            return optimizer
        if id(optimizer) not in swapped:
            swapped[id(optimizer)] = (optimizer, switch_optimizers(record, optimizer, fields))
        return swapped[id(optimizer)][1]

    rewritten = map_conf(conf, swap)
    for scheduler in schedulers_in(rewritten):
        old, new = swapped.get(id(scheduler.optimizer), (None, None))
        if new is not None and new is not old:
            rebind_scheduler(scheduler, new)
    return rewritten


def map_conf(conf: Any, swap: Callable[[torch.optim.Optimizer], torch.optim.Optimizer]) -> Any:
    """`conf` with every torch optimizer in it replaced by swap(optimizer); containers keep their type."""
    if isinstance(conf, torch.optim.Optimizer):
        return swap(conf)
    if isinstance(conf, dict):
        return type(conf)({k: map_conf(v, swap) for k, v in conf.items()})
    if isinstance(conf, (list, tuple)):
        items = [map_conf(v, swap) for v in conf]
        return type(conf)(*items) if hasattr(conf, "_fields") else type(conf)(items)
    return conf


def schedulers_in(conf: Any) -> list[Any]:
    """Every scheduler in a configure_optimizers() result: any object holding an `optimizer` (torch's, or a
    scheduler of another library Lightning accepts), bare or under a dict's "scheduler"."""
    if isinstance(conf, dict):
        return [s for v in conf.values() for s in schedulers_in(v)]
    if isinstance(conf, (list, tuple)):
        return [s for v in conf for s in schedulers_in(v)]
    optimizer = getattr(conf, "optimizer", None)
    return [conf] if isinstance(optimizer, torch.optim.Optimizer) else []


def patch_loader_source(cls: type, board: Board, record: Callable[[], FrameworkRecord],
                        fitting: dict[str, Any]) -> None:
    """The training loader, wherever it comes from (the module's train_dataloader(), a DataModule's, or
    fit(train_dataloaders=...)): Lightning asks the source for it at the start of each fit. Its batch size
    (times the Trainer's gradient accumulation) is the samples of one optimizer step, for a rate in samples/s."""
    original = cls.dataloader
    if getattr(original, PATCHED, False):
        return

    @functools.wraps(original)
    def dataloader(self) -> Any:
        loaders = original(self)
        if self.name != "train_dataloader":
            return loaders
        if any(name in board.fields for name in LOADER_FIELDS):
            loaders = switch_loaders(record(), loaders, board.fields)
        if asks_batches(board.fields):
            loaders = switch_padded_loader(record(), loaders, board.fields, fitting.get("trainer"))
        loader = first_loader(loaders)
        sampler = getattr(loader, "batch_sampler", None)
        batch = getattr(loader, "batch_size", None) or getattr(sampler, "batch_size", None)
        if batch:
            board.samples_per_step = batch * getattr(fitting.get("trainer"), "accumulate_grad_batches", 1)
        return loaders

    setattr(dataloader, PATCHED, True)
    cls.dataloader = dataloader


def switch_loaders(record: FrameworkRecord, loaders: Any, fields: dict[str, Any]) -> Any:
    """The training loader(s) with the run's settings: a DataLoader, or each DataLoader of a list or dict."""
    if isinstance(loaders, DataLoader):
        return switch_loader(record, loaders, fields)
    if isinstance(loaders, dict):
        return type(loaders)({k: switch_loaders(record, v, fields) for k, v in loaders.items()})
    if isinstance(loaders, (list, tuple)) and not hasattr(loaders, "_fields"):
        return type(loaders)(switch_loaders(record, v, fields) for v in loaders)
    for name in fields:
        if name in LOADER_FIELDS:
            record.unsupported[name] = f"the training data is a {type(loaders).__name__}, not a torch DataLoader"
    return loaders


def switch_padded_loader(record: FrameworkRecord, loaders: Any, fields: dict[str, Any], trainer: Any) -> Any:
    """The padding switches on the training loader the fit loop iterates (the first, where the script gives
    several), its collator kept on the fitting Trainer for the read-back (a later fit's loader replaces it)."""
    loader = first_loader(loaders)
    switched, collator = switch_batches(record, loader if loader is not None else loaders, fields,
                                        getattr(trainer, "lightning_module", None))
    if trainer is not None and hasattr(trainer, FIT_STATE):
        getattr(trainer, FIT_STATE).update(packing=collator, fields=fields)
    return loaders if loader is None or switched is loader else replace_loader(loaders, loader, switched)


def replace_loader(loaders: Any, old: DataLoader, new: DataLoader) -> Any:
    """`loaders` (a DataLoader, or a list or dict of them) with `old` replaced by `new`; containers keep their type."""
    if loaders is old:
        return new
    if isinstance(loaders, dict):
        return type(loaders)({k: replace_loader(v, old, new) for k, v in loaders.items()})
    if isinstance(loaders, (list, tuple)) and not hasattr(loaders, "_fields"):
        return type(loaders)(replace_loader(v, old, new) for v in loaders)
    return loaders


def first_loader(loaders: Any) -> DataLoader | None:
    if isinstance(loaders, DataLoader):
        return loaders
    values = loaders.values() if isinstance(loaders, dict) else loaders if isinstance(loaders, (list, tuple)) else ()
    return next((found for v in values if (found := first_loader(v)) is not None), None)


def compile_graphs() -> int:
    """How many graphs dynamo has compiled in this process (0 when it was never imported)."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def note(record: FrameworkRecord, topic: str, text: str) -> None:
    """One note per topic: a result written twice (speed mode, then at exit) keeps the latest."""
    record.notes[:] = [n for n in record.notes if not n.startswith(f"{topic}: ")] + [f"{topic}: {text}"]


def read_back(record: FrameworkRecord, trainer: Any) -> None:
    """Each switch as the fitting Trainer has it (the run's proof)."""
    plugin = getattr(trainer.strategy, "precision_plugin", None)
    if plugin is not None:
        record.prove("precision", getattr(plugin, "precision", type(plugin).__name__))
        note(record, "precision plugin", f"{type(plugin).__name__}({getattr(plugin, 'precision', '?')!r})")
    record.prove("benchmark", getattr(trainer, FIT_STATE, {}).get("benchmark", torch.backends.cudnn.benchmark))
    module = trainer.lightning_module
    if module is not None:
        graphs = compile_graphs()
        record.prove("torch.compile", (compiled(module) or compiled(trainer.strategy.model)) and graphs > 0)
        if "torch.compile" in record.switches:
            note(record, "torch.compile", f"{graphs} graph(s) compiled by dynamo")
        if "memory format" in record.switches:
            record.prove("memory format", memory_format_of(module))
    prove_optimizers(record, list(getattr(trainer, "optimizers", None) or []))
    prove_ddp_settings(record, trainer.strategy.model, getattr(trainer.strategy, "_ddp_kwargs", {}).get)
    state = getattr(trainer, FIT_STATE, {})
    loader = first_loader(trainer.train_dataloader) or state.get("train_loader")
    prove_loader(record, loader)
    if "packing" in state:
        prove_batches(record, state["packing"], loader, state["fields"])
    if ASYNC_IO in record.switches:
        io = type(trainer.strategy.checkpoint_io)
        record.prove(ASYNC_IO, any(c.__name__ == "AsyncCheckpointIO" for c in io.__mro__))
