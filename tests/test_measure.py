import math

import pytest
import torch
from torch import nn

from trainfast.measure import (Meter, NonFiniteLossError, StepTimer, batch_samples, count_train_flops, measure_ceiling,
                               peak_memory_bytes)

CPU = torch.device("cpu")


def test_meter_reads_every_n_steps_and_keeps_every_loss():
    reads = []
    timer = StepTimer(CPU)
    meter = Meter(CPU, log_every=3, on_window=lambda step, stats: reads.append(step), timer=timer)
    losses = [0.5, 0.4, 0.3, 0.2, 0.1]
    targets = torch.tensor([0, 1])
    for inputs, _ in meter.iterate(timer.batches([(torch.zeros(2, 3), targets)] * len(losses))):
        i = len(meter.stats.losses) + meter._pending
        timer.step()                             # the optimizer update closes the step
        meter.update(torch.tensor(losses[i]), torch.tensor([[1.0, 0.0], [1.0, 0.0]]), targets)
    assert reads == [3, 5]                       # one read per window, plus the tail
    assert meter.stats.losses == pytest.approx(losses)
    assert meter.stats.correct == 5 and meter.stats.samples == 10
    assert [w.steps for w in meter.stats.windows] == [3, 2]
    assert [s.samples for s in meter.stats.steps] == [2] * 5 and all(s.seconds >= 0 for s in meter.stats.steps)


def test_nonfinite_loss_stops_naming_the_step():
    meter = Meter(CPU, log_every=4, first_step=100)
    out, tgt = torch.zeros(1, 2), torch.tensor([0])
    meter.update(torch.tensor(1.0), out, tgt)
    meter.update(torch.tensor(float("nan")), out, tgt)
    meter.update(torch.tensor(1.0), out, tgt)
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 101"):
        meter.update(torch.tensor(float("inf")), out, tgt)


def test_flop_count_of_a_linear_layer_is_exact():
    model = nn.Linear(16, 8, bias=False)
    def loss_fn(out, tgt):
        return out.sum()

    flops = count_train_flops(model, loss_fn, torch.randn(4, 16), torch.zeros(4))
    # forward 2*B*I*O; backward computes only the weight gradient (the input needs none): 2*B*I*O more
    assert flops == 2 * (2 * 4 * 16 * 8)
    assert model.weight.grad is None                     # the real model is untouched


def test_flop_count_leaves_rng_untouched():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    torch.manual_seed(0)
    count_train_flops(model, lambda o, t: o.sum(), torch.randn(2, 8), None)
    after = torch.rand(1)
    torch.manual_seed(0)
    torch.randn(2, 8)
    assert torch.equal(after, torch.rand(1))


def test_ceiling_and_peak_memory_are_real_numbers():
    flops = measure_ceiling(CPU, torch.float32, n=256, repeats=2)
    assert math.isfinite(flops) and flops > 1e8
    assert peak_memory_bytes(CPU) > 10 * 2**20


def test_batch_samples_of_every_batch_structure():
    images = torch.zeros(4, 3, 8, 8)
    assert batch_samples(images) == 4
    assert batch_samples((images, torch.zeros(4))) == 4
    assert batch_samples({"image": images, "label": torch.zeros(4)}) == 4
    # detection: a list of images of different sizes and a list of target dicts
    assert batch_samples(([torch.zeros(3, 5, 7), torch.zeros(3, 9, 4)], [{}, {}])) == 2


def test_step_timer_sums_micro_batches_into_one_update():
    timer = StepTimer(CPU)
    batches = iter(timer.batches([torch.zeros(3, 1)] * 4))
    for _ in range(2):                           # two micro-batches, one update
        next(batches)
    timer.step()
    for _ in range(2):
        next(batches)
    timer.step()
    steps = timer.read()
    assert [s.samples for s in steps] == [6, 6] and timer.updates == 2


# --- the wait for input, on the host's clock (CPU) and on the device's timeline (CUDA, faked here) -----------

class SlowBatches:
    """Device batches whose host loader takes `fetch_s` a batch (CPU: a sleep)."""

    def __init__(self, n: int, fetch_s: float) -> None:
        self.n, self.fetch_s = n, fetch_s

    def __iter__(self):
        import time

        for _ in range(self.n):
            time.sleep(self.fetch_s)
            yield torch.zeros(2, 1)


def test_cpu_wait_is_the_hosts_time_in_next_and_has_no_copy():
    timer = StepTimer(CPU)
    for _ in timer.batches(SlowBatches(3, 0.02)):
        timer.step()
    steps = timer.read()
    assert all(0.018 <= s.data_wait_s <= s.seconds for s in steps)
    assert all(s.copy_s is None for s in steps)


class FakeEvent:
    def __init__(self, t: float) -> None:
        self.t = t

    def elapsed_time(self, other: "FakeEvent") -> float:       # milliseconds, as torch.cuda.Event's
        return other.t - self.t

    def synchronize(self) -> None:
        pass


class Timeline:
    """One CUDA stream and the host, in milliseconds. An event fires when the stream reaches it: after the work
    queued before it, never before the host records it. A blocking copy holds the host until the stream is done."""

    def __init__(self) -> None:
        self.host = self.device = 0.0

    def event(self) -> FakeEvent:
        self.device = max(self.host, self.device)
        return FakeEvent(self.device)

    def queue(self, ms: float, blocking: bool = False) -> None:
        self.device = max(self.host, self.device) + ms
        if blocking:
            self.host = self.device


class TimelineBatches:
    """A plain device-batch object on the Timeline: the host loader takes `fetch_ms`, then the copy `copy_ms` on
    the compute stream (blocking from pageable memory)."""

    def __init__(self, line: Timeline, n: int, fetch_ms: float, copy_ms: float, blocking: bool) -> None:
        self.line, self.n, self.fetch_ms, self.copy_ms, self.blocking = line, n, fetch_ms, copy_ms, blocking
        self.on_fetched = lambda: None

    def __iter__(self):
        for _ in range(self.n):
            self.line.host += self.fetch_ms
            self.on_fetched()
            self.line.queue(self.copy_ms, self.blocking)
            yield torch.zeros(4, 1)


def timeline_steps(monkeypatch, fetch_ms: float, copy_ms: float = 2.0, compute_ms: float = 20.0,
                   launch_ms: float = 0.5, blocking: bool = True, steps: int = 5):
    """The step clock on a faked CUDA timeline, fed through the Session's hook (TrainState.batches' on_fetched)."""
    import trainfast.measure.clock as measure

    line = Timeline()
    monkeypatch.setattr(measure, "_event", line.event)
    timer = StepTimer(torch.device("cuda"))
    batches = TimelineBatches(line, steps, fetch_ms, copy_ms, blocking)
    batches.on_fetched = timer.arrived
    for _ in timer.batches(batches):
        line.queue(compute_ms)            # the step's kernels
        line.host += launch_ms            # the host's time to launch them
        timer.step()
    return timer.read()[1:]               # the first step starts on an idle device


def test_cuda_wait_leaves_out_a_blocking_copy_that_waits_for_queued_kernels(monkeypatch):
    # A compute-bound step fed from pageable memory: the host sits in next() while the copy waits for the step's
    # kernels (the host's clock called that ~98% waiting); the device never idled for input.
    for step in timeline_steps(monkeypatch, fetch_ms=1.0):
        assert step.data_wait_s == pytest.approx(0.0)
        assert step.copy_s == pytest.approx(0.002)
        assert step.seconds == pytest.approx(0.022)


def test_cuda_wait_is_the_device_idle_for_a_slow_loader(monkeypatch):
    # The loader takes 50 ms a batch; the device still computes the step before for the first 19.5 ms of it (20 ms
    # of kernels, launched in 0.5), then idles for the other 30.5 ms.
    for step in timeline_steps(monkeypatch, fetch_ms=50.0):
        assert step.data_wait_s == pytest.approx(0.0305)
        assert step.copy_s == pytest.approx(0.002)
        assert step.seconds == pytest.approx(0.0525)
        assert step.data_wait_s / step.seconds > 0.2         # input-bound, as it should be


def test_cuda_wait_without_an_arrival_mark_counts_the_whole_span(monkeypatch):
    # A loader that never says when its batch arrived (no on_fetched): the span from the ask to the batch's
    # readiness is the wait, copy 0. The fetch takes 10 ms, of which the step's 5 ms of kernels cover half.
    import trainfast.measure.clock as measure

    line = Timeline()
    monkeypatch.setattr(measure, "_event", line.event)
    timer = StepTimer(torch.device("cuda"))
    for _ in timer.batches(SlowTimeline(line, 3, 10.0)):
        line.queue(5.0)
        timer.step()
    for step in timer.read()[1:]:
        assert step.data_wait_s == pytest.approx(0.005) and step.copy_s == 0.0


class SlowTimeline:
    def __init__(self, line: Timeline, n: int, fetch_ms: float) -> None:
        self.line, self.n, self.fetch_ms = line, n, fetch_ms

    def __iter__(self):
        for _ in range(self.n):
            self.line.host += self.fetch_ms
            yield torch.zeros(1)
