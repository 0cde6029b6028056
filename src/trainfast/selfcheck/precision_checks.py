"""Mixed precision, through trainfast's own precision objects (techniques/precision.py) and the Session's step:
fp16 dynamic loss scaling around a planted inf, and O1 fp16, O2 fp16 (fp32 masters) and O1 bf16 each against
fp32 on the same short run. They run on CUDA, and on the CPU as well (GradScaler works there with fp16
autocast; fp16 is emulated and slow there, which a small model does not notice)."""
from __future__ import annotations

import warnings

import torch

from ..recipe import Recipe
from ..techniques.precision import build_precision
from .common import Trace, short_run
from .judges import PARITY_TOLERANCE, Verdict, judge_masters, judge_parity, judge_scaler

LR = 5e-3                # the short run's AdamW step: fast enough that fp32 learns within STEPS
INF_STEP = 10            # the step whose gradient gets the planted inf
GROWTH_INTERVAL = 4      # clean steps before the scale doubles: short, so the regrowth shows within the run
INIT_SCALE = 2.0 ** 8    # low, so no step overflows by itself and the planted one is the only skip


def recipe(precision: str = "fp32", level: str = "autocast") -> Recipe:
    return Recipe(precision=precision, precision_level=level, lr=LR, weight_decay=0.0)


def quiet_run(*args, **kwargs) -> Trace:
    """A short run with the slow-half-precision warning silenced: on a CPU fp16 is emulated, known and fine."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return short_run(*args, **kwargs)


def fp32_reference(ctx) -> Trace:
    return ctx.once("fp32", lambda: quiet_run(recipe(), ctx.device))


def plant_inf(state, step: int) -> None:
    """An inf in one (scaled) gradient at INF_STEP: what an overflowing fp16 backward leaves behind."""
    if step == INF_STEP:
        grad = next(p for p in state.model.parameters() if p.grad is not None).grad
        grad.view(-1)[0] = float("inf")


def check_fp16_scaler(ctx) -> Verdict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        precision = build_precision("fp16", ctx.device, "autocast", init_scale=INIT_SCALE,
                                    growth_interval=GROWTH_INTERVAL)
    trace = quiet_run(recipe("fp16"), ctx.device, steps=INF_STEP + 3 * GROWTH_INTERVAL, precision=precision,
                      plant=plant_inf)
    skipped = int(trace.state.precision.metrics().get("skipped_steps", -1))
    return judge_scaler(trace.scales, trace.changed, INF_STEP, skipped, backoff=0.5)


def check_parity(ctx, precision: str, level: str = "autocast") -> tuple[Verdict, Trace]:
    trace = quiet_run(recipe(precision, level), ctx.device)
    return judge_parity(fp32_reference(ctx).losses, trace.losses, PARITY_TOLERANCE[precision]), trace


def check_fp16_o1_parity(ctx) -> Verdict:
    return check_parity(ctx, "fp16")[0]


def check_bf16_o1_parity(ctx) -> Verdict:
    return check_parity(ctx, "bf16")[0]


def check_fp16_o2_master(ctx) -> Verdict:
    parity, trace = check_parity(ctx, "fp16", "master")
    state = trace.state
    weights = [str(p.dtype).removeprefix("torch.") for p in state.model.parameters()]
    # The masters: what the optimizer steps that is not a model weight (fp32 norms are their own masters).
    in_model = {id(p) for p in state.model.parameters()}
    masters = [str(p.dtype).removeprefix("torch.") for group in state.optimizer.optimizer.param_groups
               for p in group["params"] if id(p) not in in_model]
    with torch.no_grad():
        diffs = [float((half.float() - master.to(half.dtype).float()).abs().max())
                 for half, master in getattr(state.precision, "pairs", [])]
    masters_verdict = judge_masters(weights, masters, max(diffs, default=float("nan")))
    return Verdict(parity.ok and masters_verdict.ok, parity.figure, parity.unit,
                   f"{masters_verdict.detail}; {parity.detail}")
