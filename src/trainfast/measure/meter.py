"""Loss and accuracy accumulated on the device and read once per window of steps (Meter), into the epoch's
record (EpochStats); the errors a loss that is not finite, or a loss dict that changes, raises."""
from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch

from .clock import StepTime, StepTimer


class NonFiniteLossError(RuntimeError):
    """Raised by the 'stop' policy; names the first step whose loss was NaN or inf."""


class LossTermsError(RuntimeError):
    """A loss dict whose terms differ between steps, or between ranks (whose logging reductions would then
    not match); names the terms of each."""


@dataclass
class Window:
    steps: int
    samples: int
    seconds: float
    data_wait_s: float
    loss_terms: dict[str, float] = field(default_factory=dict)   # each term's mean over the window and ranks


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
        # detection under torchrun: a collective
        means = self.reduce_terms({n: sum(values) for n, values in terms.items()})
        for name, total in means.items():
            self.stats.term_sums[name] = self.stats.term_sums.get(name, 0.0) + total
        self.stats.windows[-1].loss_terms = {n: total / len(losses) for n, total in means.items()}
        if self.on_window is not None:
            self.on_window(self.step, self.stats)
        self._t_window = time.perf_counter()
