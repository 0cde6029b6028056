"""What `trainfast doctor` watches while a training loop runs: any loop, trainfast's built-in one or a user's
own (in this process, or in a script started by `trainfast doctor -- python script.py`). `Watch` puts the
instruments around the loop, drives them by its steps and keeps what they find.

Four instruments, all off the hot path except where said:
  - `SyncCounter` (syncs.py), a TorchFunctionMode: every call that reads a tensor's value on the host is
    counted with the source line that made it. A mode costs a Python call per torch call, so it is switched
    on for a window of steps that is never timed.
  - Forward hooks on the model (or, for a script whose model is unknown, global module hooks that keep only
    the outermost module of each call): the input shape of every training forward, nn.DataParallel, and the
    evaluation forwards: those in eval mode that still build an autograd graph (no torch.no_grad()), and the
    grad-free ones of the trained model left in training mode (no model.eval(): dropout drops, batch norm
    uses and updates batch statistics). At the end the model is tested on an input it trained and one it
    evaluated on (evalcheck.py).
  - The gradients between two steps (gradwatch.py): a hook on one parameter of each stepped optimizer sees
    what zero_grad left in .grad each time a gradient arrives; `Optimizer.zero_grad` and
    `nn.Module.zero_grad` are wrapped while the watch is on, so a finding can name the call, its
    set_to_none and its line.
  - torch's global optimizer-step hook: counts and times the steps and drives the windows above; and, for a
    loop that iterates a torch DataLoader, the time each `next(batch)` took and the samples it brought (its
    iterator's __next__ is wrapped while the watch is on), summed per step. After the watched steps, a loop
    that has not evaluated yet may be kept running, untimed, until its first evaluation forwards or a time
    limit (`eval_within`): most loops evaluate at the end of an epoch, after the watched steps.
"""
from __future__ import annotations

import sys
import time
import weakref
from collections import Counter
from typing import Any, Callable

import torch
from torch import nn

# Names other code imports from here are re-exported: SyncCounter, check_eval_dropout, grads_state, _tensors.
from .envcheck import cpu_seconds
from .measure import InputSpan, read_spans
from .evalcheck import _tensors, check_eval_dropout, mode_dependent
from .gradwatch import (call_site, graded_param, grads_state, interval_state, time_memset, wrap_zero_grad,
                        zero_grad_rows)
from .syncs import SyncCounter
from .techniques.memory_reuse import kernel_counters

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
        self.model, self.device_type = model, device_type
        self.counter = SyncCounter(device_type)
        self.sync_window, self.stop_after, self.on_stop, self.stop_with = sync_window, stop_after, on_stop, stop_with
        self.eval_within, self.on_finish = eval_within, on_finish
        self.counting = False
        self.steps = 0
        self.step_ends: list[float] = []
        self.step_waits: list[list] = []            # per step: its batches' InputSpans (waits())
        self.step_samples: list[int] = []
        self.step_kernel: list = []                 # per step end: memory_reuse.kernel_counters()
        self.load_start: tuple | None = None        # envcheck.cpu_seconds() where the timed steps begin
        self.num_workers: int | None = None         # of the last DataLoader iterated
        self._spans, self._samples = [], 0
        self.shapes: list[list] = []
        self.eval_forwards = 0
        self.eval_graph: Counter = Counter()        # module class -> eval forwards that built a graph
        self.train_mode_evals = 0                   # grad-free forwards of the trained model in training mode
        self.train_mode_modules: dict[str, int] = {}
        self.train_mode_input: Any = None
        # The first grad-free training-mode forward of a run, held back (module, inputs) until the next forward
        # says whether it was an evaluation; False inside a run already counted; None outside one.
        self._grad_free: tuple | bool | None = None
        self.data_parallel = False
        self.grads: list[str] = []
        self.zero_grad_calls: Counter = Counter()   # (call, set_to_none, file, line) -> calls
        self.zero_grad_times: list[float] = []      # seconds of in-place zero_grad's memsets
        self._armed: dict[int, list] = {}           # id(optimizer) -> [hook handle, what its arrivals saw]
        # the trained module (for the eval-dropout check)
        self.root: weakref.ref | None = weakref.ref(model) if model is not None else None
        self._trained: nn.Module | None = None
        self.last_input: Any = None
        self.last_batch: Any = None                 # a loader's batch after the first step, as it left the loader
        self.compute_dtype: torch.dtype | None = None   # of the training forwards: autocast's, or the weights'
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
            span = InputSpan(watch.device_type == "cuda")    # on a GPU: the device's idle time for the batch
            watch.counter.in_loader = True
            try:
                batch = original(iterator)
            finally:
                watch.counter.in_loader = False
            span.end()
            watch._spans.append(span)
            watch._samples += batch_samples(batch)
            watch.num_workers = iterator._num_workers
            if watch.steps >= 1 and watch.last_batch is None:
                watch._safe(watch._keep_batch)(batch)
            return batch

        _BaseDataLoaderIter.__next__ = timed_next

    def _keep_batch(self, batch) -> None:
        """What a worker would hand over (doctor.worker_handoff_s): the batch's tensors, copied (loaders recycle)."""
        self.last_batch = [t.detach().clone() for t in _tensors(batch)]

    def _wrap_zero_grad(self, owner: type, call: str) -> None:
        """Notes every `zero_grad` call of the watched steps by its set_to_none and the loop's line, and times
        the memset of a few in-place ones (what set_to_none skips), inside the untimed sync window only."""
        def on_call(obj, set_to_none: bool) -> None:
            if self._safe(self._note_zero_grad)(obj, call, set_to_none):
                self._safe(self._time_memset)(obj)

        self._restore.append((owner, "zero_grad", wrap_zero_grad(owner, on_call)))

    def _note_zero_grad(self, obj, call: str, set_to_none: bool) -> bool:
        """Counts the call by its line; True when it is to be timed."""
        if self.stopped or not self.steps:      # set-up's calls, before the first step, are not the loop's
            return False
        where = call_site()
        if where is not None:
            self.zero_grad_calls[(call, set_to_none, *where)] += 1
        return not set_to_none and self.counting and len(self.zero_grad_times) < self.ZERO_GRAD_TIMINGS

    def _time_memset(self, obj) -> None:
        """Times the memset an in-place zero_grad is about to make (gradwatch.time_memset)."""
        seconds = time_memset(obj)
        if seconds is not None:
            self.zero_grad_times.append(seconds)

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
        self._grad_free = None      # a lone grad-free forward before this one was part of the step, not evaluation
        if self.stopped:
            return
        self.shapes.append(shape_of(args))
        self.compute_dtype = compute_dtype(module, self.device_type)
        if self.root is None or self.root() is not module:
            self.root = weakref.ref(module)
            # held too: a loop that ends before its watched steps are over is checked after it returned, when
            # nothing else may hold its model (one model at most: the latest trained)
            self._trained = module
        if args and self.steps >= 1 and self.last_input is None:
            self.last_input = _detached(tuple(args))  # a copy: loaders recycle their buffers

    def _post_root(self, module: nn.Module, args, output) -> None:
        """Evaluation forwards: in eval mode (with or without autograd), or grad-free in training mode."""
        if self.paused or not self.is_model(module) or (module.training and torch.is_grad_enabled()):
            return
        if module.training:
            if self.root is None or self.root() is not module:
                return                 # a grad-free forward of another model (a frozen teacher's, say)
            # One grad-free forward followed by a training forward is part of the step (pseudo-labels, a target
            # computed by the model itself); two in a row, or one the loop ends on, are an evaluation.
            if self._grad_free is None:
                self._grad_free = (module, _detached(tuple(args)) if args else None)
                return
            if self._grad_free:                # the first of this run, held back until now
                self._note_train_mode_eval(*self._grad_free)
            self._note_train_mode_eval(module, args)
            self._grad_free = False
        else:
            self.eval_forwards += 1
            self.counter.in_eval = True
            if torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(output)):
                self.eval_graph[type(module).__name__] += 1
        if self.wait_started is not None and self.eval_seen >= self.EVAL_FORWARDS:
            self._finish("reached")

    def _note_train_mode_eval(self, module: nn.Module, inputs: tuple | None) -> None:
        self.train_mode_evals += 1
        if self.train_mode_input is None and inputs:
            self.train_mode_input, self.train_mode_modules = _detached(tuple(inputs)), mode_dependent(module)

    def waits(self) -> list[float]:
        """Each step's wait for its batches, as the ablation's step clock reads it (measure.InputSpan): the host's
        seconds in DataLoader.__next__ on the CPU; on CUDA the device's idle time while the host fetched them (a
        host waiting in next() while the device still computes queued kernels is not the device waiting)."""
        if self.device_type == "cuda":
            torch.cuda.synchronize()
        return [read_spans(spans)[0] for spans in self.step_waits]

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
        self.step_kernel.append(kernel_counters())
        if self.steps == self.sync_window[1]:          # the timed steps begin: the machine's load from here
            self.load_start = cpu_seconds()
        self.step_waits.append(self._spans)
        self.step_samples.append(self._samples)
        self._spans, self._samples = [], 0
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
        if self._grad_free:                    # the loop ended on a lone grad-free forward: its evaluation
            self._note_train_mode_eval(*self._grad_free)
            self._grad_free = False
        if not self.train_mode_evals:
            return None
        repeat = None if self.train_mode_modules else self._test_model(self.train_mode_input, training=True)
        return {"forwards": self.train_mode_evals, "modules": self.train_mode_modules, "repeat": repeat}

    def zero_grad_lines(self) -> list[dict[str, Any]]:
        return zero_grad_rows(self.zero_grad_calls)


def shape_of(args: tuple) -> list:
    return [list(t.shape) for t in _tensors(args[:1])]


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple) and hasattr(value, "_fields"):          # a namedtuple
        return type(value)(*(_detached(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def compute_dtype(model: nn.Module, device_type: str) -> torch.dtype:
    """The dtype a training forward computes its matmuls in: autocast's where the loop runs the model under it
    (the hook runs inside the loop's `with autocast`), else the weights' own (a model cast to bf16), else fp32."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    return weight.dtype if weight is not None and weight.dtype in (torch.bfloat16, torch.float16) else torch.float32
