import math

import pytest
import torch
from torch import nn

from trainfast.measure import Meter, StepTimer, batch_samples, NonFiniteLossError, count_train_flops, measure_ceiling, peak_memory_bytes

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
    loss_fn = lambda out, tgt: out.sum()
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
