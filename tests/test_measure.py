import math

import pytest
import torch
from torch import nn

from trainfast.measure import Meter, NonFiniteLossError, count_train_flops, measure_ceiling, peak_memory_bytes

CPU = torch.device("cpu")


def test_meter_reads_every_n_steps_and_keeps_every_loss():
    reads = []
    meter = Meter(CPU, log_every=3, on_window=lambda step, stats: reads.append(step))
    losses = [0.5, 0.4, 0.3, 0.2, 0.1]
    targets = torch.tensor([0, 1])
    for value in meter.iterate([None] * len(losses)):
        i = len(meter.stats.losses) + meter._pending
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
