"""What `trainfast doctor` watches while a training loop runs: any loop, trainfast's built-in one or a user's
own (in this process, or in a script started by `trainfast doctor -- python script.py`).

Three instruments, all off the hot path except where said:
  - `SyncCounter`, a TorchFunctionMode: every call that reads a tensor's value on the host (`.item()`,
    `.tolist()`, `.numpy()`, `.cpu()`, `.to("cpu")` from a GPU, `bool(t)`, `float(t)`, `int(t)`, printing or
    formatting a tensor, `.nonzero()`) is counted with the source line that made it. On a GPU each one stalls
    the host until the device has finished everything queued before it. On the CPU nothing is asynchronous,
    so the same reads are counted because they *would* sync on a GPU (there `.to(...)` is left out: on the
    CPU `x.to(device)` cannot be told from `x.to("cpu")`). Reads made by torch's own code (an optimizer's
    step counters, which live on the host) are not the loop's and are not counted. A mode costs a Python call
    per torch call, so it is switched on for a window of steps that is never timed.
  - Forward hooks on the model (or, for a script whose model is unknown, global module hooks that keep only
    the outermost module of each call): the input shape of every training forward, evaluation forwards that
    build an autograd graph, nn.DataParallel, and, at the first forward after an optimizer step, whether the
    gradients were freed (set_to_none), zeroed in place, or carried over from the previous step.
  - torch's global optimizer-step hook: counts and times the steps and drives the windows above; and, for a
    loop that iterates a torch DataLoader, the time each `next(batch)` took and the samples it brought (its
    iterator's __next__ is wrapped while the watch is on), summed per step.
"""
from __future__ import annotations

import linecache
import os
import sys
import time
import weakref
from collections import Counter
from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
TRAINFAST_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
HERE = os.path.abspath(__file__)
# Frames between a Tensor method written in Python (__format__, __repr__) and its caller: the method itself.
PASS_THROUGH = {HERE, os.path.join(TORCH_DIR, "overrides.py"), os.path.join(TORCH_DIR, "_tensor.py")}

# Tensor methods that hand a tensor's value to the host: each one waits for the device to catch up.
SYNC_METHODS = frozenset({"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__",
                          "__repr__", "__format__", "nonzero"})
DROPOUTS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"})


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


class SyncCounter(TorchFunctionMode):
    """Counts host reads of tensor values by source line (see the module docstring), and functional dropout
    calls that still drop (training=True) by source line."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.on_cpu = device_type == "cpu"
        self.syncs: Counter = Counter()         # (op, file, line) -> calls
        self.dropouts: Counter = Counter()      # (file, line) -> calls with training=True
        # Inside a DataLoader's next(): the loader's reads of host tensors (a label's int()) are not syncs.
        self.in_loader = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.in_loader:
            pass
        elif name in SYNC_METHODS or (name == "to" and _to_host(args, kwargs)):
            tensor = args[0] if args else None
            # On a GPU a read of a host tensor is no sync; on the CPU every read counts (it would be one there).
            if isinstance(tensor, torch.Tensor) and (self.on_cpu or tensor.device.type != "cpu"):
                where = caller(skip_torch=False)
                if where is not None:
                    self.syncs[(name.strip("_"), *where)] += 1
        elif name in DROPOUTS:
            training = kwargs.get("training", args[2] if len(args) > 2 else True)
            if training:
                where = caller(skip_torch=True)
                if where is not None:
                    self.dropouts[where] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.syncs.values())

    def by_line(self) -> list[dict[str, Any]]:
        """Every counting line, most calls first; trainfast's own lines (its Meter's once-a-window read) marked."""
        rows = [{"op": op, "where": describe((path, line)), "calls": n, "trainfast": path.startswith(TRAINFAST_DIR)}
                for (op, path, line), n in self.syncs.items()]
        return sorted(rows, key=lambda r: -r["calls"])


def grads_state(module: nn.Module) -> str:
    """What the gradients look like at the start of a training forward: "none" (freed: set_to_none),
    "zeroed" (kept and zeroed in place: one memset per step), "carried" (kept with values: no zero_grad since
    the last step, so this step's gradients add to the last one's). One host read, done a few times only."""
    grads = [p.grad for p in module.parameters() if p.requires_grad and p.grad is not None]
    if not grads:
        return "none"
    nonzero = torch.stack([g.detach().abs().amax().float() for g in grads]).amax()
    return "carried" if bool(nonzero > 0) else "zeroed"


def time_zero_grad(module: nn.Module, repeats: int = 5) -> float | None:
    """Seconds one in-place zero_grad takes on this module's gradients (the memset set_to_none skips), the
    fastest of `repeats` (a cost floor: slower repeats are other processes' interference); None when there is
    nothing to zero."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return None
    device = grads[0].device
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        torch._foreach_zero_(grads)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def check_eval_dropout(model: nn.Module, *inputs: Any) -> dict[str, Any]:
    """In eval() and inference_mode, two forwards of the same input must agree: a difference is dropout that
    does not follow eval() (F.dropout with training=True, or its default). Returns the largest difference and
    the lines of the functional dropouts that still dropped. The RNG is forked, and the model's mode restored."""
    was_training = model.training
    device = next((t.device for t in _tensors(inputs)), torch.device("cpu"))
    counter = SyncCounter(device.type)
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
            with counter:
                first = model(*inputs)
            second = model(*inputs)
    finally:
        model.train(was_training)
    pairs = list(zip(_tensors(first), _tensors(second)))
    diff = max((float((a.float() - b.float()).abs().max()) for a, b in pairs if a.numel()), default=0.0)
    scale = max((float(a.float().abs().max()) for a, _ in pairs if a.numel()), default=0.0)
    return {"max_diff": diff, "relative_diff": diff / scale if scale else diff,
            "calls": [describe(w) for w in counter.dropouts]}


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def shape_of(args: tuple) -> list:
    return [list(t.shape) for t in _tensors(args[:1])]


class EnoughSteps(BaseException):
    """Raised from the optimizer-step hook once the watch has its steps (a BaseException, so a loop's own
    `except Exception` does not swallow it)."""


class Watch:
    """A context manager around a loop (see the module docstring). `model`: its outermost module, when known
    (hooks on it alone); None: global module hooks, keeping the outermost module of each call. Step numbers
    count optimizer updates: syncs are counted while `sync_window[0] <= steps < sync_window[1]`; after
    `stop_after` steps (if given) the loop is stopped with EnoughSteps, after `on_stop` ran."""

    GRAD_CHECKS = 3           # first forwards after a step whose gradients are inspected (one host read each)

    def __init__(self, model: nn.Module | None = None, *, device_type: str = "cpu",
                 sync_window: tuple[int, int] = (1, 11), stop_after: int | None = None,
                 on_stop: Callable[["Watch"], None] | None = None,
                 stop_with: type[BaseException] = EnoughSteps) -> None:
        self.model = model
        self.counter = SyncCounter(device_type)
        self.sync_window, self.stop_after, self.on_stop, self.stop_with = sync_window, stop_after, on_stop, stop_with
        self.counting = False
        self.steps = 0
        self.step_ends: list[float] = []
        self.step_waits: list[float] = []           # per step: seconds in DataLoader.__next__
        self.step_samples: list[int] = []
        self.num_workers: int | None = None         # of the last DataLoader iterated
        self._wait, self._samples = 0.0, 0
        self.shapes: list[list] = []
        self.eval_forwards = 0
        self.eval_graph: Counter = Counter()        # module class -> eval forwards that built a graph
        self.data_parallel = False
        self.grads: list[str] = []
        self.zero_grad_s: float | None = None
        self.root: weakref.ref | None = None        # the trained module (for the eval-dropout check)
        self.last_input: Any = None
        self._after_step = False
        self.errors: list[str] = []                 # hooks that failed (and were then skipped)
        self._depth = 0
        self._handles: list = []

    # --- hooks ---------------------------------------------------------------------------------------

    def __enter__(self) -> "Watch":
        from torch.nn.modules import module as module_hooks
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.t0 = time.perf_counter()
        self._handles.append(register_optimizer_step_post_hook(self._on_step))
        if self.model is not None:
            self._handles += [self.model.register_forward_pre_hook(self._safe(self._pre_root)),
                              self.model.register_forward_hook(self._safe(self._post_root))]
        else:
            self._handles += [module_hooks.register_module_forward_pre_hook(self._safe(self._pre_any)),
                              module_hooks.register_module_forward_hook(self._safe(self._post_any), always_call=True)]
        self._wrap_loader()
        self._update_window()
        return self

    def __exit__(self, *exc) -> None:
        self._set_counting(False)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._next is not None:
            from torch.utils.data.dataloader import _BaseDataLoaderIter

            _BaseDataLoaderIter.__next__ = self._next
            self._next = None

    _next = None

    def _wrap_loader(self) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        from .measure import batch_samples

        original, watch = _BaseDataLoaderIter.__next__, self
        self._next = original

        def timed_next(iterator):
            t0 = time.perf_counter()
            watch.counter.in_loader = True
            try:
                batch = original(iterator)
            finally:
                watch.counter.in_loader = False
            watch._wait += time.perf_counter() - t0
            watch._samples += batch_samples(batch)
            watch.num_workers = iterator._num_workers
            return batch

        _BaseDataLoaderIter.__next__ = timed_next

    paused = False            # the doctor's own forwards (the eval-dropout test) are not the loop's

    def _safe(self, hook: Callable) -> Callable:
        """A hook that can fail (a model split over devices, an odd forward) notes why in `errors` and lets
        the loop go on: the doctor never breaks the run it watches."""
        def guarded(*args):
            try:
                return hook(*args)
            except Exception as exc:
                if len(self.errors) < 10:
                    self.errors.append(f"{hook.__name__}: {type(exc).__name__}: {exc}")
                return None
        return guarded

    def _pre_any(self, module, args):
        self._depth += 1
        if self._depth == 1:
            self._pre_root(module, args)

    def _post_any(self, module, args, output):
        if self._depth == 1:
            self._post_root(module, args, output)
        self._depth = max(0, self._depth - 1)

    @staticmethod
    def is_model(module: nn.Module) -> bool:
        """A module with trainable parameters: the model, not a loss module called on its own."""
        return any(p.requires_grad for p in module.parameters())

    def _pre_root(self, module: nn.Module, args) -> None:
        if self.paused or not self.is_model(module):
            return
        if len(self.shapes) < 3 and any(isinstance(m, nn.DataParallel) for m in module.modules()):
            self.data_parallel = True          # looked for in the first forwards only: a walk of every module
        if not (module.training and torch.is_grad_enabled()):
            return
        self.shapes.append(shape_of(args))
        if self.root is None or self.root() is not module:
            self.root = weakref.ref(module)
        if args and self.steps >= 1 and self.last_input is None:
            self.last_input = _detached(tuple(args))  # a copy: loaders recycle their buffers
        after_step, self._after_step = self._after_step, False
        if after_step and len(self.grads) < self.GRAD_CHECKS:     # last: the one part that reads the device
            state = grads_state(module)
            self.grads.append(state)
            if state == "zeroed" and self.zero_grad_s is None:
                self.zero_grad_s = time_zero_grad(module)

    def _post_root(self, module: nn.Module, args, output) -> None:
        if self.paused or module.training or not self.is_model(module):
            return
        self.eval_forwards += 1
        if torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(output)):
            self.eval_graph[type(module).__name__] += 1

    def _on_step(self, optimizer, args, kwargs) -> None:
        self._safe(self._count_step)()
        if self.stop_after is not None and self.steps >= self.stop_after:
            self._set_counting(False)
            if self.on_stop is not None:
                try:
                    self.on_stop(self)
                except Exception as exc:        # said where the run's output goes; the loop still stops
                    print(f"trainfast doctor: could not finish the observation: {type(exc).__name__}: {exc}",
                          file=sys.stderr)
            raise self.stop_with()

    def _count_step(self) -> None:
        self.steps += 1
        self.step_ends.append(time.perf_counter())
        self.step_waits.append(self._wait)
        self.step_samples.append(self._samples)
        self._wait, self._samples = 0.0, 0
        self._after_step = True
        self._update_window()

    # --- the sync window -----------------------------------------------------------------------------

    def _update_window(self) -> None:
        start, end = self.sync_window
        self._set_counting(start <= self.steps < end)

    def _set_counting(self, on: bool) -> None:
        if on and not self.counting:
            self.counter.__enter__()
        elif not on and self.counting:
            self.counter.__exit__(None, None, None)
        self.counting = on

    @property
    def sync_steps(self) -> int:
        start, end = self.sync_window
        return max(0, min(self.steps, end) - start)

    def dropout_check(self) -> dict[str, Any] | None:
        model = self.root() if self.root is not None else None
        if model is None or self.last_input is None:
            return None
        self.paused = True
        try:
            return check_eval_dropout(model, *self.last_input)
        except Exception as exc:      # a model that will not take its last input again: say so, never crash the loop
            return {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            self.paused = False


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value
