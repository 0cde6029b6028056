"""The measuring instrument: step windows timed after a device sync, metrics accumulated on the device
and read once per window, peak memory, model FLOPs and the device's matmul ceiling."""
from __future__ import annotations

import copy
import math
import resource
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
from torch import nn


class NonFiniteLossError(RuntimeError):
    """Raised by the 'stop' policy; names the first step whose loss was NaN or inf."""


class LossTermsError(RuntimeError):
    """A loss dict whose terms differ between steps, or between ranks (whose logging reductions would then
    not match); names the terms of each."""


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Window:
    steps: int
    samples: int
    seconds: float
    data_wait_s: float
    loss_terms: dict[str, float] = field(default_factory=dict)   # each term's mean over the window and ranks


@dataclass(frozen=True)
class StepTime:
    """One step as the clock saw it: seconds from the previous step's end to this one's (so the steps
    of a pass tile its wall time), samples in the step, the part spent waiting for its batch, and on CPU the
    CPU seconds this process used and the whole machine used meanwhile (busy time of every core, the
    hypervisor's steal included), from which `Timing` tells when other processes were competing.

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
        self._marks: list = []
        self._pending: list[tuple[int, list[InputSpan]]] = []
        self.steps: list[StepTime] = []

    def _mark(self):
        if self.cuda:
            return _event()
        return time.perf_counter(), time.process_time(), machine_busy_seconds()

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
    images of different sizes) counts its items."""
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

    def step(self) -> None:
        self.clock.step(self._samples, self._spans)
        self._samples, self._spans = 0, []
        self.updates += 1

    def read(self) -> list[StepTime]:
        return self.clock.read()


@dataclass
class EpochStats:
    losses: list[float] = field(default_factory=list)   # every step's loss, in order
    correct: int = 0
    samples: int = 0
    windows: list[Window] = field(default_factory=list)
    steps: list[StepTime] = field(default_factory=list)  # every step's time (measure.StepClock)
    seconds: float = 0.0
    data_wait_s: float = 0.0
    term_sums: dict[str, float] = field(default_factory=dict)   # loss dicts: each term's sum, mean over ranks

    @property
    def loss(self) -> float:
        return sum(self.losses) / max(1, len(self.losses))

    @property
    def loss_terms(self) -> dict[str, float]:
        """Each loss term's mean over the steps (and the ranks); empty for a single loss tensor."""
        return {name: total / max(1, len(self.losses)) for name, total in self.term_sums.items()}

    def absorb(self, other: "EpochStats") -> None:
        """Add another pass's steps (the ablation reports its epochs together)."""
        self.losses.extend(other.losses)
        self.correct += other.correct
        self.samples += other.samples
        for name, total in other.term_sums.items():
            self.term_sums[name] = self.term_sums.get(name, 0.0) + total

    @property
    def accuracy(self) -> float:
        return self.correct / max(1, self.samples)


def count_correct(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Classification's per-step score: correct predictions (on the device) and samples."""
    return (outputs.detach().argmax(dim=-1) == targets).sum(), targets.shape[0]


def local_terms(sums: dict[str, float]) -> dict[str, float]:
    return dict(sums)


class Meter:
    """Accumulates loss and accuracy on the device (no per-step `.item()`, which would stall the host
    until the device caught up) and reads them every `log_every` steps. Each read is one sync, after
    which the wall clock is read: a window's time covers exactly the work of its steps. Step times and
    the data wait come from the run's StepTimer (the Session's), read at the same moment.

    A loss dict (detection) is accumulated term by term, each in its own device buffer read with the loss;
    the window's term sums go through `reduce_terms` (under torchrun: key sets compared, then averaged over
    ranks: Dist.reduce_terms) into the window and the epoch's `loss_terms`. `score(outputs, targets)` is the
    task's per-step count: (correct predictions or None, samples)."""

    def __init__(self, device: torch.device, log_every: int,
                 on_window: Callable[[int, "EpochStats"], None] | None = None, first_step: int = 0,
                 stop_on_nonfinite: bool = True,
                 agree: Callable[[int | None], list[tuple[int, int]]] | None = None,
                 timer: StepTimer | None = None,
                 score: Callable[[object, object], tuple[torch.Tensor | None, int]] = count_correct,
                 reduce_terms: Callable[[dict[str, float]], dict[str, float]] = local_terms) -> None:
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
        self.timer = timer
        self.score, self.reduce_terms = score, reduce_terms
        self._losses = torch.zeros(log_every, device=device)
        self._terms: dict[str, torch.Tensor] = {}      # loss dicts: one buffer per term, like _losses
        self._correct = torch.zeros((), dtype=torch.long, device=device)
        self._pending = 0
        self._pending_samples = 0
        self._t_epoch = self._t_window = time.perf_counter()

    def iterate(self, batches: Iterable) -> Iterator:
        """Yields the epoch's batches; reads the last window when they run out."""
        self._t_epoch = self._t_window = time.perf_counter()
        yield from batches
        self.flush()
        self.stats.seconds = time.perf_counter() - self._t_epoch

    def update(self, loss: torch.Tensor | Mapping[str, torch.Tensor], outputs, targets) -> None:
        total = self.record_terms(loss) if isinstance(loss, Mapping) else loss
        self._losses[self._pending].copy_(total.detach().float())
        correct, samples = self.score(outputs, targets)
        if correct is not None:
            self._correct += correct
        self._pending += 1
        self._pending_samples += samples
        self.step += 1
        if self._pending == self.log_every:
            self.flush()

    def record_terms(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Each term into its buffer; returns their sum. A model must return the same terms at every step:
        a change is refused at once, naming the step (a term missing from some steps would otherwise be
        averaged over the steps that had it, and silently)."""
        if self._terms and set(terms) != set(self._terms):
            raise LossTermsError(f"the loss dict changed at step {self.step}: terms {sorted(terms)}, earlier steps "
                                 f"{sorted(self._terms)}")
        for name, value in terms.items():
            if name not in self._terms:
                self._terms[name] = torch.zeros(self.log_every, device=self.device)
            self._terms[name][self._pending].copy_(value.detach().float())
        return sum(terms.values())

    def flush(self) -> None:
        if self._pending == 0:
            return
        names = sorted(self._terms)
        read = torch.stack([self._losses[: self._pending]] + [self._terms[n][: self._pending] for n in names])
        losses, *term_values = read.tolist()                  # the one sync of this window
        terms = dict(zip(names, term_values))
        correct = int(self._correct.item())
        steps = self.timer.read() if self.timer is not None else []
        self.stats.steps.extend(steps)
        wait = sum(s.data_wait_s for s in steps)
        now = time.perf_counter()
        first = self.step - self._pending
        self.stats.windows.append(Window(self._pending, self._pending_samples, now - self._t_window, wait))
        self.stats.data_wait_s += wait
        self.stats.losses.extend(losses)
        self.stats.correct += correct
        self.stats.samples += self._pending_samples
        self._correct.zero_()
        self._pending = self._pending_samples = 0
        bad = [first + i for i, v in enumerate(losses) if not math.isfinite(v)]
        ranks = self.agree(bad[0] if bad else None) if self.stop_on_nonfinite else []
        if ranks:
            step = min(s for _, s in ranks)
            where = f"loss is {losses[bad[0] - first]}" if bad and bad[0] == step else "loss is not finite"
            policy = "policy nonfinite=stop"
            if self.name_ranks:
                where += f" on rank(s) {', '.join(str(r) for r, s in ranks if s == step)}"
                policy += "; every rank stops at this step"
            if terms and first <= step < self.step:           # which term went bad (this rank's values)
                policy += "; loss terms at that step" + (" on this rank" if self.name_ranks else "") + ": " + \
                    ", ".join(f"{n}={values[step - first]:.6g}" for n, values in terms.items())
            raise NonFiniteLossError(
                f"{where} at step {step} ({policy}). Lower the learning "
                f"rate, add --warmup-steps or --grad-clip, or use bf16 instead of fp16.")
        means = self.reduce_terms({n: sum(values) for n, values in terms.items()})   # detection under torchrun: a collective
        for name, total in means.items():
            self.stats.term_sums[name] = self.stats.term_sums.get(name, 0.0) + total
        self.stats.windows[-1].loss_terms = {n: total / len(losses) for n, total in means.items()}
        if self.on_window is not None:
            self.on_window(self.step, self.stats)
        self._t_window = time.perf_counter()


def detect_warmup(seconds: list[float], min_skip: int = 1, settle: int = 3, tolerance: float = 0.5) -> int:
    """How many leading steps are warm-up: the index of the first step from which `settle` steps in a row
    each take at most (1 + tolerance) x the steady level, that level being the median of the second half
    of the run (warm-up is assumed to be shorter than half of it; the caller runs enough steps for that).
    The first `min_skip` steps are always warm-up (first touch of every buffer). Compilation, allocator
    growth and worker start-up cost 2x to 100x a steady step; the machine's own step-to-step noise here is
    well under 1.5x, so the rule stops where the start-up costs stop rather than at a fixed count."""
    n = len(seconds)
    if n <= min_skip:
        return n
    level = statistics.median(seconds[n // 2:])
    limit = level * (1 + tolerance)
    settle = max(1, min(settle, n - min_skip))
    for start in range(min_skip, n - settle + 1):
        if all(t <= limit for t in seconds[start:start + settle]):
            return start
    return n - settle          # never settled: keep only the last few steps, and the spread will show it


BLOCK_SECONDS = 0.2       # a timing block: consecutive steps summing to at least this (20 ticks of /proc/stat)
DISTURBED_SHARE = 0.25    # a block is disturbed when other processes used more than this share of the machine


@dataclass
class Timing:
    """A run's steady state: the steps after warm-up, grouped in blocks of consecutive steps, and the rate
    they give. The rate is total samples over total seconds of the clean blocks, exactly what a clock around
    them reads (no median of ratios). A block is disturbed, and left out, when other processes used more
    than DISTURBED_SHARE of the machine's cores during it (CPU runs in one process only: DataLoader workers
    or other ranks would count as "other processes"; elsewhere nothing is left out)."""
    warmup_steps: int
    step_seconds: list[float]
    step_samples: list[int]
    data_wait_s: float
    blocks: list[dict]            # {"steps", "samples", "seconds", "foreign_share", "disturbed"}
    warmup_seconds: list[float] = field(default_factory=list)   # the left-out steps (compilation shows here)
    copy_s: float | None = None   # CUDA: the batches' copy and preparation on the compute stream (StepTime)

    @classmethod
    def from_steps(cls, steps: list[StepTime], min_skip: int = 1, check_disturbance: bool = False) -> "Timing":
        import os

        warmup = detect_warmup([s.seconds for s in steps], min_skip=min_skip)
        timed = steps[warmup:]
        cores = os.cpu_count() or 1
        blocks, current = [], []
        for i, step in enumerate(timed):
            current.append(step)
            if sum(s.seconds for s in current) >= BLOCK_SECONDS or i == len(timed) - 1:
                blocks.append(step_block(current, cores, check_disturbance))
                current = []
        clean = [s for b, group in _grouped(timed, blocks) if not b["disturbed"] for s in group]
        clean = clean or timed          # every block disturbed: the rate comes from all of them (clean_blocks)
        copies = [s.copy_s for s in clean]
        return cls(warmup, [s.seconds for s in timed], [s.samples for s in timed],
                   sum(s.data_wait_s for s in clean), blocks, [s.seconds for s in steps[:warmup]],
                   sum(copies) if copies and None not in copies else None)

    @property
    def clean_blocks(self) -> list[dict]:
        """The undisturbed blocks; all of them when every block was disturbed (a machine busy throughout:
        a rate from disturbed steps, which the report says, beats no rate at all)."""
        return [b for b in self.blocks if not b["disturbed"]] or self.blocks

    @property
    def clean_steps(self) -> int:
        return sum(b["steps"] for b in self.clean_blocks)

    @property
    def seconds(self) -> float:
        return sum(b["seconds"] for b in self.clean_blocks)

    @property
    def throughput(self) -> float:
        return sum(b["samples"] for b in self.clean_blocks) / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"warmup_steps": self.warmup_steps, "timed_steps": self.clean_steps, "timed_seconds": self.seconds,
                "throughput": self.throughput, "data_wait_s": self.data_wait_s, "copy_s": self.copy_s,
                "disturbed_steps": len(self.step_seconds) - self.clean_steps,
                "all_disturbed": bool(self.blocks) and all(b["disturbed"] for b in self.blocks),
                "warmup_seconds": self.warmup_seconds, "step_seconds": self.step_seconds,
                "step_samples": self.step_samples, "blocks": self.blocks}


def step_block(steps: list[StepTime], cores: int, check: bool) -> dict:
    """Consecutive steps as one timing block: samples, seconds, and whether other processes disturbed it."""
    seconds = sum(s.seconds for s in steps)
    foreign = None
    if check and all(s.machine_cpu_s is not None for s in steps) and seconds > 0:
        other = sum(s.machine_cpu_s - s.own_cpu_s for s in steps)
        foreign = max(0.0, other) / (seconds * cores)
    return {"steps": len(steps), "samples": sum(s.samples for s in steps), "seconds": seconds,
            "foreign_share": foreign, "disturbed": foreign is not None and foreign > DISTURBED_SHARE}


def _grouped(steps: list[StepTime], blocks: list[dict]):
    i = 0
    for b in blocks:
        yield b, steps[i:i + b["steps"]]
        i += b["steps"]


def steps_to_time(timing: Timing, min_steps: int, max_seconds: float, floor: int = 8, min_seconds: float = 0.0) -> int:
    """More steps needed for a timing of `min_steps` steady steps, or of at least `floor` steps once they
    take `max_seconds` (a slow model is timed over fewer, longer steps: its windows are already long), and in
    any case of at least `min_seconds` (millisecond steps: enough blocks for a spread)."""
    have = timing.clean_steps
    per_step = timing.seconds / have if have else 0.0
    affordable = int(max_seconds / per_step) if per_step > 0 else min_steps
    target = max(floor, min(min_steps, affordable))
    if per_step > 0 and min_seconds > 0:
        target = max(target, math.ceil(min_seconds / per_step))
    return max(0, target - have)


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


# The matmul probes read the real clock even where a script swaps time.perf_counter for its own (a test's virtual
# clock): a peak is a property of the machine, not of the run's clock.
_wall_clock = time.perf_counter


def runs_tf32(model: nn.Module | None, device: torch.device) -> bool:
    """Whether an fp32 run of this model does most of its arithmetic in TF32 on this device: on CUDA PyTorch runs
    convolutions in TF32 by default (torch.backends.cudnn.allow_tf32) and matmuls only when asked
    (torch.backends.cuda.matmul.allow_tf32, set_float32_matmul_precision). Which kernels carry the model is read
    from its weights: convolution weights outnumbering linear ones (a ResNet) make it a conv model, else (a ViT,
    whose one convolution is its patch embedding) a matmul model. The fp32 roof is then the TF32 one."""
    if device.type != "cuda" or model is None:
        return False
    def weights(kind) -> int:          # a lazy module's weight has no size yet: it counts for nothing
        return sum(m.weight.numel() for m in model.modules() if isinstance(m, kind)
                   and not isinstance(m.weight, nn.parameter.UninitializedParameter))
    conv, linear = weights(nn.modules.conv._ConvNd), weights(nn.Linear)
    return bool(torch.backends.cudnn.allow_tf32) if conv >= linear else bool(torch.backends.cuda.matmul.allow_tf32)


def measure_ceiling(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5,
                    product_seconds: float = 0.05, tf32: bool = False) -> float:
    """`tf32`: an fp32 ceiling measured with TF32 matmuls (runs_tf32: the roof of an fp32 run's kernels there)."""
    if tf32 and device.type == "cuda" and dtype == torch.float32:
        kept = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return measure_ceiling(device, dtype, n, repeats, product_seconds)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = kept
    return _measure_ceiling(device, dtype, n, repeats, product_seconds)


def _measure_ceiling(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5,
                     product_seconds: float = 0.05) -> float:
    """The device's achievable matmul FLOP/s in `dtype`: the best of `repeats` n x n x n products after a
    warm-up (a peak, so the fastest run is the estimate; slower runs are interference). 2048 is large
    enough for the CPU's BLAS to reach its peak; GPUs need 4096. The roof every rung is compared against.

    Without `n` the size grows from 256 by doubling up to that largest size, and stops as soon as one product
    takes `product_seconds`: a dtype without hardware support (bf16 on a CPU without AVX512-BF16 or AMX runs
    at ~1 GFLOP/s) would otherwise spend minutes on a 2048 product, and a product that long is at its peak."""
    largest = n or (4096 if device.type == "cuda" else 2048)
    size = n or 256
    while True:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        synchronize(device)
        t0 = _wall_clock()
        torch.mm(a, b)                      # the warm-up, and the price of one product at this size
        synchronize(device)
        if size >= largest or _wall_clock() - t0 >= product_seconds:
            break
        size *= 2
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = _wall_clock()
        torch.mm(a, b)
        synchronize(device)
        times.append(_wall_clock() - t0)
    return 2 * size**3 / min(times)
