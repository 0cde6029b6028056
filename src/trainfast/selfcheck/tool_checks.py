"""trainfast's own instruments, checked on cases whose answer is known: the doctor on planted mistakes (each
against a clean control, so a doctor that flags everything fails), and the default ablation on CUDA, whose
non_blocking rung must be measured and whose rungs must each report the allocator's own peak."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..recipe import Recipe
from .common import Clock, small_net, tiny_split
from .judges import Verdict, judge_flagged, judge_peaks, judge_rung_measured

DOCTOR_STEPS = 6
# The planted mistakes are compiled under a file name outside the package: the doctor counts code in
# trainfast's own files as trainfast's (its once-a-window metric read), and these must read as a user's code.
PLANTED_FILE = "selfcheck_planted_user_code.py"
PLANTED_SOURCE = '''
class HostRead(nn.Module):
    """A value read on the host every step (a sync: the GPU drains before the host goes on)."""
    def __init__(self):
        super().__init__()
        self.net = small_net()

    def forward(self, x):
        out = self.net(x)
        if float(out.detach().abs().max()) > 1e6:
            out = out.clamp(-1e6, 1e6)
        return out


class HostConstant(nn.Module):
    """A constant made on the host and copied to the device every step."""
    def __init__(self):
        super().__init__()
        self.net = small_net()

    def forward(self, x):
        return self.net(x) + torch.ones(1).to(x.device)


class ManySmallOps(nn.Module):
    """Hundreds of tiny kernels per step: the host cannot launch them as fast as the GPU runs them."""
    def __init__(self, depth=100, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(192, width))
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)
'''


def planted(name: str) -> Callable[[], nn.Module]:
    namespace: dict[str, Any] = {"nn": nn, "torch": torch, "small_net": small_net}
    exec(compile(PLANTED_SOURCE, PLANTED_FILE, "exec"), namespace)     # noqa: S102 - our own source, above
    return namespace[name]


class ComputeBound(nn.Module):
    """The clean control on a GPU: wide matmuls, milliseconds of kernels per step, no host reads or copies."""

    def __init__(self, width: int = 8192) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(192, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def doctor_findings(ctx, case: str) -> dict[str, str]:
    """finding name -> status for one doctor run of the built-in loop on `case` (cached per case): "clean" (the
    control: a small net on a CPU, a compute-bound one on a GPU) or a planted model's name."""
    def observe() -> dict[str, str]:
        from ..checks import run_checks
        from ..doctor import observe_builtin

        cuda = ctx.device.type == "cuda"
        model = (ComputeBound if cuda else small_net) if case == "clean" else planted(case)
        batch = 512 if cuda and case == "clean" else 32
        # prefetch: uint8 batches normalized on the device, so the input pipeline never decides the verdicts
        recipe = Recipe(optimizer="sgd", batch_size=batch, log_every=4, prefetch=True)
        obs = observe_builtin(model, tiny_split(n=8 * batch), recipe=recipe, device=str(ctx.device),
                              steps=DOCTOR_STEPS, flops=False)
        return {f.name: f.status for f in run_checks(obs)}
    return ctx.once(f"doctor:{case}", observe)


def flagged(ctx, case: str, finding: str, expect: str = "problem") -> Verdict:
    return judge_flagged(doctor_findings(ctx, case)[finding], doctor_findings(ctx, "clean")[finding], finding, expect)


def check_doctor_syncs(ctx) -> Verdict:
    # A host read stalls a GPU's queue, so there it is a problem; on the CPU the step has already run when the
    # value is read, so the doctor counts the reads and lists them as measured (with the GPU's fix), never a problem.
    expect = "problem" if ctx.device.type == "cuda" else "measured"
    return flagged(ctx, "HostRead", "host-device syncs per step", expect)


def check_doctor_launch_bound(ctx) -> Verdict:
    return flagged(ctx, "ManySmallOps", "launch-bound steps")


def check_doctor_host_copies(ctx) -> Verdict:
    return flagged(ctx, "HostConstant", "tensors created on the host and copied every step")


def conv_loop(device: torch.device, sizes: list[int], steps: int = 200) -> Callable[[], None]:
    """A user's own loop over conv inputs whose size cycles through `sizes`."""
    from ..models import resnet9

    def loop() -> None:
        torch.manual_seed(0)
        model = resnet9(4, widths=(8, 16, 16, 32)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(steps):
            size = sizes[i % len(sizes)]
            loss = model(torch.randn(16, 3, size, size, device=device)).float().pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return loop


def new_shape_seconds(device: torch.device, benchmark: bool, sizes: list[int]) -> float:
    """Mean seconds of a step at a size this process has not run yet, with cudnn.benchmark on or off."""
    torch.backends.cudnn.benchmark = benchmark
    clock = Clock(device)
    return sum(clock.seconds(conv_loop(device, [size], steps=1)) for size in sizes) / len(sizes)


def check_cudnn_varying(ctx) -> Verdict:
    from ..checks import run_checks
    from ..doctor import observe_loop

    name = "cudnn.benchmark with changing input shapes"
    previous = torch.backends.cudnn.benchmark
    statuses = {}
    try:
        torch.backends.cudnn.benchmark = True
        for case, sizes in (("varying", [32, 40, 48, 56, 64, 72]), ("fixed", [32])):
            obs = observe_loop(conv_loop(ctx.device, sizes), steps=DOCTOR_STEPS, sync_steps=4,
                               device=str(ctx.device), eval_within=0)
            statuses[case] = next(f.status for f in run_checks(obs) if f.name == name)
        on = new_shape_seconds(ctx.device, True, [80, 88, 96])          # sizes no run above has seen
        off = new_shape_seconds(ctx.device, False, [104, 112, 120])
    finally:
        torch.backends.cudnn.benchmark = previous
    verdict = judge_flagged(statuses["varying"], statuses["fixed"], name)
    return Verdict(verdict.ok, on / off, "x per new shape",
                   f"{verdict.detail}; a step at a new shape took {on * 1e3:.0f} ms with benchmark on, "
                   f"{off * 1e3:.0f} ms off")


def ablation_rungs(ctx) -> list[dict[str, Any]]:
    """The default ladder on the built-in run (resnet9, digits), once, as short as it can be: one repeat per
    rung, no extra seeds or settling passes, a short timing budget. Cached for both ablation checks."""
    def run() -> list[dict[str, Any]]:
        from ..ablation import TimingBudget, ablate

        result = ablate("resnet9", data="digits", device=str(ctx.device), out=ctx.out / "ablation", repeats=1,
                        noise_seeds=1, settle_within_s=0, show=False, budget=TimingBudget(steps=8, seconds=20.0))
        return [{"name": r.name, "status": str(r.status), "effect": str(r.effect), "reason": r.reason,
                 "speedup": r.result.speedup, "peak_memory_bytes": r.result.peak_memory_bytes} for r in result.rungs]
    return ctx.once("ablation", run)


def check_ablation_non_blocking(ctx) -> Verdict:
    return judge_rung_measured(ablation_rungs(ctx), "non_blocking")


def check_ablation_peaks(ctx) -> Verdict:
    return judge_peaks(ablation_rungs(ctx))
