"""transformers' Trainer: each switch through the Trainer's own arguments, set in TrainingArguments'
__post_init__ (so arguments built by HfArgumentParser from a command line are switched too, before the
Trainer derives anything from them), and read back from what the Trainer ended up with.

| Recipe field      | TrainingArguments                                  | proof read back                          |
|-------------------|----------------------------------------------------|------------------------------------------|
| precision         | bf16, fp16 (and tf32 set explicitly, see below)    | the Accelerator's mixed_precision        |
| compile           | torch_compile (backend and mode cleared when off)  | the model the Trainer runs is compiled   |
| optimizer_impl    | optim: adamw_torch / adamw_torch_fused             | the optimizer's class and `fused` flag   |
| optimizer_state   | optim: adamw_torch_8bit / adamw_torch_4bit         | the optimizer's class (torchao's)        |
| num_workers, ...  | dataloader_num_workers, _pin_memory, ...           | the training DataLoader's own attributes |
| channels_last     | (none: the model's memory format, at Trainer init) | the model's conv weights                 |
| activation_checkpointing | activation_checkpointing (gradient_checkpointing) | the model's is_gradient_checkpointing |
| group_by_length   | train_sampling_strategy (4.x: group_by_length)     | the training loader's sampler            |
| padding_free      | (none: the training collator, wrapped to pack)     | every training batch packed              |
| pad_to_multiple   | (none: data_collator.pad_to_multiple_of)           | the collator's pad_to_multiple_of        |
| attention         | (none: the model's attn_implementation)            | the model's config                       |
| seed              | seed                                               | args.seed                                |
| batch_scale       | per_device_train_batch_size (scale_by=batch) or    | the training loader's batch size         |
|                   | gradient_accumulation_steps (=accumulation)        | gradient_accumulation_steps              |
|                   | learning_rate, warmup_steps (a ratio left alone)   | the optimizer's initial lr; warmup_steps |

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

from ..techniques import rewritten_settings
from ..techniques.memory_format import memory_format_of
from ..techniques.optimizer_state import TRAINER_OPTIM, state_of
from .board import UNSET, Board, FrameworkRecord
from .common import (AUTO_WORKERS, LOW_BIT_IMPL, is_compiled, mark_plugin_owned, mark_shared_switches, prove_loader,
                     switch_cudnn_benchmark, switch_models)
from .hooks import when_imported
from .packing import packing_collator, prove_packing, switch_pad_multiple, uses_length_groups

NAME = "transformers"
ADAMW = ("adamw_torch", "adamw_torch_fused")
LOW_BIT_OPTIM = (TRAINER_OPTIM["8bit"], TRAINER_OPTIM["4bit"])
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
    if fields.get("optimizer_state", "full") != "full":
        switch_optim_state(args, record, fields["optimizer_state"], "optimizer_impl" in fields)
    elif "optimizer_impl" in fields or "optimizer_state" in fields:        # fp32 moments: one of optim's AdamWs
        switch_optim(args, record, fields.get("optimizer_impl", "default"),
                     "optimizer_impl" if "optimizer_impl" in fields else "optimizer_state")
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
    if "group_by_length" in fields:
        switch_length_groups(args, record, bool(fields["group_by_length"]))
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


def switch_length_groups(args: Any, record: FrameworkRecord, enabled: bool) -> None:
    """transformers 5 names the sampler in train_sampling_strategy ("group_by_length" among its choices), 4 has
    a group_by_length flag. Off leaves the script's own strategy unless it was length grouping."""
    if hasattr(args, "train_sampling_strategy"):
        had = args.train_sampling_strategy
        wanted = "group_by_length" if enabled else ("random" if had == "group_by_length" else had)
        record.set("group_by_length", "train_sampling_strategy", wanted, had)
        args.train_sampling_strategy = wanted
        return
    had = getattr(args, "group_by_length", None)
    record.set("group_by_length", "group_by_length", enabled, UNSET if had is None else had)
    args.group_by_length = enabled


def switch_optim_state(args: Any, record: FrameworkRecord, state: str, impl_asked: bool) -> None:
    """The Trainer's own low-bit AdamW (optim adamw_torch_8bit / _4bit builds torchao's class), from the script's
    AdamW of any implementation; another optimizer is left as the script has it, why said."""
    optim = getattr(args.optim, "value", args.optim)
    if impl_asked:
        record.unsupported["optimizer_impl"] = LOW_BIT_IMPL
    if optim not in ADAMW + LOW_BIT_OPTIM:
        record.unsupported["optimizer_state"] = (f"the script's optim {optim!r} is not one of the Trainer's torch "
                                                 f"AdamWs (only {' / '.join(ADAMW)} have low-bit twins)")
        return
    record.set("optimizer_state", "optim", TRAINER_OPTIM[state], optim)
    args.optim = TRAINER_OPTIM[state]


def switch_optim(args: Any, record: FrameworkRecord, impl: str, field_: str = "optimizer_impl") -> None:
    """optim's fused or unfused AdamW for `impl`, recorded for `field_` (optimizer_state when the run asks only
    for fp32 moments: a script's own low-bit AdamW becomes the torch one)."""
    optim = getattr(args.optim, "value", args.optim)
    if field_ == "optimizer_state" and optim not in LOW_BIT_OPTIM:
        return                                     # fp32 moments already: nothing to switch
    if optim not in ADAMW + LOW_BIT_OPTIM:
        record.unsupported[field_] = (f"the script's optim {optim!r} has no fused/unfused pair among the "
                                      f"Trainer's optim choices (only {' / '.join(ADAMW)})")
        return
    if impl not in ("default", "fused"):
        record.unsupported[field_] = f"the Trainer's optim choices have no {impl!r} AdamW"
        return
    wanted = "adamw_torch_fused" if impl == "fused" else "adamw_torch"
    record.set(field_, "optim", wanted, optim)
    args.optim = wanted


# The Trainer's arguments for the Recipe's fields a recipe rewrite makes concrete (the batch size, the learning rate
# and the warm-up a bigger batch scales: techniques/batch_scale.py)
BATCH_ARGS = {"batch_size": "per_device_train_batch_size", "grad_accum_steps": "gradient_accumulation_steps",
              "lr": "learning_rate", "warmup_steps": "warmup_steps"}


def switch_rewritten(args: Any, record: FrameworkRecord, fields: dict[str, Any]) -> None:
    """The script's batch (or accumulation), learning rate and warm-up as the run's recipe rewrites make them
    concrete from the script's own values (techniques.rewritten_settings: the built-in run's arithmetic), each
    recorded with the script's value for the field that decides it. A warm-up given as a ratio (a float below 1: a
    share of the total steps, which already shrink with a bigger batch) is left alone."""
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
        # Rounded on the script's own collator, which the packing collator below wraps: one collator, one path.
        switch_pad_multiple(record, self.data_collator, board.fields, "data_collator.pad_to_multiple_of")
        if "padding_free" in board.fields:
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
    """The Trainer's training collator wrapped to count and pack its batches (frameworks/packing.py), proven from
    the batches it made when the result is written."""
    why = trl_packs(trainer, record)
    if why:
        record.unsupported["padding_free"] = why
        fields = {**fields, "padding_free": False}
    collator = packing_collator(record, trainer.model, trainer.data_collator, fields, "data_collator packs")
    record.readers.append(lambda r: prove_packing(r, collator, fields, "data_collator packs"))
    return collator


def trl_packs(trainer: Any, record: FrameworkRecord) -> str | None:
    """TRL's SFTTrainer packs by its own settings, read back in every run: SFTConfig(packing=True) packs the
    dataset when the trainer is built, padding_free=True (or best-fit packing) makes its collator flatten each
    batch into one row. Where the script has either on, why the padding_free switch cannot act: its batches are
    already packed, and no baseline could be the script without them. Off, the script's padded batches go through
    the packing collator, which gives the loss TRL's padding-free batches give (tests/test_trl.py)."""
    args = trainer.args
    if not (hasattr(args, "packing") and hasattr(args, "padding_free")):
        return None
    packs, flat = bool(args.packing), bool(getattr(trainer, "padding_free", args.padding_free))
    record.notes.append(f"TRL SFTConfig as the script set it: packing={packs}, padding_free={flat}")
    if not (packs or flat):
        return None
    said = " and ".join(name for name, on in (("packing=True", packs), ("padding_free=True", flat)) if on)
    return (f"the script's SFTConfig has {said}: TRL packs its batches itself, so there is no padding to remove "
            "and no baseline without packing to compare with (set them False in the script to measure packing)")


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
        fused = bool(optimizer.param_groups[0].get("fused")) if optimizer.param_groups else False
        name = type(optimizer).__name__
        state = state_of(optimizer)          # torchao's AdamW8bit / AdamW4bit: the Trainer's low-bit optim names
        record.prove("optim", TRAINER_OPTIM[state] if state != "full" else
                     ("adamw_torch_fused" if fused else "adamw_torch") if name == "AdamW" else name)
    loader = getattr(trainer, "_trainfast_loader", None)
    read_batch_settings(record, trainer, optimizer, loader)
    prove_loader(record, loader)
    for name, setting in ARG_LOADER.items():
        if loader is not None:
            record.prove(setting, getattr(loader, name, None))
    grouped = uses_length_groups(loader)
    record.prove("group_by_length", grouped)
    strategy = getattr(args, "train_sampling_strategy", None)
    record.prove("train_sampling_strategy", "group_by_length" if grouped else
                 (strategy if strategy != "group_by_length" else "not in the loader"))
    checkpointing = bool(getattr(trainer.model, "is_gradient_checkpointing", False))
    record.prove("activation_checkpointing", checkpointing)
    record.prove("gradient_checkpointing", checkpointing)
    if "memory format" in record.switches and trainer.model is not None:
        record.prove("memory format", memory_format_of(trainer.model))

