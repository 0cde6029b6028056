"""What `trainfast doctor` watches while a training loop runs: any loop, trainfast's built-in one or a user's
own (in this process, or in a script started by `trainfast doctor -- python script.py`).

Four instruments, all off the hot path except where said:
  - `SyncCounter`, a TorchFunctionMode: every call that reads a tensor's value on the host (`.item()`,
    `.tolist()`, `.numpy()`, `.cpu()`, `.to("cpu")` from a GPU, `bool(t)`, `float(t)`, `int(t)`, printing or
    formatting a tensor, `.nonzero()`) is counted with the source line that made it. On a GPU each one stalls
    the host until the device has finished everything queued before it. On the CPU nothing is asynchronous,
    so the same reads are counted because they *would* sync on a GPU (there `.to(...)` is left out: on the
    CPU `x.to(device)` cannot be told from `x.to("cpu")`). Reads made by torch's own code (an optimizer's
    step counters, which live on the host) are not the loop's and are not counted. A mode costs a Python call
    per torch call, so it is switched on for a window of steps that is never timed.
  - Forward hooks on the model (or, for a script whose model is unknown, global module hooks that keep only
    the outermost module of each call): the input shape of every training forward, nn.DataParallel, and the
    evaluation forwards: those in eval mode that still build an autograd graph (no torch.no_grad()), and the
    grad-free ones of the trained model left in training mode (no model.eval(): dropout drops, batch norm
    uses and updates batch statistics).
  - The gradients between two steps: a hook on one parameter of each stepped optimizer runs each time a
    gradient arrives, just before autograd adds it into .grad, so it sees what zero_grad left there (freed:
    set_to_none; zeros: zeroed in place; the last step's values: not cleared), whatever the order of
    zero_grad, forward and backward in the loop (interval_state). Beside it, `Optimizer.zero_grad` and
    `nn.Module.zero_grad` are wrapped while the watch is on, so a finding can name the call, its
    set_to_none and its line.
  - torch's global optimizer-step hook: counts and times the steps and drives the windows above; and, for a
    loop that iterates a torch DataLoader, the time each `next(batch)` took and the samples it brought (its
    iterator's __next__ is wrapped while the watch is on), summed per step. After the watched steps, a loop
    that has not evaluated yet may be kept running, untimed, until its first evaluation forwards or a time
    limit (`eval_within`): most loops evaluate at the end of an epoch, after the watched steps.
"""
from __future__ import annotations

import functools
import inspect
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
# trainfast's Session forwards a loop's zero_grad to the real optimizer: the loop's line is the one to name.
FORWARDING = tuple(os.path.join(TRAINFAST_DIR, d) + os.sep for d in ("session", "techniques"))

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
        # From an eval-mode forward to the next training forward: an evaluation's reads (a metric's .item()
        # per batch) are once per evaluation pass, not per training step.
        self.in_eval = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
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


def grads_state(params) -> str:
    """What these parameters' gradients hold just before a new step's gradient is added into them: "none"
    (freed: set_to_none), "zeroed" (kept and zeroed in place: one memset per step), "carried" (kept with values:
    no zero_grad since the last step, so this step's gradients add to the last one's). One host read."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return "none"
    nonzero = torch.stack([g.detach().abs().amax().float() for g in grads]).amax()
    return "carried" if bool(nonzero > 0) else "zeroed"


def interval_state(seen: list[str]) -> str:
    """What zero_grad did between two steps of an optimizer, from what each gradient arrival on one of its
    parameters found in .grad: "none" or "zeroed" anywhere means the last step's values were cleared before
    the next step (a GAN's generator backward may reach the discriminator's gradients before the
    discriminator's own zero_grad; a later micro-batch finds the earlier ones'); "carried" only when every
    arrival found values, the first of them the last step's."""
    for state in ("none", "zeroed"):
        if state in seen:
            return state
    return seen[0]


def graded_param(optimizer, tries: int = 8) -> nn.Parameter | None:
    """A parameter of this optimizer whose gradient is not all zero right after its step (so a zero there at
    the next step was put there by a zero_grad, not by the data); None when the first `tries` with a gradient
    are all zero. One host read each."""
    seen = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None or not p.requires_grad:
                continue
            if bool(p.grad.detach().abs().amax() > 0):
                return p
            seen += 1
            if seen >= tries:
                return None
    return None


def mode_dependent(model: nn.Module) -> dict[str, int]:
    """Modules (by class) that compute differently in train() and eval(): dropout that drops; batch norm
    (batch statistics, and its running ones updated); instance norm and attention/RNN dropout likewise."""
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd
    from torch.nn.modules.instancenorm import _InstanceNorm

    found: Counter = Counter()
    for m in model.modules():
        if ((isinstance(m, _DropoutNd) and m.p > 0) or isinstance(m, _BatchNorm)
                or (isinstance(m, _InstanceNorm) and m.track_running_stats)
                or (isinstance(m, (nn.MultiheadAttention, nn.RNNBase)) and getattr(m, "dropout", 0) > 0)):
            found[type(m).__name__] += 1
    return dict(found)


def time_call(fn: Callable, device: torch.device) -> float:
    """Seconds fn() took, the device synchronized on both sides (never inside a timed step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def check_eval_dropout(model: nn.Module, *inputs: Any, training: bool = False) -> dict[str, Any]:
    """In eval() and inference_mode, two forwards of the same input must agree: a difference is dropout that
    does not follow eval() (F.dropout with training=True, or its default). Returns the largest difference and
    the lines of the functional dropouts that still dropped. The RNG is forked, and the model's mode restored.
    training=True: the same test in the mode a loop evaluated in without model.eval() (its buffers, batch
    norm's running statistics, are put back afterwards)."""
    was_training = model.training
    device = next((t.device for t in _tensors(inputs)), torch.device("cpu"))
    counter = SyncCounter(device.type)
    buffers = [(b, b.detach().clone()) for b in model.buffers()] if training else []
    model.train(training)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
            with counter:
                first = model(*inputs)
            second = model(*inputs)
    finally:
        model.train(was_training)
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
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
    count optimizer updates: syncs are counted while `sync_window[0] <= steps < sync_window[1]`. After
    `stop_after` steps (if given) `on_stop` runs and nothing more is timed; then, if no evaluation forward
    was seen yet and `eval_within` > 0, the loop goes on until its first evaluation forwards or until
    `eval_within` seconds have passed, whichever comes first; then `on_finish` runs and the loop is stopped
    with `stop_with`. `eval_wait` says how it ended (wait_record)."""

    GRAD_CHECKS = 3           # step intervals whose gradient arrivals are inspected
    ARRIVALS_READ = 8         # arrivals read per interval (one host read each): micro-batches, several losses
    EVAL_FORWARDS = 2         # evaluation forwards seen before a loop kept going for them is stopped
    ZERO_GRAD_TIMINGS = 3     # in-place zero_grad calls timed (inside the sync window, never timed steps)

    def __init__(self, model: nn.Module | None = None, *, device_type: str = "cpu",
                 sync_window: tuple[int, int] = (1, 11), stop_after: int | None = None,
                 on_stop: Callable[["Watch"], None] | None = None,
                 stop_with: type[BaseException] = EnoughSteps, eval_within: float = 0.0,
                 on_finish: Callable[["Watch"], None] | None = None) -> None:
        self.model = model
        self.counter = SyncCounter(device_type)
        self.sync_window, self.stop_after, self.on_stop, self.stop_with = sync_window, stop_after, on_stop, stop_with
        self.eval_within, self.on_finish = eval_within, on_finish
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
        self.train_mode_evals = 0                   # grad-free forwards of the trained model in training mode
        self.train_mode_modules: dict[str, int] = {}
        self.train_mode_input: Any = None
        self.data_parallel = False
        self.grads: list[str] = []
        self.zero_grad_calls: Counter = Counter()   # (call, set_to_none, file, line) -> calls
        self.zero_grad_times: list[float] = []      # seconds of in-place zero_grad's memsets
        self._armed: dict[int, list] = {}           # id(optimizer) -> [hook handle, what its arrivals saw]
        # the trained module (for the eval-dropout check)
        self.root: weakref.ref | None = weakref.ref(model) if model is not None else None
        self.last_input: Any = None
        self.errors: list[str] = []                 # hooks that failed (and were then skipped)
        self.stopped = False                        # the watched steps are over: nothing more is timed
        self.wait_started: float | None = None
        self.wait_steps = 0
        self.eval_wait: dict[str, Any] | None = None
        self._depth = 0
        self._handles: list = []
        self._restore: list[tuple[Any, str, Any]] = []

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
        self._wrap_zero_grad(torch.optim.Optimizer, "optimizer.zero_grad")
        self._wrap_zero_grad(nn.Module, "model.zero_grad")
        self._update_window()
        return self

    def __exit__(self, *exc) -> None:
        self._set_counting(False)
        for handle in self._handles + [armed[0] for armed in self._armed.values()]:
            handle.remove()
        self._handles, self._armed = [], {}
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore = []

    def _wrap_loader(self) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        from .measure import batch_samples

        original, watch = _BaseDataLoaderIter.__next__, self
        self._restore.append((_BaseDataLoaderIter, "__next__", original))

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

    def _wrap_zero_grad(self, owner: type, call: str) -> None:
        """Notes every `zero_grad` call of the watched steps by its set_to_none and the loop's line, and times
        the memset of a few in-place ones (what set_to_none skips), inside the untimed sync window only."""
        original, watch = owner.zero_grad, self
        parameters = inspect.signature(original).parameters
        default = parameters["set_to_none"].default if "set_to_none" in parameters else True
        self._restore.append((owner, "zero_grad", original))

        @functools.wraps(original)
        def counted(obj, *args, **kwargs):
            set_to_none = kwargs.get("set_to_none", args[0] if args else default)
            if watch._safe(watch._note_zero_grad)(obj, call, bool(set_to_none)):
                watch._safe(watch._time_memset)(obj)
            return original(obj, *args, **kwargs)

        disable = getattr(torch, "_disable_dynamo", None)      # as torch's own zero_grad: never traced
        owner.zero_grad = disable(counted) if disable is not None else counted

    def _note_zero_grad(self, obj, call: str, set_to_none: bool) -> bool:
        """Counts the call by its line; True when it is to be timed."""
        if self.stopped or not self.steps:      # set-up's calls, before the first step, are not the loop's
            return False
        where = call_site()
        if where is not None:
            self.zero_grad_calls[(call, set_to_none, *where)] += 1
        return not set_to_none and self.counting and len(self.zero_grad_times) < self.ZERO_GRAD_TIMINGS

    def _time_memset(self, obj) -> None:
        """Times the memset an in-place zero_grad is about to make (the one set_to_none skips), by making it:
        zeroing what is zeroed next is harmless."""
        grads = [p.grad for p in _params(obj) if p.grad is not None and not p.grad.is_sparse]
        if grads:
            with torch.no_grad():
                self.zero_grad_times.append(time_call(lambda: torch._foreach_zero_(grads), grads[0].device))

    paused = False            # the doctor's own forwards (the eval-dropout test) are not the loop's

    def _safe(self, hook: Callable) -> Callable:
        """A hook that can fail (a model split over devices, an odd forward) notes why in `errors` and lets
        the loop go on: the doctor never breaks the run it watches."""
        def guarded(*args):
            try:
                return hook(*args)
            except Exception as exc:
                if len(self.errors) < 10:
                    self.errors.append(f"{getattr(hook, '__name__', 'hook')}: {type(exc).__name__}: {exc}")
                return None
        return guarded

    def _pre_any(self, module, args):
        self._depth += 1
        if self._depth == 1:
            self._pre_root(module, args)

    def _post_any(self, module, args, output):
        depth, self._depth = self._depth, max(0, self._depth - 1)
        if depth == 1:
            self._post_root(module, args, output)

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
        self.counter.in_eval = False
        if self.stopped:
            return
        self.shapes.append(shape_of(args))
        if self.root is None or self.root() is not module:
            self.root = weakref.ref(module)
        if args and self.steps >= 1 and self.last_input is None:
            self.last_input = _detached(tuple(args))  # a copy: loaders recycle their buffers

    def _post_root(self, module: nn.Module, args, output) -> None:
        """Evaluation forwards: in eval mode (with or without autograd), or grad-free in training mode."""
        if self.paused or not self.is_model(module) or (module.training and torch.is_grad_enabled()):
            return
        if module.training:
            if self.root is None or self.root() is not module:
                return                 # a grad-free forward of another model (a frozen teacher's, say)
            self.train_mode_evals += 1
            if self.train_mode_input is None and args:
                self.train_mode_input = _detached(tuple(args))
                self.train_mode_modules = mode_dependent(module)
        else:
            self.eval_forwards += 1
            self.counter.in_eval = True
            if torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(output)):
                self.eval_graph[type(module).__name__] += 1
        if self.wait_started is not None and self.eval_seen >= self.EVAL_FORWARDS:
            self._finish("reached")

    @property
    def eval_seen(self) -> int:
        """Evaluation forwards seen so far, whatever their mode."""
        return self.eval_forwards + self.train_mode_evals

    def _on_step(self, optimizer, args, kwargs) -> None:
        if self.stopped:                       # waiting for the evaluation: untimed
            self.wait_steps += 1
            if self.eval_seen:                 # its evaluation is over and training goes on
                self._finish("reached")
            if self.wait_started is not None and time.perf_counter() - self.wait_started >= self.eval_within:
                self._finish("limit")
            return
        self._safe(self._count_step)(optimizer)
        if self.stop_after is not None and self.steps >= self.stop_after:
            self._stop()

    def _count_step(self, optimizer) -> None:
        self.steps += 1
        self.step_ends.append(time.perf_counter())
        self.step_waits.append(self._wait)
        self.step_samples.append(self._samples)
        self._wait, self._samples = 0.0, 0
        self._update_window()
        self._arm_grad_check(optimizer)

    # --- the gradients a step leaves for the next -------------------------------------------------------

    def _arm_grad_check(self, optimizer) -> None:
        """At this optimizer's step: close the interval since its last step (what its gradient arrivals saw,
        interval_state) and open the next one, with a hook on one of its parameters that sees what is in its
        .grad each time a gradient arrives, just before autograd adds it in (a leaf's hooks run first)."""
        armed = self._armed.pop(id(optimizer), None)
        if armed is not None:
            armed[0].remove()                   # here, at a step: never from inside autograd's call of it
            if armed[1]:
                self.grads.append(interval_state(armed[1]))
        if len(self.grads) + len(self._armed) >= self.GRAD_CHECKS:
            return
        param = graded_param(optimizer)
        if param is None:
            return
        seen: list[str] = []

        def arrives(grad):
            if not self.stopped and len(seen) < self.ARRIVALS_READ:
                self._safe(self._note_grads)(param, seen)
            return None

        self._armed[id(optimizer)] = [param.register_hook(arrives), seen]

    def _note_grads(self, param, seen: list[str]) -> None:
        seen.append(grads_state([param]))

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

    @property
    def zero_grad_s(self) -> float | None:
        """The fastest timed memset of an in-place zero_grad (a cost floor: slower ones met other processes'
        work)."""
        return min(self.zero_grad_times) if self.zero_grad_times else None

    # --- the end: stop, wait for the evaluation, finish -------------------------------------------------

    def _stop(self) -> None:
        self._set_counting(False)
        self.stopped = True
        self._call(self.on_stop)
        if self.eval_seen:
            self._finish("watched")
        elif self.eval_within <= 0:
            self._finish("off")
        self.wait_started = time.perf_counter()

    def _finish(self, outcome: str) -> None:
        self.eval_wait = self.wait_record(outcome)
        self.wait_started = None
        self._call(self.on_finish)
        raise self.stop_with()

    def wait_record(self, outcome: str) -> dict[str, Any]:
        """How the watch ended. outcome: "watched" (an evaluation came inside the watched steps), "reached"
        (it came while the loop was kept going), "limit" (none came within eval_within), "off" (none came, and
        waiting was off), "ended" (the loop ended first)."""
        waited = time.perf_counter() - self.wait_started if self.wait_started is not None else 0.0
        return {"outcome": outcome, "waited_s": round(waited, 2), "steps": self.wait_steps,
                "limit_s": self.eval_within}

    def _call(self, callback: Callable[["Watch"], None] | None) -> None:
        if callback is None:
            return
        try:
            callback(self)
        except Exception as exc:            # said where the run's output goes; the loop still stops
            print(f"trainfast doctor: could not finish the observation: {type(exc).__name__}: {exc}",
                  file=sys.stderr)

    # --- tests run on the model, at the end ---------------------------------------------------------------

    def _test_model(self, inputs: Any, training: bool) -> dict[str, Any] | None:
        model = self.root() if self.root is not None else None
        if model is None or inputs is None:
            return None
        self.paused = True
        try:
            return check_eval_dropout(model, *inputs, training=training)
        except Exception as exc:      # a model that will not take its input again: say so, never crash the loop
            return {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            self.paused = False

    def dropout_check(self) -> dict[str, Any] | None:
        """check_eval_dropout on the last training input."""
        return self._test_model(self.last_input, training=False)

    def train_mode_check(self) -> dict[str, Any] | None:
        """The evaluation forwards left in training mode: how many, the modules that act differently there
        and, when there are none, two forwards of the first such input compared (F.dropout following
        self.training). None when there were none."""
        if not self.train_mode_evals:
            return None
        repeat = None if self.train_mode_modules else self._test_model(self.train_mode_input, training=True)
        return {"forwards": self.train_mode_evals, "modules": self.train_mode_modules, "repeat": repeat}

    def zero_grad_lines(self) -> list[dict[str, Any]]:
        rows = [{"call": call, "set_to_none": stn, "where": describe((path, line)), "calls": n}
                for (call, stn, path, line), n in self.zero_grad_calls.items()]
        return sorted(rows, key=lambda r: -r["calls"])


def call_site() -> tuple[str, int] | None:
    """(file, line) of the loop's code that made the current call: past torch, this module and the Session
    layers that forward it."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path in PASS_THROUGH or path.startswith(TORCH_DIR) or path.startswith(FORWARDING)):
            return path, frame.f_lineno
        frame = frame.f_back
    return None


def _params(obj: Any) -> list:
    if isinstance(obj, nn.Module):
        return list(obj.parameters())
    return [p for group in getattr(obj, "param_groups", []) for p in group["params"]]


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value
