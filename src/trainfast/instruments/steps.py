"""The watched steps' clock, one of the doctor's instruments (watch.py puts them around a loop): at each step
torch's global optimizer-step hook closes (the Watch's), the step's end and the kernel's counters; and, for a
loop that iterates a torch DataLoader, the time each `next(batch)` took and the samples it brought (its
iterator's batches are listened to while the watch is on: loaders.py), summed per step."""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ..envcheck import cpu_seconds
from ..measure import InputSpan, read_spans
from ..techniques.memory_reuse import kernel_counters
from .loaders import LoaderListener, listen
from .tensors import tensors_of


class StepWatch:
    """The steps of a Watch (`watch`: its step count, sync window, sync counter and hook guard), as they end and
    as their batches arrive."""

    def __init__(self, watch) -> None:
        self.watch = watch
        self.step_ends: list[float] = []
        self.step_waits: list[list] = []            # per step: its batches' InputSpans (waits())
        self.step_samples: list[int] = []
        self.step_kernel: list = []                 # per step end: memory_reuse.kernel_counters()
        self.load_start: tuple | None = None        # envcheck.cpu_seconds() where the timed steps begin
        self.num_workers: int | None = None         # of the last DataLoader iterated
        self._spans, self._samples = [], 0
        self.last_batch: Any = None                 # a loader's batch after the first step, as it left the loader

    def wrap_loader(self) -> Callable[[], None]:
        """Listens to DataLoader iterators' batches (loaders.py); returns what stops it."""
        return listen(_BatchClock(self))

    def _keep_batch(self, batch) -> None:
        """What a worker would hand over (doctor.worker_handoff_s): the batch's tensors, copied (loaders recycle)."""
        self.last_batch = [t.detach().clone() for t in tensors_of(batch)]

    def step(self) -> None:
        """A step ended (the watch has counted it): its end, the kernel's counters and its batches."""
        watch = self.watch
        self.step_ends.append(time.perf_counter())
        self.step_kernel.append(kernel_counters())
        if watch.steps == watch.sync_window[1]:          # the timed steps begin: the machine's load from here
            self.load_start = cpu_seconds()
        self.step_waits.append(self._spans)
        self.step_samples.append(self._samples)
        self._spans, self._samples = [], 0

    def waits(self) -> list[float]:
        """Each step's wait for its batches, as the ablation's step clock reads it (measure.InputSpan): the host's
        seconds in DataLoader.__next__ on the CPU; on CUDA the device's idle time while the host fetched them (a
        host waiting in next() while the device still computes queued kernels is not the device waiting)."""
        if self.watch.device_type == "cuda":
            torch.cuda.synchronize()
        return [read_spans(spans)[0] for spans in self.step_waits]


class _BatchClock(LoaderListener):
    """Each next(batch) of a watched loop: its wait (with the sync counter told the host is in the loader, where
    a read of a tensor's value is the loader's, not the loop's), its samples, the loader's workers, and the first
    batch after the first step kept."""

    def __init__(self, clock: StepWatch) -> None:
        self.clock = clock

    def around_next(self, iterator, fetch):
        from ..measure import batch_samples

        clock, watch = self.clock, self.clock.watch
        span = InputSpan(watch.device_type == "cuda")    # on a GPU: the device's idle time for the batch
        watch.counter.in_loader = True
        try:
            batch = fetch()
        finally:
            watch.counter.in_loader = False
        span.end()
        clock._spans.append(span)
        clock._samples += batch_samples(batch)
        clock.num_workers = iterator._num_workers
        if watch.steps >= 1 and clock.last_batch is None:
            watch.safe(clock._keep_batch)(batch)
        return batch
