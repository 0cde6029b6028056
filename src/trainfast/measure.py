"""The measuring instrument: step windows timed after a device sync, metrics accumulated on the device
and read once per window, peak memory, model FLOPs and the device's matmul ceiling."""
from __future__ import annotations

import copy
import math
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
from torch import nn


class NonFiniteLossError(RuntimeError):
    """Raised by the 'stop' policy; names the first step whose loss was NaN or inf."""


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Window:
    steps: int
    samples: int
    seconds: float
    data_wait_s: float


@dataclass
class EpochStats:
    losses: list[float] = field(default_factory=list)   # every step's loss, in order
    correct: int = 0
    samples: int = 0
    windows: list[Window] = field(default_factory=list)
    seconds: float = 0.0
    data_wait_s: float = 0.0

    @property
    def loss(self) -> float:
        return sum(self.losses) / max(1, len(self.losses))

    @property
    def accuracy(self) -> float:
        return self.correct / max(1, self.samples)


class Meter:
    """Accumulates loss and accuracy on the device (no per-step `.item()`, which would stall the host
    until the device caught up) and reads them every `log_every` steps. Each read is one sync, after
    which the wall clock is read: a window's time covers exactly the work of its steps."""

    def __init__(self, device: torch.device, log_every: int,
                 on_window: Callable[[int, "EpochStats"], None] | None = None, first_step: int = 0,
                 stop_on_nonfinite: bool = True,
                 agree: Callable[[int | None], list[tuple[int, int]]] | None = None) -> None:
        self.device = device
        self.stop_on_nonfinite = stop_on_nonfinite   # False under nonfinite=skip (faults.py decides per step)
        # agree(first bad step or None) -> [(rank, first bad step)] over all ranks: under torchrun every
        # rank calls it at the same read, so every rank stops at the same step (distributed.Dist).
        self.agree = agree or (lambda first: [] if first is None else [(0, first)])
        self.name_ranks = agree is not None
        self.log_every = log_every
        self.on_window = on_window
        self.step = first_step
        self.stats = EpochStats()
        self._losses = torch.zeros(log_every, device=device)
        self._correct = torch.zeros((), dtype=torch.long, device=device)
        self._pending = 0
        self._pending_samples = 0
        self._wait = 0.0
        self._t_epoch = self._t_window = time.perf_counter()

    def iterate(self, batches: Iterable) -> Iterator:
        """Yields batches while timing how long the loop waits for each one (input-bound or not)."""
        iterator = iter(batches)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            self._wait += time.perf_counter() - t0
            yield batch
        self.flush()
        self.stats.seconds = time.perf_counter() - self._t_epoch

    def update(self, loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        self._losses[self._pending].copy_(loss.detach().float())
        self._correct += (outputs.detach().argmax(dim=-1) == targets).sum()
        self._pending += 1
        self._pending_samples += targets.shape[0]
        self.step += 1
        if self._pending == self.log_every:
            self.flush()

    def flush(self) -> None:
        if self._pending == 0:
            return
        losses = self._losses[: self._pending].tolist()       # the one sync of this window
        correct = int(self._correct.item())
        now = time.perf_counter()
        first = self.step - self._pending
        self.stats.windows.append(Window(self._pending, self._pending_samples, now - self._t_window, self._wait))
        self.stats.data_wait_s += self._wait
        self.stats.losses.extend(losses)
        self.stats.correct += correct
        self.stats.samples += self._pending_samples
        self._correct.zero_()
        self._pending = self._pending_samples = 0
        self._wait = 0.0
        bad = [first + i for i, v in enumerate(losses) if not math.isfinite(v)]
        ranks = self.agree(bad[0] if bad else None) if self.stop_on_nonfinite else []
        if ranks:
            step = min(s for _, s in ranks)
            where = f"loss is {losses[bad[0] - first]}" if bad and bad[0] == step else "loss is not finite"
            policy = "policy nonfinite=stop"
            if self.name_ranks:
                where += f" on rank(s) {', '.join(str(r) for r, s in ranks if s == step)}"
                policy += "; every rank stops at this step"
            raise NonFiniteLossError(
                f"{where} at step {step} ({policy}). Lower the learning "
                f"rate, add --warmup-steps or --grad-clip, or use bf16 instead of fp16.")
        if self.on_window is not None:
            self.on_window(self.step, self.stats)
        self._t_window = time.perf_counter()


def steady_throughput(windows: list[Window], skip_first: int = 1) -> tuple[float, float, int]:
    """Median samples/s over windows after the first `skip_first` (compile, allocator and cache warm-up),
    and the spread as half the interquartile range. Returns (median, spread, windows used)."""
    usable = windows[skip_first:] if len(windows) > skip_first else windows
    rates = [w.samples / w.seconds for w in usable if w.seconds > 0]
    if not rates:
        return 0.0, 0.0, 0
    if len(rates) >= 4:
        q = statistics.quantiles(rates, n=4)
        spread = (q[2] - q[0]) / 2
    else:
        spread = (max(rates) - min(rates)) / 2
    return statistics.median(rates), spread, len(rates)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: the caching allocator's peak. CPU: peak resident set size of this process (Linux reports KiB)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def count_train_flops(model: nn.Module, loss_fn: Callable, inputs: torch.Tensor, targets: torch.Tensor) -> int:
    """FLOPs of one forward + backward on this batch, from torch.utils.flop_counter. Runs on a copy of
    the model with the RNG forked, so the real run's weights, BN statistics and random streams are untouched."""
    from torch.utils.flop_counter import FlopCounterMode

    shadow = copy.deepcopy(model)
    shadow.train()
    devices = [inputs.device] if inputs.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), FlopCounterMode(display=False) as counter:
        loss_fn(shadow(inputs), targets).backward()
    return int(counter.get_total_flops())


def measure_ceiling(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5) -> float:
    """The device's achievable matmul FLOP/s in `dtype`: the best of `repeats` n x n x n products after a
    warm-up (a peak, so the fastest run is the estimate; slower runs are interference). 2048 is large
    enough for the CPU's BLAS to reach its peak; GPUs need 4096. The roof every rung is compared against."""
    n = n or (4096 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    times = []
    for i in range(repeats + 1):
        synchronize(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    return 2 * n**3 / min(times)
