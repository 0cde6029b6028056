"""Gradients all-reduced as low-rank factors: DDP's PowerSGD communication hook approximates each bucket's matrix-shaped
gradients by two thin factors P and Q of `powersgd_rank` columns (one step of power iteration, warm-started from the
previous step's Q) and all-reduces those instead, with the rest of the gradient (what the approximation missed) kept
on each rank and added to the next step's (error feedback). A layer of n x m weights then sends (n + m) x rank numbers
instead of n x m: 10-100x fewer bytes on the link for the large layers; vectors (biases, norms) and layers too small
to gain are all-reduced as they are. It pays where the all-reduce is held by a slow link (several nodes on
ethernet) and costs two more all-reduces per bucket, the orthogonalization of P, and an error buffer the size of the
compressed gradients on each rank. It changes the arithmetic (the update is an approximation of the mean gradient),
so it is judged on its time to a target. torch's own default waits 1000 steps of plain all-reduce before it
compresses; here compression starts at the second step (the fewest torch allows with error feedback), so a short
run measures what it buys and what it costs to the metric. It acts on the DDP wrapper (registered once it is built,
before the first forward), which only a job of several processes builds; DDP takes one hook, so its rung turns the
compression hooks above it off."""
from __future__ import annotations

from typing import Any

from .compress_hook import ACCELERATE, FIELD as BF16, FP16, SCRIPT_SETS_IT, TRAINER_HAS_NO_HOOK, hook_name
from .switch import RungSpec, Switch, WrapSwitch

FIELD = "powersgd_rank"
HOOK = "powerSGD_hook"
START_STEP = 2        # the first compressed step: torch's least with error feedback and warm start


def register_powersgd(wrapped: Any, rank: int) -> None:
    """PowerSGD at `rank` on the built DDP object (0: DDP's own all-reduce). Its state keeps the error feedback and
    the warm-started factors, per bucket, for the life of the wrapper."""
    if rank:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                       start_powerSGD_iter=START_STEP)
        wrapped.register_comm_hook(state, powersgd.powerSGD_hook)


def powersgd_rank(wrapped: Any) -> int:
    """The rank the DDP object's PowerSGD hook approximates with, read from the state it keeps (0: no PowerSGD)."""
    if hook_name(wrapped) != HOOK:
        return 0
    return next(state.matrix_approximation_rank for _, state in wrapped._comm_hooks)


def accelerate_state(rank: int) -> dict[str, int]:
    """Accelerate's comm_state_option (the PowerSGDState keywords it registers the hook with) for `rank`."""
    return {"matrix_approximation_rank": rank, "start_powerSGD_iter": START_STEP}


SWITCHES = (
    Switch((FIELD,),
           # after the half-type hooks, turning them off: DDP takes one hook. Rank 2: what PowerSGD's paper trains
           # ResNet-18 on CIFAR-10 with to full accuracy (rank 1 compresses more and loses some)
           rungs=(RungSpec("powersgd", {FIELD: 2, BF16: False, FP16: False}, place=73.92),),
           changes_math=True,             # the all-reduced update is a low-rank approximation, its error fed back
           wrap=WrapSwitch("comm hook powerSGD_hook (matrix_approximation_rank)", strategies=("ddp",),
                           apply=register_powersgd, state=powersgd_rank, comm_hook="power_sgd",
                           comm_state=accelerate_state),
           unreachable={"transformers": TRAINER_HAS_NO_HOOK,
                        "lightning": SCRIPT_SETS_IT + "DDPStrategy(ddp_comm_state=powerSGD.PowerSGDState(...), "
                                                      "ddp_comm_hook=powerSGD.powerSGD_hook)"},
           frameworks={"accelerate": ACCELERATE.format("POWER_SGD") + ", comm_state_option={rank, first step}"}),
)
