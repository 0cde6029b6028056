"""What the doctor's tests share: tiny runs and loops on a virtual clock, the corpus's constants, the helpers
that run the doctor and read its findings."""
import contextlib
import importlib
import json
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import VirtualTime, tiny_resnet
from torch import nn

from trainfast import envcheck
from trainfast.checks import MATERIAL_SHARE, Observations, run_checks
from trainfast.cli import main
from trainfast.data.datasets import Split, TensorImages
from trainfast.doctor import observe_builtin, observe_loop
from trainfast.envcheck import collect_environment
from trainfast.models import resnet9
from trainfast.recipe import Recipe

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


LOAD_WINDOW_S = envcheck.LOAD_WINDOW_S


@pytest.fixture(autouse=True)
def no_load_window(monkeypatch):
    """The machine's load is read over the timed steps alone, not stretched to LOAD_WINDOW_S by a wait (a second
    per run, its estimate rounded off on a short window): only test_other_processes_on_the_cores... reads it,
    with the real window."""
    monkeypatch.setattr(envcheck, "LOAD_WINDOW_S", 0.0)


def finding(findings, name):
    return next(f for f in findings if f.name == name)


@contextlib.contextmanager
def virtual_clock():
    clock = VirtualTime()
    with pytest.MonkeyPatch.context() as patch:
        for module in ("trainfast.measure.clock", "trainfast.instruments.steps", "trainfast.doctor.loop",
                       "trainfast.instruments.watch"):
            patch.setattr(importlib.import_module(module), "time", clock)
        yield clock


class Tick(nn.Module):
    """A layer that takes `seconds` of the virtual clock: the model's step, of known length."""

    def __init__(self, clock: VirtualTime | None, seconds: float) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds

    def forward(self, x):
        if self.clock is not None:
            self.clock.advance(self.seconds)
        return x


class SlowImages(TensorImages):
    """A dataset whose every sample takes `delay` seconds (a slow decode): 8 samples a batch make the loop
    wait about 8 x delay for each batch, many times the tiny model's step (even on a busy machine, where the
    model's step slows down and a sleep does not). On a virtual clock the delay is the clock's, not a sleep."""

    def __init__(self, images, labels, delay: float, clock: VirtualTime | None = None) -> None:
        super().__init__(images, labels)
        self.delay, self.clock = delay, clock

    def __getitem__(self, index):
        (self.clock or time).sleep(self.delay)
        return super().__getitem__(index)


def tiny_split(delay: float = 0.0, clock: VirtualTime | None = None) -> Split:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (256, 3, 16, 16), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (256,), generator=g)
    make = (lambda x, y: SlowImages(x, y, delay, clock)) if delay else TensorImages
    return Split(make(images[:192], labels[:192]), TensorImages(images[192:], labels[192:]), 10, MEAN, STD, 16, "tiny")


def observe(split: Split, widths=None, tick: tuple[VirtualTime, float] | None = None, **recipe) -> Observations:
    make = (lambda: resnet9(10, widths=widths)) if widths else (lambda: tiny_resnet(10))
    if tick:
        make = (lambda plain: lambda: nn.Sequential(Tick(*tick), plain()))(make)
    return observe_builtin(make, split, recipe=Recipe(batch_size=8, **recipe), device="cpu", steps=8, flops=False)


@pytest.fixture(scope="module")
def fast_run() -> Observations:
    # A model wide enough that its step dwarfs loading 8 tensor images in the training process (~1% of the
    # step here, against ~8% for tiny_resnet, whose step is a few milliseconds): genuinely compute-bound.
    return observe(tiny_split(), widths=(64, 128, 128, 256), set_to_none=True)


# The built-in run input-bound (a slow dataset) and compute-bound, on two clocks. Virtual (the fast suite): each
# sample's read takes 10 ms of it and the model's step 5 ms, so the loop waits 80 ms of every 85 ms step and a
# replayed batch steps in 5 ms, whatever the machine. Real (slow): 10 ms sleeps beside the real step.
CLOCKS = [pytest.param("virtual"), pytest.param("real", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=CLOCKS)
def runs(request) -> dict[str, Observations]:
    if request.param == "real":
        return {"slow": observe(tiny_split(delay=0.01)), "fast": request.getfixturevalue("fast_run")}
    with virtual_clock() as clock:
        return {"slow": observe(tiny_split(delay=0.01, clock=clock), tick=(clock, 0.005)),
                "fast": observe(tiny_split(), tick=(clock, 0.005), set_to_none=True)}


class Net(nn.Module):
    def __init__(self, functional_dropout: bool = False) -> None:
        super().__init__()
        self.functional_dropout = functional_dropout
        self.fc1, self.fc2, self.drop = nn.Linear(8, 16), nn.Linear(16, 3), nn.Dropout(0.5)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = F.dropout(h, 0.5) if self.functional_dropout else self.drop(h)     # F.dropout's default: training=True
        return self.fc2(h)


def run_loop(model=None, *, reads: int = 0, evaluate: str | None = None, zero: str = "none", steps: int = 12):
    """A plain PyTorch loop: `reads` .item() calls per step, an evaluation forward every step ("graph": without
    no_grad, "inference": under inference_mode), zero_grad "none" (set_to_none) / "zeroed" / "never"."""
    model = model if model is not None else Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
        if zero != "never":
            optimizer.zero_grad(set_to_none=zero == "none")
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        for _ in range(reads):
            loss.item()
        if evaluate:
            model.eval()
            if evaluate == "graph":
                model(x)
            else:
                with torch.inference_mode():
                    model(x)
            model.train()


def loop_findings(**kwargs):
    obs = observe_loop(lambda: run_loop(**kwargs), steps=4, sync_steps=4)
    return obs, run_checks(obs)


def compute_obs(fraction: float, half: tuple[str, float] | None, recipe_flags: bool = True) -> Observations:
    """A loop at `fraction` of a 200 GFLOP/s fp32 roof: 100 samples/s x (fraction x 2) GFLOP/sample."""
    obs = Observations("own loop", "cpu", collect_environment())
    obs.step_seconds, obs.samples = [1.0, 1.0, 1.0], [100, 100, 100]
    obs.flops_per_sample, obs.ceiling_flops, obs.ceiling_dtype = fraction * 2e9, 200e9, "fp32"
    obs.half_ceiling, obs.recipe_flags = half, recipe_flags
    return obs


def in_place_status(found) -> str:
    """In-place zeroing is a problem only where its memset costs the step >= MATERIAL_SHARE, else a number."""
    return "problem" if found.share is None or found.share >= MATERIAL_SHARE else "measured"


def zero_grad_finding(loop) -> tuple[Observations, object]:
    obs = observe_loop(loop, steps=4, sync_steps=4, eval_within=0)
    return obs, finding(run_checks(obs), "zero_grad without set_to_none")


class Sampler(nn.Module):
    """A VAE's reparameterization: its forward samples in eval mode too, by design."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 6)

    def forward(self, x):
        mu, logvar = self.fc(x).chunk(2, dim=1)
        return mu + torch.randn_like(mu) * (0.5 * logvar).exp()


class AttentionDropout(nn.Module):
    """Attention dropout passed as a constant: unlike nn.Dropout it does not follow eval()."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(4, 12)

    def forward(self, x):
        q, k, v = self.qkv(x.view(-1, 2, 4)).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).flatten(1)


def evaluating_loop(model, eval_mode: bool, epochs: int, steps: int, pseudo_labels: bool = False):
    """A loop of `epochs` x `steps` SGD steps, each epoch ending in two grad-free forwards (in eval mode, or left
    in training mode); with pseudo_labels, each step first labels its batch with the model itself, grad-free."""
    def run():
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(epochs):
            for _ in range(steps):
                if pseudo_labels:
                    with torch.no_grad():
                        labels = model(torch.randn(4, 8)).argmax(1)
                else:
                    labels = torch.randint(0, 3, (4,))
                optimizer.zero_grad()
                F.cross_entropy(model(torch.randn(4, 8)), labels).backward()
                optimizer.step()
            model.train(not eval_mode)
            with torch.no_grad():
                model(torch.randn(4, 8))
                model(torch.randn(4, 8))
            model.train()
    return run


def shapes_obs(device: str, shapes, benchmark: bool = True) -> Observations:
    return Observations("own loop", device, collect_environment(), shapes=shapes, cudnn_benchmark=benchmark)


# A plain script with no evaluation: the doctor watches and times its first 9 steps, then keeps it going for an
# evaluation that never comes, to its end (the wait's "ended"): 30 steps, not hundreds, so that wait is short.
SCRIPT = """
import torch, torch.nn.functional as F
model = torch.nn.Linear(8, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(30):
    x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.3f}")
"""


LOOPS = Path(__file__).parent / "doctor_loops"


sys.path.insert(0, str(LOOPS))


from loopkit import PLANTS  # noqa: E402  (the corpus's own folder, put on the path just above)


STYLES = ("tutorial_loop", "engine_loop", "split_loop")


MACHINE = "other processes on the cores"     # the machine's load, not the loop's: left out of "nothing else"


MISTAKE_CHECKS = sorted(set(PLANTS.values()))


ALSO = {"slow_loader": {"waiting for the next batch"}}        # the same mistake, seen as time


# Checks judged on measured time: on a loaded 2-core machine a clean loop's few-% data wait can read "measured"
# (below the problem line, worth knowing) instead of "fine". Neither is a false alarm; "problem" would be.
TIMED_CHECKS = {PLANTS["slow_loader"], "waiting for the next batch"}


# A mistake only where it costs: a per-step read stalls a GPU, and on the CPU (these tests) it is counted and
# reported as measured, with the GPU's fix, never as a problem.
CPU_MEASURED = {"item_per_step": PLANTS["item_per_step"]}


# A mistake judged by its measured cost: in-place zeroing's memset, a problem from MATERIAL_SHARE of the step.
COST_JUDGED = {"zero_grad_in_place": PLANTS["zero_grad_in_place"]}


EVIDENCE = {"no_zero_grad": "never called", "zero_grad_in_place": "set_to_none=False", "item_per_step": "item()",
            "functional_dropout": "F.dropout(x, 0.25)", "eval_with_grad": "the loop's first evaluation",
            "eval_in_train_mode": "Dropout", "slow_loader": "the wait is"}


@pytest.fixture
def no_ceiling(monkeypatch):
    """The matmul peak (a second of benchmark per run) is not what the corpus checks."""
    import trainfast.doctor.peaks

    monkeypatch.setattr(trainfast.doctor.peaks, "measure_ceiling",   # the name doctor calls
                        lambda *args, **kwargs: 1e12)


@contextlib.contextmanager
def corpus_clock(plants):
    """The slow dataset's reads (loopkit.SlowImages: 2 ms a sample, 32 ms a batch) and a 10 ms step of the model on
    the virtual clock: the wait the doctor reads is the same on any machine. Other plants: the real clock."""
    if "slow_loader" not in plants:
        yield
        return
    import loopkit

    forward = loopkit.Net.forward

    def step(self, x):
        clock.advance(0.01)
        return forward(self, x)

    with virtual_clock() as clock, pytest.MonkeyPatch.context() as patch:
        patch.setattr(loopkit, "time", clock)
        patch.setattr(loopkit.Net, "forward", step)
        yield


def doctor_script(tmp_path, script, *args, flags=()) -> dict:
    out = tmp_path / "doc"
    assert main(["doctor", "--steps", "4", "--log-every", "4", *flags, "--out", str(out), "--", sys.executable,
                 str(script), *args]) == 0
    return json.loads((out / "doctor.json").read_text())


def statuses(data: dict) -> dict[str, str]:
    return {f["name"]: f["status"] for f in data["findings"]}


def loop_statuses(data: dict) -> dict[str, str]:
    """The loop's findings: the machine's load is not the loop's (a busy test machine reads "problem" there)."""
    return {name: status for name, status in statuses(data).items() if name != MACHINE}


LONG_EPOCH = """
import sys, time, torch, torch.nn.functional as F
model = torch.nn.Linear(8, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100_000):
    optimizer.zero_grad()
    F.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,))).backward()
    optimizer.step()
    if "--stall" in sys.argv and step == 20:
        time.sleep(600)               # no step, no forward: only the doctor's outside limit can end the wait
model.eval()
with torch.no_grad():
    model(torch.randn(4, 8))
"""


REPO = Path(__file__).parent.parent


def fault_obs(faults: int, kernel_s: float, step_s: float = 1.3, device: str = "cpu", threads: int = 2,
              **fields) -> Observations:
    """A step of `step_s` seconds whose `threads` threads are busy throughout: its CPU seconds threads x step_s."""
    return Observations("built-in", device, collect_environment(), step_seconds=[step_s] * 5,
                        step_faults=[faults] * 5, step_kernel_s=[kernel_s] * 5,
                        step_cpu_s=[threads * step_s] * 5, **fields)


# The doctor's own run, in a fresh interpreter (its malloc settings its own): a conv net whose activations are
# 48 MiB, above the 32 MiB up to which glibc's malloc may come to serve a block from its heap: mapped afresh each time.
# Large activations (48 MiB, above glibc's largest mmap threshold) from cheap layers (a per-channel 1x1 conv as the
# second): the faults are the activations', not the arithmetic's.
DOCTOR_FAULTS = """
import json, torch
from torch import nn
from trainfast.checks import run_checks
from trainfast.data.datasets import Split, TensorImages
from trainfast.doctor import observe_builtin
from trainfast.recipe import Recipe
g = torch.Generator().manual_seed(0)
images = torch.randint(0, 256, (128, 3, 64, 64), dtype=torch.uint8, generator=g)
labels = torch.randint(0, 4, (128,), generator=g)
split = Split(TensorImages(images[:96], labels[:96]), TensorImages(images[96:], labels[96:]), 4, (0.5,) * 3,
              (0.25,) * 3, 64, "faults")
make = lambda: nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 1, groups=64), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 4))
obs = observe_builtin(make, split, recipe=Recipe(batch_size=48, reuse_memory={on}), device="cpu", steps=6,
                      flops=False)
f = next(f for f in run_checks(obs) if f.name.startswith("page faults"))
print(json.dumps([sorted(obs.step_faults)[len(obs.step_faults) // 2], f.status, f.fix, f.evidence]))
"""
