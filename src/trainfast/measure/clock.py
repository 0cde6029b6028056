"""The step clock: each training step's end and its wait for input, read without a per-step sync (StepTimer, one
per run; StepClock, its marks; InputSpan, one batch's way into the loop), and the samples in a batch."""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class StepTime:
    """One step as the clock saw it: seconds from the previous step's end to this one's (so the steps
    of a pass tile its wall time), samples in the step, the part spent waiting for its batch, and on CPU the
    CPU seconds the run's own processes used (JobCPU: this one, its loader workers, the other ranks of its job)
    and the whole machine used meanwhile (busy time of every core, the hypervisor's steal included), from which
    `Timing` tells when other processes were competing.

    On CUDA both the step and its wait are read on the device's timeline (InputSpan): `data_wait_s` is the time
    the device sat idle for lack of a batch, and `copy_s` the time it spent on the batch's own copy and
    preparation on the compute stream (None on the CPU, where the wait is the host's time in next())."""
    seconds: float
    samples: int
    data_wait_s: float
    own_cpu_s: float | None = None
    machine_cpu_s: float | None = None
    copy_s: float | None = None


def machine_busy_seconds() -> float:
    """CPU seconds the machine's cores have been busy since boot (all processes, steal included). /proc/stat
    counts in 10 ms ticks, so it is read per step but judged over blocks of steps (`Timing`)."""
    import psutil

    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)


class JobCPU:
    """CPU seconds used so far by the run's own processes: this one, its descendants (DataLoader workers, live or
    finished), and under torchrun every process the launcher started (the other ranks and their workers). What
    the machine's cores spent beyond them was other work: the share that marks a block of steps as disturbed
    (timing.step_block), whether the run has loader workers or ranks or neither.

    The process list is refreshed every REFRESH_S (a scan of /proc, ~1-2 ms), the CPU of each read at every mark
    (~20 us a process); a worker that ends moves from its own count into its parent's reaped children, so the
    total runs on without a jump. A worker started since the last refresh is counted from the next one."""

    REFRESH_S = 0.25

    def __init__(self) -> None:
        import psutil

        self.error = psutil.Error          # read at every mark: kept here, not imported there
        self.me = psutil.Process()
        launcher = self.me.parent() if os.environ.get("TORCHELASTIC_RUN_ID") else None
        self.root = launcher or self.me
        self.others: list = []
        self.refreshed = float("-inf")

    def refresh(self) -> None:
        try:
            tree = [self.root, *self.root.children(recursive=True)] if self.root is not self.me \
                else self.me.children(recursive=True)
        except self.error:
            tree = []
        self.others = [p for p in tree if p.pid != self.me.pid]
        self.refreshed = time.perf_counter()

    def __call__(self) -> float:
        if time.perf_counter() - self.refreshed > self.REFRESH_S:
            self.refresh()
        mine = os.times()
        total = time.process_time() + mine.children_user + mine.children_system
        for process in self.others:
            try:
                t = process.cpu_times()
            except self.error:            # ended since the refresh: its CPU is now its parent's reaped children's
                continue
            total += t.user + t.system + t.children_user + t.children_system    # and its ended, reaped children
        return total


class InputSpan:
    """One batch's way into the loop, on the clock the step is timed on.

    CPU: the host's seconds in next() (the CPU computes what it is given at once, so a host wait is the
    compute's wait). CUDA: the host runs ahead of the device, so its time in next() says nothing about the
    device: a blocking copy from pageable memory waits for the step's queued kernels before it starts, and the
    host's clock would count that compute as waiting for data. Instead events are recorded on the compute stream
    when the loop asks for the batch (`asked`: it fires once the previous step's kernels are done), when the host
    loader has handed the batch over (`fetched`, said by the device-batch object, techniques/transfer.py) and
    when the batch is ready on the device (`ready`). Between asked and fetched nothing is queued on the stream:
    the device sat idle for lack of input (the wait). Between fetched and ready the stream holds the batch's copy
    and preparation (normalization, layout): input work the device did, shown apart as the copy."""

    __slots__ = ("cuda", "t0", "host_s", "asked", "fetched", "ready")

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.fetched = self.ready = None
        self.host_s = 0.0
        self.t0 = time.perf_counter()
        self.asked = _event() if cuda else None

    def arrived(self) -> None:
        """The host loader has handed the batch over; the device's work on it starts now (CUDA only)."""
        if self.cuda:
            self.fetched = _event()

    def end(self) -> None:
        self.host_s = time.perf_counter() - self.t0
        if self.cuda:
            self.ready = _event()

    def read(self) -> tuple[float, float | None]:
        """(wait, copy) in seconds; CUDA: once the events have fired (after a synchronize)."""
        if not self.cuda:
            return self.host_s, None
        handed = self.fetched or self.ready
        wait = self.asked.elapsed_time(handed) / 1000
        copy = handed.elapsed_time(self.ready) / 1000 if self.fetched is not None else 0.0
        return max(0.0, wait), max(0.0, copy)


def _event():
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def read_spans(spans: list[InputSpan]) -> tuple[float, float | None]:
    """A step's input: its micro-batches' waits and copies summed (None copy: a host clock)."""
    read = [span.read() for span in spans]
    copies = [c for _, c in read if c is not None]
    return sum(w for w, _ in read), (sum(copies) if copies else None)


class StepClock:
    """End-of-step timestamps without a per-step sync. CPU: the host clock when the step returns (CPU
    kernels are done by then), plus this process's and the machine's CPU time. CUDA: an event recorded on
    the stream at each step's end and converted when the Meter next reads its window (one sync per window,
    as for the loss); the step's input spans (InputSpan) are converted with it. `start` marks the moment the
    loop begins waiting for its first batch, so the first step includes the loader's start-up."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.job_cpu = None if self.cuda else JobCPU()
        self._marks: list = []
        self._pending: list[tuple[int, list[InputSpan]]] = []
        self.steps: list[StepTime] = []

    def _mark(self):
        if self.cuda:
            return _event()
        return time.perf_counter(), self.job_cpu(), machine_busy_seconds()

    def span(self) -> InputSpan:
        """A batch is asked for now (InputSpan)."""
        return InputSpan(self.cuda)

    def start(self) -> None:
        """A new pass begins: steps already taken are kept (read now), and the next step is timed from here, so
        whatever ran in between (evaluation, a checkpoint) belongs to no step."""
        self.read()
        self._marks, self._pending = [self._mark()], []

    def step(self, samples: int, spans: list[InputSpan]) -> None:
        self._marks.append(self._mark())
        self._pending.append((samples, spans))

    def read(self) -> list[StepTime]:
        """Turns the marks taken since the last read into StepTimes (appended to `steps`)."""
        if not self._pending:
            return []
        pairs = list(zip(self._marks, self._marks[1:]))
        if self.cuda:
            self._marks[-1].synchronize()
        new = []
        for (a, b), (n, spans) in zip(pairs, self._pending):
            wait, copy = read_spans(spans)
            if self.cuda:
                new.append(StepTime(a.elapsed_time(b) / 1000, n, wait, copy_s=copy))
            else:
                new.append(StepTime(b[0] - a[0], n, wait, b[1] - a[1], b[2] - a[2], copy))
        self.steps.extend(new)
        self._marks, self._pending = self._marks[-1:], []
        return new


def batch_samples(batch) -> int:
    """Samples in a batch of any structure: a tensor's first dimension; in a tuple, list or dict, that of its
    first element (`(inputs, targets)`, `{"image": ...}`), where a list of per-sample items (detection's list of
    images of different sizes) counts its items. A batch that says what its rate counts (`rate_count`: a
    language-model batch's real tokens) is counted by it."""
    counted = getattr(batch, "rate_count", None)
    if counted is not None:
        return counted
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        return batch_samples(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, (list, tuple)):
            return len(first)
        return batch_samples(first)
    return 0


class StepTimer:
    """The training step's clock, one per run (the Session's TrainState owns it; the ablation's probe reads it):
    `batches()` wraps the training batches, timing how long the loop waits for each (InputSpan: the host's
    time on the CPU, the device's idle time on CUDA) and counting its samples; `step()` is called at each
    optimizer update (the Session's optimizer.step(), or the global optimizer hook for a script without a
    Session) and closes one step: its samples and wait are those of the micro-batches since the previous
    update. Every pass restarts the clock (StepClock.start), so evaluation between epochs belongs to no step."""

    def __init__(self, device: torch.device) -> None:
        self.clock = StepClock(device)
        self.clock.start()                    # a loop that never hands its batches to batches(): from here
        self._samples, self._spans = 0, []
        self._current: InputSpan | None = None
        self.updates = 0

    @property
    def steps(self) -> list[StepTime]:
        """Every step read so far (call read() first for the latest: on CUDA that waits for the device)."""
        return self.clock.steps

    def arrived(self) -> None:
        """Said by the device-batch object (techniques/transfer.py) when the host loader hands it a batch: the
        copy to the device starts, and the wait for input ends there (InputSpan)."""
        if self._current is not None:
            self._current.arrived()

    def batches(self, batches: Iterable) -> Iterator:
        self.clock.start()
        self._samples, self._spans = 0, []
        iterator = iter(batches)
        while True:
            span = self._current = self.clock.span()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self._current = None
            span.end()
            self._spans.append(span)
            self._samples += batch_samples(batch)
            yield batch

    def restart(self) -> list[StepTime]:
        """Whatever ran since the last step (an evaluation between two steps) belongs to no step: the clock starts
        again from now, as at a pass's start. Every step so far, read."""
        self.clock.start()
        return self.steps

    def step(self) -> None:
        self.clock.step(self._samples, self._spans)
        self._samples, self._spans = 0, []
        self.updates += 1

    def read(self) -> list[StepTime]:
        return self.clock.read()
