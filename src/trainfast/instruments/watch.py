"""What `trainfast doctor` watches while a training loop runs: any loop, trainfast's built-in one or a user's
own (in this process, or in a script started by `trainfast doctor -- python script.py`). `Watch` puts the
instruments around the loop, drives them by its steps and keeps what they find; each instrument is an object
of its own, which the Watch holds.

Five instruments, all off the hot path except where said:
  - `SyncCounter` (syncs.py; `Watch.counter`), a TorchFunctionMode: every call that reads a tensor's value on
    the host is counted with the source line that made it. A mode costs a Python call per torch call, so it
    is switched on for a window of steps that is never timed.
  - Forward hooks on the model (or, for a script whose model is unknown, global module hooks that keep only
    the outermost module of each call; forwards.py, `Watch.forwards`): the input shape of every training
    forward, nn.DataParallel, and the evaluation forwards: those in eval mode that still build an autograd
    graph (no torch.no_grad()), and the grad-free ones of the trained model left in training mode (no
    model.eval(): dropout drops, batch norm uses and updates batch statistics). At the end the model is tested
    on an input it trained and one it evaluated on (evalcheck.py).
  - The gradients between two steps (gradients.py; `GradientWatch` below, `Watch.gradients`): a hook on one
    parameter of each stepped optimizer sees what zero_grad left in .grad each time a gradient arrives;
    `Optimizer.zero_grad` and `nn.Module.zero_grad` are wrapped while the watch is on, so a finding can name
    the call, its set_to_none and its line.
  - torch's global optimizer-step hook: counts and times the steps (steps.py, `Watch.clock`) and drives
    the windows above; and, for a loop that iterates a torch DataLoader, the time each `next(batch)` took and
    the samples it brought (its iterator's __next__ is wrapped while the watch is on), summed per step. After
    the watched steps, a loop that has not evaluated yet may be kept running, untimed, until its first
    evaluation forwards or a time limit (`eval_within`): most loops evaluate at the end of an epoch, after the
    watched steps.
  - What the batches are (batches.py's BatchKind; `Watch.batches`), read from the first training forward; for
    token ids, the tokens of each step, the share of the positions that are padding, and one batch kept for the
    doctor to replay padded and packed (a sum on the device a forward, read once at the end).
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any, Callable

import torch
from torch import nn

# SyncCounter and grads_state are re-exported: other code imports them from here.
from .batches import BatchKind
from .forwards import ForwardWatch
from .gradients import call_site, graded_param, grads_state, interval_state, time_memset, wrap_zero_grad, zero_grad_rows
from .steps import StepWatch
from .syncs import SyncCounter


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
    with `stop_with`. `eval_wait` says how it ended (wait_record). What the instruments find is theirs:
    `counter` (syncs by line), `clock` (each step's end, wait and samples), `forwards` (shapes, evaluation
    forwards, the model tests), `gradients` (the gradients' state, zero_grad calls)."""

    EVAL_FORWARDS = 2         # evaluation forwards seen before a loop kept going for them is stopped

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
        self.clock = StepWatch(self)
        self.forwards = ForwardWatch(self)
        self.gradients = GradientWatch(self)
        self.batches: BatchKind | None = None       # what the batches are; a token batch's padding (batches.py)
        self.errors: list[str] = []                 # hooks that failed (and were then skipped)
        self.stopped = False                        # the watched steps are over: nothing more is timed
        self.wait_started: float | None = None
        self.wait_steps = 0
        self.eval_wait: dict[str, Any] | None = None
        self._handles: list = []
        self._restore: list[tuple[Any, str, Any]] = []
        self._unlisten: Callable[[], None] | None = None      # stops the step clock's loader listener

    # --- hooks ---------------------------------------------------------------------------------------

    def __enter__(self) -> "Watch":
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.t0 = time.perf_counter()
        self._handles.append(register_optimizer_step_post_hook(self._on_step))
        self._handles += self.forwards.register()
        self.batches = BatchKind(padding=True)
        self._unlisten = self.clock.wrap_loader()
        self._restore.append(self.gradients.wrap(torch.optim.Optimizer, "optimizer.zero_grad"))
        self._restore.append(self.gradients.wrap(nn.Module, "model.zero_grad"))
        self._update_window()
        return self

    def __exit__(self, *exc) -> None:
        self._set_counting(False)
        for handle in self._handles + [armed[0] for armed in self.gradients._armed.values()]:
            handle.remove()
        self._handles, self.gradients._armed = [], {}
        if self.batches is not None:
            self.batches.remove()
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore = []
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None

    def safe(self, hook: Callable) -> Callable:
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

    def _on_step(self, optimizer, args, kwargs) -> None:
        if self.stopped:                       # waiting for the evaluation: untimed
            self.wait_steps += 1
            if self.forwards.eval_seen:        # its evaluation is over and training goes on
                self.finish("reached")
            if self.wait_started is not None and time.perf_counter() - self.wait_started >= self.eval_within:
                self.finish("limit")
            return
        self.safe(self._count_step)(optimizer)
        if self.stop_after is not None and self.steps >= self.stop_after:
            self._stop()

    def _count_step(self, optimizer) -> None:
        self.steps += 1
        self.clock.step()
        if self.batches is not None:
            self.batches.step()
        self._update_window()
        self.gradients.arm(optimizer)

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

    # --- the end: stop, wait for the evaluation, finish -------------------------------------------------

    def _stop(self) -> None:
        self._set_counting(False)
        self.stopped = True
        self._call(self.on_stop)
        if self.forwards.eval_seen:
            self.finish("watched")
        elif self.eval_within <= 0:
            self.finish("off")
        self.wait_started = time.perf_counter()

    def finish(self, outcome: str) -> None:
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


class GradientWatch:
    """The gradients a step leaves for the next, and the zero_grad calls that clear them, for a Watch (`watch`:
    its steps, whether they are over or counted, its hook guard). In this module on purpose: syncs.py names the
    instruments' files, and the frames of these hooks must be the watch's, never the loop's (the host reads
    they make are not the loop's syncs; the zero_grad call they name is the loop's line)."""

    GRAD_CHECKS = 3           # step intervals whose gradient arrivals are inspected
    ARRIVALS_READ = 8         # arrivals read per interval (one host read each): micro-batches, several losses
    ZERO_GRAD_TIMINGS = 3     # in-place zero_grad calls timed (inside the sync window, never timed steps)

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.grads: list[str] = []
        self.zero_grad_calls: Counter = Counter()   # (call, set_to_none, file, line) -> calls
        self.zero_grad_times: list[float] = []      # seconds of in-place zero_grad's memsets
        self._armed: dict[int, list] = {}           # id(optimizer) -> [hook handle, what its arrivals saw]

    def wrap(self, owner: type, call: str) -> tuple[Any, str, Any]:
        """Notes every `zero_grad` call of the watched steps by its set_to_none and the loop's line, and times
        the memset of a few in-place ones (what set_to_none skips), inside the untimed sync window only.
        Returns what restores it: (owner, name, original)."""
        def on_call(obj, set_to_none: bool) -> None:
            if self.watch.safe(self._note_zero_grad)(obj, call, set_to_none):
                self.watch.safe(self._time_memset)(obj)

        return (owner, "zero_grad", wrap_zero_grad(owner, on_call))

    def _note_zero_grad(self, obj, call: str, set_to_none: bool) -> bool:
        """Counts the call by its line; True when it is to be timed."""
        if self.watch.stopped or not self.watch.steps:     # set-up's calls, before the first step, are not the loop's
            return False
        where = call_site()
        if where is not None:
            self.zero_grad_calls[(call, set_to_none, *where)] += 1
        return not set_to_none and self.watch.counting and len(self.zero_grad_times) < self.ZERO_GRAD_TIMINGS

    def _time_memset(self, obj) -> None:
        """Times the memset an in-place zero_grad is about to make (gradients.time_memset)."""
        seconds = time_memset(obj)
        if seconds is not None:
            self.zero_grad_times.append(seconds)

    def arm(self, optimizer) -> None:
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
            if not self.watch.stopped and len(seen) < self.ARRIVALS_READ:
                self.watch.safe(self._note_grads)(param, seen)
            return None

        self._armed[id(optimizer)] = [param.register_hook(arrives), seen]

    def _note_grads(self, param, seen: list[str]) -> None:
        seen.append(grads_state([param]))

    @property
    def zero_grad_s(self) -> float | None:
        """The fastest timed memset of an in-place zero_grad (a cost floor: slower ones met other processes'
        work)."""
        return min(self.zero_grad_times) if self.zero_grad_times else None

    def zero_grad_lines(self) -> list[dict[str, Any]]:
        return zero_grad_rows(self.zero_grad_calls)
