"""The sync counter, the first of the doctor's instruments (watch.py puts them around a loop), and the source
lines it names.

`SyncCounter`, a TorchFunctionMode: every call that reads a tensor's value on the host (`.item()`,
`.tolist()`, `.numpy()`, `.cpu()`, `.to("cpu")` from a GPU, `bool(t)`, `float(t)`, `int(t)`, printing or
formatting a tensor, `.nonzero()`) is counted with the source line that made it. On a GPU each one stalls
the host until the device has finished everything queued before it. On the CPU nothing is asynchronous,
so the same reads are counted because they *would* sync on a GPU (there `.to(...)` is left out: on the
CPU `x.to(device)` cannot be told from `x.to("cpu")`). Reads made by torch's own code (an optimizer's
step counters, which live on the host) are not the loop's and are not counted. A mode costs a Python call
per torch call, so it is switched on for a window of steps that is never timed.
"""
from __future__ import annotations

import linecache
import os
import sys
from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
INSTRUMENTS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The package root, one folder up from the instruments: a line in any trainfast file is trainfast's, not the loop's.
TRAINFAST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The instruments' own files (named, not imported: they import this one): their frames are the watch's,
# never the loop's.
INSTRUMENT_FILES = frozenset(os.path.join(INSTRUMENTS_DIR, name)
                             for name in ("watch.py", "steps.py", "forwards.py", "syncs.py", "gradients.py",
                                          "evalcheck.py", "tensors.py"))
# Frames between a Tensor method written in Python (__format__, __repr__) and its caller: the method itself.
PASS_THROUGH = {*INSTRUMENT_FILES, os.path.join(TORCH_DIR, "overrides.py"), os.path.join(TORCH_DIR, "_tensor.py")}

# Tensor methods that hand a tensor's value to the host: each one waits for the device to catch up.
SYNC_METHODS = frozenset({"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__",
                          "__repr__", "__format__", "nonzero"})
DROPOUTS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"})
# Calls that draw random numbers: in an eval-mode forward they are sampling by design (a VAE's reparameterization,
# a diffusion step's noise) or a hand-made dropout mask; either way they, not dropout, make two forwards differ.
RANDOM_CALLS = frozenset({"rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
                          "bernoulli", "bernoulli_", "normal", "normal_", "uniform_", "multinomial", "poisson",
                          "exponential_", "geometric_", "log_normal_", "cauchy_", "random_"})


def caller(skip_torch: bool) -> tuple[str, int] | None:
    """(file, line) of the code that made the current torch call. skip_torch=False: None when that code is
    torch's own (its reads are its business); True: torch's frames are walked past (F.dropout is Python)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path in PASS_THROUGH:
            frame = frame.f_back
            continue
        if path.startswith(TORCH_DIR):
            if not skip_torch:
                return None
            frame = frame.f_back
            continue
        return path, frame.f_lineno
    return None


def describe(where: tuple[str, int]) -> str:
    path, line = where
    code = linecache.getline(path, line).strip()
    short = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    return f"{short}:{line}" + (f"  `{code}`" if code else "")


def _to_host(args: tuple, kwargs: dict) -> bool:
    """`.to(...)` from a device to the CPU (the only `.to` that waits for the device)."""
    tensor = args[0] if args else None
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "cpu":
        return False
    target = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
    return target is not None and torch.device(target).type == "cpu"


def _drops(name: str, args: tuple, kwargs: dict) -> bool:
    """A dropout call that drops: F.dropout & co. with training=True (their default), or attention with a
    dropout_p above 0 (which, unlike nn.Dropout, does not follow eval(): the model must pass 0 there)."""
    if name == "scaled_dot_product_attention":
        return bool(kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0))
    return bool(kwargs.get("training", args[2] if len(args) > 2 else True))


class SyncCounter(TorchFunctionMode):
    """Counts host reads of tensor values by source line (see the module docstring), and functional dropout
    calls that still drop (training=True) by source line."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.on_cpu = device_type == "cpu"
        self.syncs: Counter = Counter()         # (op, file, line) -> calls
        self.dropouts: Counter = Counter()      # (file, line) -> calls with training=True
        self.randoms: Counter = Counter()       # (call, file, line) -> calls that drew random numbers
        # Inside a DataLoader's next(): the loader's reads of host tensors (a label's int()) are not syncs.
        self.in_loader = False
        # From an eval-mode forward to the next training forward: an evaluation's reads (a metric's .item()
        # per batch) are once per evaluation pass, not per training step.
        self.in_eval = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            # Dynamo traces a mode's __torch_function__ into the graph: the frame walk below would break the
            # user's graph, a break the doctor would then report as theirs. A read inside a compiled region
            # breaks the graph anyway, and runs (and is counted) in eager code.
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if self.in_loader or self.in_eval:
            pass
        elif name in SYNC_METHODS or (name == "to" and _to_host(args, kwargs)):
            tensor = args[0] if args else None
            # On a GPU a read of a host tensor is no sync; on the CPU every read counts (it would be one there).
            if isinstance(tensor, torch.Tensor) and (self.on_cpu or tensor.device.type != "cpu"):
                where = caller(skip_torch=False)
                if where is not None:
                    self.syncs[(name.strip("_"), *where)] += 1
        elif name in DROPOUTS or name == "scaled_dot_product_attention":
            if _drops(name, args, kwargs):
                where = caller(skip_torch=True)
                if where is not None:
                    self.dropouts[where] += 1
        elif name in RANDOM_CALLS:
            where = caller(skip_torch=True)
            if where is not None:
                self.randoms[(name, *where)] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.syncs.values())

    def by_line(self) -> list[dict[str, Any]]:
        """Every counting line, most calls first; trainfast's own lines (its Meter's once-a-window read) marked."""
        rows = [{"op": op, "where": describe((path, line)), "calls": n, "trainfast": path.startswith(TRAINFAST_DIR)}
                for (op, path, line), n in self.syncs.items()]
        return sorted(rows, key=lambda r: -r["calls"])
