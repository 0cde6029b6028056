"""What the checks share: small models and data made in memory (nothing downloaded), a short training run
through the Session's own step (session.build_state: the techniques applied exactly as a real run applies
them), and step timing with CUDA events."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ..data.datasets import Split, TensorImages
from ..recipe import Recipe
from ..session import build_state, seed_everything

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
STEPS = 40                  # a short run: enough for the fp32 reference to learn, a second or two on a CPU


class SmallNet(nn.Module):
    """Linear - LayerNorm - ReLU - Linear: a LayerNorm so O2's fp32 norms are exercised; no BatchNorm, so
    DDP's ranks and one process see the same arithmetic (BatchNorm statistics are per rank)."""

    def __init__(self, inputs: int = 3 * 8 * 8, width: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(inputs, width), nn.LayerNorm(width), nn.ReLU())
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def small_net() -> nn.Module:
    """A fresh SmallNet with the same initial weights every time (module-level: picklable for a spawned rank)."""
    torch.manual_seed(0)
    return SmallNet()


def tiny_split(n: int = 320, size: int = 8, classes: int = 4, seed: int = 123) -> Split:
    """uint8 images whose class shifts their brightness, so a few dozen steps learn something."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    noise = torch.randint(0, 96, (n, 3, size, size), generator=g)
    images = (noise + labels.view(-1, 1, 1, 1) * 48).clamp(0, 255).to(torch.uint8)
    val = TensorImages(images[:64], labels[:64])
    return Split(TensorImages(images, labels), val, classes, MEAN, STD, size, "selfcheck")


def fixed_batches(n: int = 4, batch: int = 32, size: int = 8,
                  classes: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Normalized float batches of tiny_split's kind, on the CPU (moved by the caller)."""
    split = tiny_split(n * batch, size, classes)
    images, labels = split.train.images.float(), split.train.labels
    images = (images / 255 - 0.5) / 0.25
    return [(images[i * batch:(i + 1) * batch], labels[i * batch:(i + 1) * batch]) for i in range(n)]


@dataclass
class Trace:
    """What a short run recorded per step: its loss, the loss scale after it, whether it moved the weights."""
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    changed: list[bool] = field(default_factory=list)
    state: Any = None                     # the TrainState, for what a check reads afterwards


def short_run(recipe: Recipe, device: torch.device, steps: int = STEPS, precision=None,
              plant: Callable[[Any, int], None] | None = None, model_fn: Callable[[], nn.Module] = small_net) -> Trace:
    """`steps` optimizer steps of the Session's step (forward under the precision's autocast, backward through
    the loss scaler, update through the precision's step) on fixed batches, same seed every time. `plant(state,
    step)` runs between backward and update (to force an inf gradient). Reads the loss and the scale every
    step: a check, not a benchmark."""
    seed_everything(recipe.seed)
    state = build_state(model_fn(), recipe, device, precision=precision)
    batches = [(x.to(device), y.to(device)) for x, y in fixed_batches()]
    trace = Trace(state=state)
    watched = next(p for p in state.model.parameters() if p.requires_grad)
    for step in range(steps):
        x, y = batches[step % len(batches)]
        x = x.contiguous(memory_format=torch.channels_last) if recipe.channels_last and x.ndim == 4 else x
        loss = nn.functional.cross_entropy(state.forward(x), y)
        state.backward(loss)
        if plant is not None:
            plant(state, step)
        before = watched.detach().clone()
        state.update()
        state.zero_grad(True)
        trace.losses.append(float(loss.detach()))
        trace.scales.append(float(state.precision.metrics().get("loss_scale", 1.0)))
        trace.changed.append(not torch.equal(before, watched.detach()))
    return trace


class Clock:
    """Times work on a device: CUDA events on the current stream (the GPU's own clock, no host jitter), the
    host clock around a synchronize elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def seconds(self, work: Callable[[], Any]) -> float:
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            work()
            return time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(self.device)
        start.record()
        work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def median(self, work: Callable[[], Any], repeats: int = 5, warmup: int = 2) -> float:
        for _ in range(warmup):
            self.seconds(work)
        return statistics.median(self.seconds(work) for _ in range(repeats))


def interleaved_medians(variants: dict[str, Callable[[], Any]], clock: Clock, rounds: int = 5,
                        warmup: int = 2) -> dict[str, float]:
    """Median seconds of each variant's `work`, the variants alternated round by round, so a slow spell of the
    machine (clocks, a neighbour) slows them alike instead of biasing whichever ran during it."""
    for work in variants.values():
        for _ in range(warmup):
            clock.seconds(work)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, work in variants.items():
            times[name].append(clock.seconds(work))
    return {name: statistics.median(ts) for name, ts in times.items()}


def step_fn(state, batch: tuple[torch.Tensor, torch.Tensor], steps: int = 1) -> Callable[[], None]:
    """`steps` training steps of a built TrainState on one resident batch (for timing a technique)."""
    x, y = batch

    def work() -> None:
        for _ in range(steps):
            state.backward(nn.functional.cross_entropy(state.forward(x), y))
            state.update()
            state.zero_grad(True)
    return work
