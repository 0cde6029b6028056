"""What the run did, observed: the record's "observed" section, for every script run (a plain loop, a Session, a
framework's script). A flag whose name promises a speed-up but changes nothing (an autocast guarded by
`device == "cuda"` on a CPU, a `--compile` whose model is later replaced) is seen here, not assumed from the
command line.

The trained model is the first module called in training mode, with gradients on, whose parameters an optimizer
holds (optimizers are noticed as they are built, loaders as they are iterated: one patched constructor and one
listener to `__iter__` in instruments/loaders.py, nothing on the step). At that first training forward the Observer
decides once, tells its listeners (probe/inject.py switches a plain loop there), and reads the autocast state the
next module call sees, inside the model's forward (where a Session's or a framework's autocast is entered). The
rest is read when the record is written: the optimizer's class and implementation, the training loader's settings,
the conv weights' memory format, the compiles dynamo counted.

Shape of the section (others read it; keep it):
  {"precision": "bf16" | "fp16" | "fp32" | ..., "autocast": bool, "compiled": bool, "recompiles": int,
   "optimizer": class name | None, "optimizer_implementation": "fused" | "foreach" | "for-loop" | None,
   "loader": {"num_workers", "pin_memory", "persistent_workers", "prefetch_factor"} | None,
   "memory_format": "channels_last" | "contiguous" | None, "by": {field: "script" | "trainfast"}}
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..frameworks.common import LOADER_FIELDS, is_compiled
from ..instruments import loaders
from ..instruments.eager import register_eager
from ..techniques import switches
from ..techniques.memory_format import memory_format_of
from ..techniques.optimizer import impl_of

OBSERVED = "observed"       # the run record's key
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


def dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def autocast_state(device: torch.device) -> tuple[bool, torch.dtype | None]:
    """Whether autocast is on for `device`'s type here and now, and its dtype."""
    kind = device.type if device.type in ("cpu", "cuda", "xpu", "mps") else "cpu"
    if torch.is_autocast_enabled(kind):
        return True, torch.get_autocast_dtype(kind)
    return False, None


def implementation(optimizer: torch.optim.Optimizer) -> str:
    """What the optimizer's step runs: its flags, else what torch picks for its parameters when none is given
    (foreach where every parameter is on a device with multi-tensor kernels, else one tensor at a time)."""
    impl = impl_of(optimizer)
    if impl != "default":
        return impl
    params = [p for group in optimizer.param_groups for p in group["params"]]
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        fused, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    except (ImportError, TypeError):           # a torch that no longer has the private helper: unknown, not guessed
        return "default"
    return "fused" if fused else "foreach" if foreach else "for-loop"


def loader_of(loader: Any) -> dict[str, Any] | None:
    if not isinstance(loader, DataLoader):
        return None
    return {name: getattr(loader, name, None) for name in LOADER_FIELDS.values()}


class _LoaderNotice(loaders.LoaderListener):
    """A pass over a loader begins: the observer's loader listeners told (the loader switches set before its
    iterator is built), and the loader kept as the one iterated last."""

    def __init__(self, observer: "Observer") -> None:
        self.observer = observer

    def iterating(self, loader) -> None:
        for notice in self.observer.loader_listeners:
            notice(loader)
        self.observer.last_loader = weakref.ref(loader)


class Observer:
    """Notices the optimizers and loaders a script builds, finds its trained model at its first training forward,
    and reads what the run did (`observed`). `install()` patches and hooks, `close()` undoes it (a test's loop)."""

    def __init__(self) -> None:
        self.optimizers: list[weakref.ref] = []
        self.last_loader: Any = None             # the loader iterated last: at the first forward, the training one
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.loader: DataLoader | None = None
        self.refusal: str | None = None          # why the model is ambiguous (probe/inject.py switches none then)
        self.outside: tuple[bool, torch.dtype | None] = (False, None)     # autocast as the model was called
        self.inside: tuple[bool, torch.dtype | None] | None = None        # autocast inside its forward
        self.listeners: list[Callable[["Observer", nn.Module, tuple], tuple | None]] = []
        self.loader_listeners: list[Callable[[DataLoader], None]] = []
        self.compiled_by_us = False              # probe/inject.py compiled the model's forward
        self._undo: list[Callable[[], None]] = []
        self._handle = None

    def install(self) -> "Observer":
        observer = self
        init = torch.optim.Optimizer.__init__

        def noticed_init(optimizer, *args, **kwargs):
            init(optimizer, *args, **kwargs)
            observer.optimizers.append(weakref.ref(optimizer))

        torch.optim.Optimizer.__init__ = noticed_init
        self._undo += [lambda: setattr(torch.optim.Optimizer, "__init__", init),
                       loaders.listen(_LoaderNotice(self))]
        # never traced: eager beside a compiled model (instruments/eager.py), as instruments/batches.py's hook
        self._handle = register_eager(nn.modules.module.register_module_forward_pre_hook, self.forward_seen)
        return self

    def close(self) -> None:
        for undo in self._undo:
            undo()
        self._undo = []
        self.stop_watching()

    def stop_watching(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    # --- the first training forward ----------------------------------------------------------------------

    def alive_optimizers(self) -> list[torch.optim.Optimizer]:
        found = [ref() for ref in self.optimizers]
        return [o for o in found if o is not None and any(g["params"] for g in o.param_groups)]

    def forward_seen(self, module: nn.Module, args: tuple) -> tuple | None:
        if self.model is not None:                 # decided: this call runs inside the model's forward
            device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
            if self.inside is None:
                self.inside = autocast_state(device)
            self.stop_watching()
            return None
        if not module.training or not torch.is_grad_enabled() or next(module.parameters(), None) is None:
            return None
        return self.decide(module, args)

    def decide(self, module: nn.Module, args: tuple) -> tuple | None:
        """`module` ran the first training forward: the trained model when an optimizer holds its parameters
        and no optimizer holds another module's; else the reason it is ambiguous (`refusal`)."""
        name = type(module).__name__
        optimizers = self.alive_optimizers()
        mine = {id(p) for p in module.parameters()}
        held = [o for o in optimizers if any(id(p) in mine for g in o.param_groups for p in g["params"])]
        if optimizers and not held:
            # A module outside every optimizer (a frozen teacher, a backbone left out): the trained model is a
            # later one; it is still found for what is observed, but nothing is switched on either.
            self.refusal = self.refusal or (f"a model called outside any optimizer's parameters: {name} ran the "
                                            "first training forward and no optimizer holds its parameters")
            return None
        if not optimizers:
            self.refusal = (f"no optimizer existed when {name} ran the first training forward: the trained model "
                            "cannot be told from the optimizer's parameters")
        others = sum(1 for o in optimizers for g in o.param_groups for p in g["params"] if id(p) not in mine)
        if others and self.refusal is None:
            self.refusal = (f"two models trained in one loop: the optimizers hold {others} parameter tensor(s) "
                            f"outside {name}, the module the first training forward called")
        self.model, self.optimizer = module, (held or optimizers or [None])[0]
        loader = self.last_loader() if self.last_loader is not None else None
        self.loader = loader if isinstance(loader, DataLoader) else None
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        self.outside = autocast_state(device)
        for listen in self.listeners:
            args = listen(self, module, args) or args
        if not any(True for _ in module.children()):       # a leaf model: its forward calls no other module
            self.inside = autocast_state(device)
            self.stop_watching()
        return args

    # --- what the run did ----------------------------------------------------------------------------------

    def observed(self, compiles: dict[str, Any] | None = None, by_trainfast: set[str] = frozenset()) -> dict:
        """The section (module docstring). `compiles`: the run's compile window (instruments/recompiles.py);
        `by_trainfast`: the recipe fields trainfast turned on in this run (the rest is the script's own)."""
        model = self.model
        enabled, dtype = self.inside if self.inside is not None else self.outside
        if not enabled:
            # `is not None`: a compiled module's truth value is its len(), which dynamo's wrapper refuses
            dtype = (next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
                     if model is not None else None)
        counted = compiles or {}
        # the model runs through dynamo: compiled by the script (a wrapper, or in place), or by trainfast's hook
        # (probe/inject.py) where dynamo then compiled something
        compiled = model is not None and (is_compiled(model) or (self.compiled_by_us and bool(counted.get("compiles"))))
        out = {"precision": dtype_name(dtype), "autocast": bool(enabled), "compiled": compiled,
               "recompiles": int(counted.get("recompiles") or 0),
               "optimizer": type(self.optimizer).__name__ if self.optimizer is not None else None,
               "optimizer_implementation": implementation(self.optimizer) if self.optimizer is not None else None,
               "loader": loader_of(self.loader),
               "memory_format": memory_format_of(model) if model is not None else None}
        on = {"precision": out["precision"] not in (None, "fp32"), "compiled": compiled,
              "optimizer_implementation": self.optimizer is not None and impl_of(self.optimizer) != "default",
              "loader": bool(out["loader"] and (out["loader"]["num_workers"] or out["loader"]["pin_memory"])),
              "memory_format": out["memory_format"] == "channels_last"}
        by_field = observed_fields()
        out["by"] = {key: "trainfast" if by_field[key] in by_trainfast else "script"
                     for key, is_on in on.items() if is_on}
        return out


def observed_fields() -> dict[str, str]:
    """An observed key -> the Recipe field whose switch turns it on (the switch that declares it: Switch.observed)."""
    return {s.observed: s.fields[0] for s in switches() if s.observed}


def turned_on(probe) -> set[str]:
    """The recipe fields trainfast turned on in this run: those probe/inject.py applied to a plain loop, else,
    where a Session or a framework adapter applied the recipe, those the run asked on (not the Recipe's default)."""
    injected = getattr(probe, "injected", None)
    if injected is not None:
        return set(injected)
    board = probe.sections.get("frameworks")
    if probe.session is None and not getattr(board, "frameworks", None):
        return set()
    from ..recipe import Recipe, RecipeError, env_recipe_fields

    try:
        fields = env_recipe_fields()
    except RecipeError:
        return set()
    default = Recipe()
    return {name for name, value in fields.items() if value != getattr(default, name, value)}


def observed_section(probe) -> dict[str, Any] | None:
    """The record's section: {"observed": ...} for a run the Observer watched, else None."""
    observer = getattr(probe, "observer", None)
    if observer is None:
        return None
    return {OBSERVED: observer.observed(probe.compiles.read(), turned_on(probe))}
