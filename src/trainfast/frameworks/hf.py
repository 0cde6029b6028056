"""transformers' Trainer: each switch through the Trainer's own arguments, set in TrainingArguments'
__post_init__ (so arguments built by HfArgumentParser from a command line are switched too, before the
Trainer derives anything from them), and read back from what the Trainer ended up with.

Where each switch is set in this framework, or why it cannot be, is declared on the switch (its module's
`frameworks=` / `unreachable=`) and listed in the `transformers` column of `trainfast switches` and
docs/frameworks.md, generated from those declarations.

The Trainer's own evaluation is read where it keeps it: what evaluate() returns (the eval_* metrics, those of
compute_metrics included; the Trainer's evaluations during train() go through it too) joins the run's reported
metrics, and metric_for_best_model with greater_is_better is the script's declared metric. A DeepSpeed or FSDP
configuration (TrainingArguments.deepspeed, .fsdp) owns the switches it decides (common.PLUGIN_OWNS): those are
not applicable to the script, said so, and left as the script has them.

tf32 is set to False in every run: with torch_compile on and tf32 unset, TrainingArguments turns TF32 on
by itself, and compile's row would measure the two together. The script's value is reported."""
from __future__ import annotations

import functools
from typing import Any

import torch

from ..techniques import TrainBatches, batch_switches, optimizer_switches, recipe_rewrites, rewritten_settings
from ..techniques.memory_format import memory_format_of
from .board import UNSET, Board, FrameworkRecord
from .common import (AUTO_WORKERS, is_compiled, mark_plugin_owned, mark_shared_switches, prove_loader,
                     switch_cudnn_benchmark, switch_models)
from .hooks import when_imported
from .packing import named_batches, prove_batches, switch_collate
from .wrapping import prove_ddp_settings, switch_ddp_settings

NAME = "transformers"
ARG_LOADER = {"num_workers": "dataloader_num_workers", "pin_memory": "dataloader_pin_memory",
              "persistent_workers": "dataloader_persistent_workers", "prefetch_factor": "dataloader_prefetch_factor"}
PATCHED = "_trainfast_patched"
EVAL_SPEED = ("_runtime", "_samples_per_second", "_steps_per_second")    # evaluate()'s timings, not metrics


def install(board: Board) -> None:
    when_imported("transformers.training_args", lambda m: patch_arguments(m.TrainingArguments, board))
    when_imported("transformers.trainer", lambda m: patch_trainer(m.Trainer, board))


def record_of(board: Board) -> FrameworkRecord:
    import transformers

    return board.framework(NAME, transformers.__version__)


def patch_arguments(cls: type, board: Board) -> None:
    if getattr(cls.__post_init__, PATCHED, False):
        return
    original = cls.__post_init__

    @functools.wraps(original)
    def __post_init__(self, *args: Any, **kwargs: Any) -> None:
        switch_arguments(self, record_of(board), board.fields)
        original(self, *args, **kwargs)
        settle_loader_arguments(self)

    setattr(__post_init__, PATCHED, True)
    cls.__post_init__ = __post_init__


def switch_arguments(args: Any, record: FrameworkRecord, fields: dict[str, Any]) -> None:
    """Set the run's switches on the arguments before transformers derives anything from them."""
    def put(field_: str, setting: str, value: Any) -> None:
        had = getattr(args, setting, None)      # None: the script left it unset
        record.set(field_, setting, value, UNSET if had is None else had)
        setattr(args, setting, value)

    fields = owned_by_plugin(args, record, fields)
    if "precision" in fields:
        put("precision", "bf16", fields["precision"] == "bf16")
        put("precision", "fp16", fields["precision"] == "fp16")
        put("tf32", "tf32", False)
        if fields["precision"] != "fp32" and not torch.cuda.is_available() and not args.use_cpu:
            put("precision", "use_cpu", True)      # the Trainer refuses bf16 on a CPU unless told it is one
    if "compile" in fields:
        put("compile", "torch_compile", bool(fields["compile"]))
        if not fields["compile"]:       # a backend or mode alone turns torch_compile back on
            put("compile", "torch_compile_backend", None)
            put("compile", "torch_compile_mode", None)
        put("tf32", "tf32", False)
    switch_optim(args, record, fields)
    for name, setting in ARG_LOADER.items():
        if name in fields:
            value = fields[name]
            if name == "num_workers" and not isinstance(value, int):
                record.unsupported[name] = AUTO_WORKERS
                continue
            put(name, setting, value)
    if "seed" in fields:
        put("seed", "seed", int(fields["seed"]))
    switch_rewritten(args, record, fields)
    if "activation_checkpointing" in fields:
        switch_checkpointing_argument(args, record, bool(fields["activation_checkpointing"]))
    switch_batch_arguments(args, record, fields)
    switch_ddp_settings(record, fields, lambda k: getattr(args, k, None), lambda k, v: setattr(args, k, v),
                        trainer=True)
    mark_shared_switches(record, fields)
    if "cudnn_benchmark" in fields:
        switch_cudnn_benchmark(record, bool(fields["cudnn_benchmark"]))


def owned_by_plugin(args: Any, record: FrameworkRecord, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` less those a DeepSpeed or FSDP configuration of the script decides (marked not applicable)."""
    for plugin, setting in (("deepspeed", "deepspeed"), ("fsdp", "fsdp")):
        if getattr(args, setting, None):
            owned = mark_plugin_owned(record, fields, plugin, f"the script's TrainingArguments.{setting}")
            fields = {k: v for k, v in fields.items() if k not in owned}
    return fields


def switch_checkpointing_argument(args: Any, record: FrameworkRecord, enabled: bool) -> None:
    """transformers 5 calls it activation_checkpointing, with gradient_checkpointing a deprecated alias that
    wins when the new name is unset: both are set, the script's value read from either."""
    names = [n for n in ("activation_checkpointing", "gradient_checkpointing") if hasattr(args, n)]
    had = next((getattr(args, n) for n in names if getattr(args, n) is not None), None)
    record.set("activation_checkpointing", names[0], enabled, UNSET if had is None else had)
    for name in names:
        setattr(args, name, enabled)


def switch_batch_arguments(args: Any, record: FrameworkRecord, fields: dict[str, Any]) -> None:
    """The batch switches the Trainer has an argument for (BatchSwitch.arguments: its length-grouped sampler), set
    there; the others act on its collator (training_collator)."""
    for name, hooks in batch_switches():
        if name in fields and hooks.arguments is not None:
            for setting, wanted, had in hooks.arguments(args, fields[name]):
                record.set(name, setting, wanted, UNSET if had is None else had)


def switch_optim(args: Any, record: FrameworkRecord, fields: dict[str, Any]) -> None:
    """The run's optimizer switches through the Trainer's one `optim` choice, in techniques.OPTIMIZER_ORDER:
    each asked switch that has a Trainer setting (OptimizerSwitch.trainer_optim) turns the script's optim into
    its own (the low-bit states into adamw_torch_8bit / _4bit, which build torchao's classes; the implementation
    into adamw_torch / adamw_torch_fused), recorded with the script's optim; one the Trainer has no choice for
    is said so. A switch that replaces the class (the low-bit states) rules out the ones after it."""
    optim = getattr(args.optim, "value", args.optim)
    ruled_out = ""
    for name, how in optimizer_switches():
        if name not in fields or how.trainer_optim is None:
            continue
        if ruled_out:
            record.unsupported[name] = ruled_out
            continue
        if how.replaces and fields[name] != how.default:
            ruled_out = how.replaces
        try:
            wanted = how.trainer_optim(fields[name], optim)
        except ValueError as exc:
            record.unsupported[name] = str(exc)
            continue
        if wanted is not None:
            record.set(name, "optim", wanted, optim)
            args.optim = optim = wanted


def trainer_optim_of(optimizer: Any) -> str:
    """The `optim` name of the optimizer the Trainer built, as the optimizer switches read it; its class's
    name where none does."""
    return next((name for _, how in optimizer_switches() if how.trainer_optim_of is not None
                 and (name := how.trainer_optim_of(optimizer)) is not None), type(optimizer).__name__)


# The Trainer's arguments for the Recipe's fields a recipe rewrite makes concrete (the batch size, the learning rate
# and the warm-up a bigger batch scales: techniques/batch_scale.py)
BATCH_ARGS = {"batch_size": "per_device_train_batch_size", "grad_accum_steps": "gradient_accumulation_steps",
              "lr": "learning_rate", "warmup_steps": "warmup_steps"}


def switch_rewritten(args: Any, record: FrameworkRecord, fields: dict[str, Any]) -> None:
    """The script's batch (or accumulation), learning rate and warm-up as the run's recipe rewrites make them
    concrete from the script's own values (techniques.rewritten_settings: the built-in run's arithmetic), each
    recorded with the script's value for the field that decides it. A warm-up given as a ratio (a float below 1: a
    share of the total steps, which already shrink with a bigger batch) is left alone."""
    if not any(name in fields for name, _ in recipe_rewrites()):
        return                      # nothing to rewrite: the script's arguments are not read
    warmup = args.warmup_steps or 0
    ratio = 0 < warmup < 1
    current = {name: getattr(args, setting) for name, setting in BATCH_ARGS.items()}
    current["warmup_steps"] = None if ratio else int(warmup)
    settings = rewritten_settings(fields, current)
    if settings and ratio:
        record.notes.append(f"warmup_steps={warmup} is a ratio of the total steps: left as the script has it")
    for name, (value, field_) in settings.items():
        setting = BATCH_ARGS[name]
        record.set(field_, setting, value, getattr(args, setting))
        setattr(args, setting, value)


def read_batch_settings(record: FrameworkRecord, trainer: Any, optimizer: Any, loader: Any) -> None:
    """The batch size, learning rate, accumulation and warm-up as the Trainer trains with them (a bigger batch's
    proof): the per-device batch of the loader it iterates (its arguments' where the loader was not built), the
    learning rate the scheduler started the optimizer from, the accumulation and the warm-up its training loop
    reads from its arguments."""
    args = trainer.args
    # Accelerate's loader batches through its batch sampler (its own batch_size is None)
    batch = (getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
             or getattr(trainer, "_train_batch_size", None))
    record.prove("per_device_train_batch_size",
                 batch // max(1, args.n_gpu) if batch else args.per_device_train_batch_size)
    groups = optimizer.param_groups if optimizer is not None else []
    record.prove("learning_rate", groups[0].get("initial_lr", groups[0]["lr"]) if groups else args.learning_rate)
    record.prove("gradient_accumulation_steps", args.gradient_accumulation_steps)
    record.prove("warmup_steps", args.warmup_steps)


def settle_loader_arguments(args: Any) -> None:
    """With no loader workers, no persistent workers and no prefetch factor: DataLoader refuses them."""
    if not args.dataloader_num_workers:
        args.dataloader_persistent_workers = False
        args.dataloader_prefetch_factor = None


def patch_trainer(cls: type, board: Board) -> None:
    if getattr(cls.__init__, PATCHED, False):
        return
    init, get_loader, evaluate = cls.__init__, cls.get_train_dataloader, cls.evaluate

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        record = record_of(board)
        if self.model is not None:
            self.model = switch_models(record, self.model, board.fields, NAME)
        # The batch switches on the script's own collator (set on it, or the counting collator wrapped around it).
        self._trainfast_packing = training_collator(self, record, board.fields)
        args = self.args
        board.samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        # The latest Trainer is the one read back. Held, not weakly: the proof is read when the result is
        # written, which for a run that ends by itself is at exit, after the script has dropped its Trainer.
        if "transformers.trainer" not in board.held:
            record.readers.append(lambda r: read_back(r, board.held["transformers.trainer"]))
        board.held["transformers.trainer"] = self
        declare_metric(board, args)

    @functools.wraps(evaluate)
    def evaluate_(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        metrics = evaluate(self, *args, **kwargs)
        board.record_metrics({k: v for k, v in (metrics if isinstance(metrics, dict) else {}).items()
                              if k != "epoch" and not k.endswith(EVAL_SPEED)})
        return metrics

    @functools.wraps(get_loader)
    def get_train_dataloader(self, *args: Any, **kwargs: Any):
        # The training batches through the packing collator (padding_free; their padding counted in every run);
        # evaluation keeps the script's collator and shapes.
        script_collator = self.data_collator
        packing = getattr(self, "_trainfast_packing", None)
        if packing is not None and script_collator is not None:
            packing.inner, self.data_collator = script_collator, packing
        try:
            loader = get_loader(self, *args, **kwargs)
        finally:
            self.data_collator = script_collator
        self._trainfast_loader = loader          # held for the read-back, as the Trainer is
        return loader

    setattr(__init__, PATCHED, True)
    cls.__init__, cls.get_train_dataloader, cls.evaluate = __init__, get_train_dataloader, evaluate_


def training_collator(trainer: Any, record: FrameworkRecord, fields: dict[str, Any]):
    """The batch switches the Trainer has no argument for, on its data_collator: set on it (its
    pad_to_multiple_of), or a counting collator wrapped around it for the training batches (packing them), proven
    from the batches it made when the result is written. None where nothing wraps it. A switch the Trainer cannot
    take (TRL packing its batches itself) is said not applicable and left off."""
    values = {name: value for name, value in named_batches(fields).items()
              if next(h for n, h in batch_switches() if n == name).arguments is None}
    for name, hooks in batch_switches():
        if name in values and hooks.trainer_refusal is not None:
            why = hooks.trainer_refusal(trainer, record.notes)
            if why:
                record.unsupported[name] = why
                values[name] = False
    count = any(hooks.counts for name, hooks in batch_switches() if name in values)
    batches = TrainBatches(trainer.data_collator, model=trainer.model, checks_model=True, collate_name="data_collator")
    collate = switch_collate(record, batches, values, count)
    if not count:
        return None
    proven = {**named_batches(fields), **values}          # the Trainer's own grouping: its batches' padding too
    record.readers.append(lambda r: prove_batches(r, collate, None, proven, "data_collator"))
    return collate


def declare_metric(board: Board, args: Any) -> None:
    """metric_for_best_model, named as evaluate() returns it (with the eval_ prefix the Trainer adds), better
    high or low as greater_is_better says (which TrainingArguments defaults from the name)."""
    name = getattr(args, "metric_for_best_model", None)
    if not name:
        return
    key = name if name.startswith("eval_") else f"eval_{name}"
    greater = args.greater_is_better if args.greater_is_better is not None else not key.endswith("loss")
    board.declare(key, "max" if greater else "min",
                  f"the script's metric_for_best_model={name!r}, greater_is_better={greater}")


def read_back(record: FrameworkRecord, trainer: Any) -> None:
    """Each switch as the Trainer ended up with it (the run's proof)."""
    if trainer is None:
        return
    args = trainer.args
    mixed = str(getattr(getattr(trainer, "accelerator", None), "mixed_precision", "no"))
    record.prove("bf16", mixed == "bf16")
    record.prove("fp16", mixed == "fp16")
    record.prove("tf32", args.tf32)
    record.prove("torch_compile", is_compiled(trainer.model_wrapped) or is_compiled(trainer.model))
    record.prove("torch_compile_backend", args.torch_compile_backend)
    record.prove("torch_compile_mode", args.torch_compile_mode)
    record.prove("seed", args.seed)
    record.prove("use_cpu", args.use_cpu)
    optimizer = getattr(getattr(trainer, "optimizer", None), "optimizer", getattr(trainer, "optimizer", None))
    if optimizer is not None:
        record.prove("optim", trainer_optim_of(optimizer))
    loader = getattr(trainer, "_trainfast_loader", None)
    read_batch_settings(record, trainer, optimizer, loader)
    prove_loader(record, loader)
    for name, setting in ARG_LOADER.items():
        if loader is not None:
            record.prove(setting, getattr(loader, name, None))
    for _, hooks in batch_switches():
        for setting, value in hooks.read_arguments(args, loader) if hooks.read_arguments is not None else ():
            record.prove(setting, value)
    checkpointing = bool(getattr(trainer.model, "is_gradient_checkpointing", False))
    record.prove("activation_checkpointing", checkpointing)
    record.prove("gradient_checkpointing", checkpointing)
    prove_ddp_settings(record, trainer.model_wrapped, lambda k: getattr(args, k, None))
    if "memory format" in record.switches and trainer.model is not None:
        record.prove("memory format", memory_format_of(trainer.model))

