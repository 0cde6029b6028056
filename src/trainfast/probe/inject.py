"""The built-in switches in an unmodified plain loop: a script with neither a trainfast.Session nor a framework
trainfast switches from inside (a model, an optimizer, a DataLoader, loss.backward(), optimizer.step()).

The probe's Observer (observe.py) finds the trained model at its first training forward; there, once, this module
applies the run's switches through the same declarations every other kind of run uses (techniques/: the model
switches' apply, the optimizer switches' rebuild, the loader's settings, the process switches), each recorded
and read back from the running process like a framework adapter's (frameworks/board.py: a "plain loop"
section), so the ablation times them and rules out, with why, the ones that cannot act:
  - precision bf16: autocast around the model's training forward (its `forward`, wrapped on the instance: the
    script's own `model(x)` calls enter it). fp16 the same, with the Session's loss scaler around the script's own
    `loss.backward()` and `optimizer.step()` (scaler.py), refused where those cannot be proven reached;
  - channels_last (every model switch): on the model, and on its 4-D inputs as the forward receives them;
  - compile: the model's forward compiled (training forwards only; evaluation stays eager, as a Session's);
  - optimizer_impl: the script's optimizer rebuilt by the switch (same class, same groups) and its flags carried
    back onto the object the script steps (a class with no fused form is said so);
  - the loader settings: set on the first DataLoader the script iterates, proven to be the one that fed the
    training forward.
What the script turned on itself (its autocast, its compiled model, its fused optimizer) is recorded as the
script's own and left as it is; the baseline turns nothing off. Where the trained model is ambiguous (two models
in one loop, a model outside every optimizer) no model or optimizer switch acts, and each says why.
The first training forward runs under the switches too (its autocast entered from the hook, its inputs converted);
compile starts with the second, as a compiled run's first step is warm-up anyway.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from ..frameworks import SECTION
from ..frameworks.board import UNSET, FrameworkRecord
from ..frameworks.common import (AUTO_WORKERS, LOADER_FIELDS, is_compiled, loader_settings, mark_shared_switches,
                                 prove_loader, prove_optimizers, switch_models, switch_optimizers)
from ..techniques import AMP, model_switches, optimizer_fields, process_wide_fields
from ..techniques.compile import effect as compile_effect
from ..techniques.precision import auto_amp_dtype, build_precision
from .observe import Observer, dtype_name
from .scaler import TWO_OPTIMIZERS, LossScaling

PLAIN = "plain loop"          # the run record's section, beside the frameworks' (frameworks/board.py)
LEVELS = ("master weights and pure half precision change the step itself (fp32 master copies, the update's cast), "
          "which a plain loop runs itself; its precision switch is autocast (O1)")
UNREACHED = ("a plain loop: trainfast reaches its model, optimizer and loader through the probe's hooks, not its step "
             "or its input pipeline; this switch needs a trainfast.Session (three lines) or a framework adapter")
OTHER_LOADER = ("the first DataLoader the script iterated did not feed its training forward: the training loader "
                "is not known when its iteration starts")
ITERABLE = ("the loader's dataset is an IterableDataset: each worker would yield the whole stream unless the "
            "script splits it itself")
GROUP_FLAGS = ("fused", "foreach")


def served_fields() -> set[str]:
    """The recipe fields a plain loop can be switched on."""
    return {"precision", "precision_level", "compile", *LOADER_FIELDS, *optimizer_fields(),
            *(name for name, _ in model_switches()), *process_wide_fields()}


def model_level() -> set[str]:
    """The fields that act on the trained model or its optimizer: none acts where the model is ambiguous."""
    return served_fields() - set(LOADER_FIELDS) - set(process_wide_fields())


def asked_on(fields: dict[str, Any]) -> dict[str, Any]:
    """Of the run's fields, those asked at another value than the Recipe's default: the switches to turn on (the
    baseline turns nothing off in a loop it does not own)."""
    from ..recipe import Recipe

    default = Recipe()
    return {k: v for k, v in fields.items() if k != "seed" and v != getattr(default, k, v)}


def channels_last_inputs(args: tuple) -> tuple:
    return tuple(a.contiguous(memory_format=torch.channels_last)
                 if isinstance(a, torch.Tensor) and a.dim() == 4 and a.is_floating_point() else a for a in args)


class PlainLoop:
    """The run's switches, applied to a plain loop where the Observer finds its model (see the module docstring).
    `probe.injected`: the fields it turned on (the observed section's "by")."""

    def __init__(self, probe: Any, observer: Observer, fields: dict[str, Any]) -> None:
        self.probe, self.observer, self.fields = probe, observer, dict(fields)
        self.asked = asked_on(fields)
        self.loader: DataLoader | None = None
        self.loader_set: dict[str, tuple[Any, Any]] = {}     # name -> (the run's value, the script's)
        self.loader_refused: dict[str, str] = {}
        self.dtype: torch.dtype | None = None
        self.channels_last = False
        self.compile = False
        # fp16 asked (or amp, which may be fp16 on the device): the backward and the clips patched before the
        # script imports them; the scaler acts only once armed on the trained model's optimizer (switch_precision)
        self.scaling = LossScaling().install() if self.asked.get("precision") in ("fp16", AMP) else None
        probe.scaler = None
        observer.listeners.append(self.model_seen)
        observer.loader_listeners.append(self.loader_seen)

    def owns_loop(self) -> bool:
        """Neither a Session nor a framework adapter switches this run (they apply the recipe themselves)."""
        board = self.probe.sections.get(SECTION)
        return self.probe.session is None and board is not None and not (set(board.frameworks) - {PLAIN})

    # --- the loader: its first iteration ----------------------------------------------------------------

    def loader_seen(self, loader: DataLoader) -> None:
        if self.loader is not None or not self.owns_loop() or self.observer.model is not None:
            return
        self.loader = loader
        settings = loader_settings({k: v for k, v in self.asked.items() if k in LOADER_FIELDS}, loader)
        if "num_workers" in settings and not isinstance(settings["num_workers"], int):
            self.loader_refused["num_workers"] = AUTO_WORKERS
            settings.pop("num_workers")
        if settings.get("num_workers") and isinstance(loader.dataset, IterableDataset):
            self.loader_refused.update({name: ITERABLE for name in settings})
            return
        for name, value in settings.items():
            self.loader_set[name] = (value, getattr(loader, name, None))
            object.__setattr__(loader, name, value)     # DataLoader refuses persistent_workers after its init
        if loader.num_workers and loader.prefetch_factor is None:
            object.__setattr__(loader, "prefetch_factor", 2)           # what DataLoader's init gives workers

    # --- the model: its first training forward ----------------------------------------------------------

    def model_seen(self, observer: Observer, module: nn.Module, args: tuple) -> tuple | None:
        if not self.owns_loop():
            return None
        record = self.probe.sections[SECTION].framework(PLAIN, f"torch {torch.__version__}")
        self.probe.injected = set()
        mark_shared_switches(record, self.fields)
        self.record_loader(record, observer)
        for name in self.fields:
            if name != "seed" and name not in served_fields():     # the frameworks' words do not fit a plain loop
                record.unsupported[name] = UNREACHED
        if observer.refusal is not None:
            record.unsupported.update({name: observer.refusal for name in self.fields if name in model_level()})
            return None
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        self.switch_precision(record, device)
        model_fields = {k: v for k, v in self.asked.items() if k in dict(model_switches())}
        switch_models(record, module, model_fields, None)     # every model switch, as the Session
        self.channels_last = "channels_last" in model_fields and "channels_last" not in record.unsupported
        self.switch_compile(record, module, device)
        self.switch_optimizer(record, observer.optimizer)
        self.probe.injected |= {k for k in self.asked if k in record_fields(record) and k not in record.unsupported
                                and not own(record, k)}
        return self.wrap(module, args, device)

    def record_loader(self, record: FrameworkRecord, observer: Observer) -> None:
        record.unsupported.update(self.loader_refused)
        if not self.loader_set:
            return
        if observer.loader is not self.loader:
            record.unsupported.update({name: OTHER_LOADER for name in self.loader_set})
            return
        for name, (value, script) in self.loader_set.items():
            record.set(name, f"DataLoader.{name}", value, script)
        record.readers.append(lambda r, loader=self.loader: prove_loader(r, loader))

    def switch_precision(self, record: FrameworkRecord, device: torch.device) -> None:
        if self.asked.get("precision_level", "autocast") != "autocast":
            record.unsupported["precision_level"] = LEVELS
        value = self.asked.get("precision")
        if value == AMP:
            value = auto_amp_dtype(device)
        if value == "fp16":
            self.switch_fp16(record, device)
        elif value == "bf16":
            enabled, dtype = self.observer.outside
            record.set("precision", "autocast", "bf16", dtype_name(dtype) if enabled else UNSET)
            self.dtype = None if enabled else torch.bfloat16           # the script's own autocast stands
            record.readers.append(lambda r: r.prove("autocast", self.observer.observed()["precision"]))

    def switch_fp16(self, record: FrameworkRecord, device: torch.device) -> None:
        """fp16 autocast with the Session's loss scaler around the script's backward and step (scaler.py)."""
        if len(self.observer.alive_optimizers()) > 1:
            record.unsupported["precision"] = TWO_OPTIMIZERS
            return
        enabled, dtype = self.observer.outside
        record.set("precision", "autocast", "fp16", dtype_name(dtype) if enabled else UNSET)
        record.readers.append(lambda r: r.prove("autocast", self.observer.observed()["precision"]))
        if enabled:                         # the script's own autocast (and its own scaler, if it has one) stands
            return
        self.dtype = torch.float16
        self.scaling.arm(build_precision("fp16", device), self.observer.optimizer)
        self.probe.scaler = self.scaling
        record.set("precision", "torch.amp.GradScaler", True)
        record.readers.append(lambda r: r.prove("torch.amp.GradScaler", self.scaling.read_back(),
                                                applied=bool(self.scaling.steps) and self.scaling.refused is None))

    def switch_compile(self, record: FrameworkRecord, module: nn.Module, device: torch.device) -> None:
        if not self.asked.get("compile"):
            return
        why = compile_effect(device)
        if not why.acts:
            record.unsupported["compile"] = why.reason
            return
        record.set("compile", "torch.compile", True, True if is_compiled(module) else UNSET)
        self.compile = self.observer.compiled_by_us = not is_compiled(module)
        record.readers.append(lambda r: r.prove(
            "torch.compile", self.observer.observed(self.probe.compiles.read())["compiled"]))

    def switch_optimizer(self, record: FrameworkRecord, optimizer: torch.optim.Optimizer | None) -> None:
        fields = {k: v for k, v in self.asked.items() if k in optimizer_fields()}
        if not fields or optimizer is None:
            return
        rebuilt = switch_optimizers(record, optimizer, fields)
        if rebuilt is not optimizer:
            if type(rebuilt) is not type(optimizer):
                why = (f"it replaces the optimizer's class ({type(rebuilt).__name__} for "
                       f"{type(optimizer).__name__}), and a plain loop steps its own object")
                record.unsupported.update({name: why for name in fields if name not in record.unsupported})
                return
            carry_flags(optimizer, rebuilt)
        record.readers.append(lambda r: prove_optimizers(r, [optimizer]))

    def wrap(self, module: nn.Module, args: tuple, device: torch.device) -> tuple | None:
        """The model's training forwards under the switches: its `forward` wrapped on the instance from the next
        call on, and this first call's autocast entered here (left by a one-shot forward hook)."""
        if not (self.dtype or self.channels_last or self.compile):
            return None
        inner = module.forward
        run = torch.compile(inner) if self.compile else inner
        dtype, convert = self.dtype, self.channels_last

        def forward(*a: Any, **k: Any) -> Any:
            if not (module.training and torch.is_grad_enabled()):
                return inner(*a, **k)               # evaluation as the script wrote it (eager, its own precision)
            with torch.autocast(device.type, dtype) if dtype else contextlib.nullcontext():
                return run(*(channels_last_inputs(a) if convert else a), **k)

        module.forward = forward
        if dtype is not None:
            entered = torch.autocast(device.type, dtype)
            entered.__enter__()

            def leave(*_: Any) -> None:
                entered.__exit__(None, None, None)
                handle.remove()
            handle = module.register_forward_hook(leave, always_call=True)
        return channels_last_inputs(args) if convert else None


def record_fields(record: FrameworkRecord) -> set[str]:
    return {s.field for s in record.switches.values()}


def own(record: FrameworkRecord, name: str) -> bool:
    """The script had the setting on itself (its autocast, its compiled model): trainfast turned nothing on."""
    return any(s.field == name and s.script not in (UNSET, None, False, "default") for s in record.switches.values())


def carry_flags(optimizer: torch.optim.Optimizer, rebuilt: torch.optim.Optimizer) -> None:
    """The rebuilt optimizer's implementation flags carried onto the object the script steps (its param groups and
    defaults; the fused kernel's own amp-scaling attribute with them). The rebuild itself checked the class and
    the parameters take them."""
    for mine, theirs in zip(optimizer.param_groups, rebuilt.param_groups):
        mine.update({k: theirs[k] for k in GROUP_FLAGS if k in theirs})
    optimizer.defaults.update({k: rebuilt.defaults[k] for k in GROUP_FLAGS if k in rebuilt.defaults})
    if hasattr(rebuilt, "_step_supports_amp_scaling"):
        optimizer._step_supports_amp_scaling = rebuilt._step_supports_amp_scaling


def install(probe: Any, observer: Observer) -> PlainLoop | None:
    """In a measured run: the plain-loop switches for TRAINFAST_RECIPE's fields (none asked: nothing to do)."""
    from ..recipe import RecipeError, env_recipe_fields

    try:
        fields = env_recipe_fields()
    except RecipeError:
        return None                        # the Session, if there is one, says what is wrong with it
    return PlainLoop(probe, observer, fields) if fields else None
