"""Gradients all-reduced in a half type: DDP's bf16_compress_hook casts each bucket of gradients to bfloat16 before
the all-reduce and back after it, so half the bytes cross the link. It pays where the all-reduce is held by the
link's bandwidth (several nodes, no NVLink) and costs a cast of every bucket on each side. It changes the
arithmetic: the summed gradients are rounded to bf16's 8 bits of mantissa, so a run with it follows another
trajectory and is judged on its time to a target, not on its rate alone. It acts on the DDP wrapper (registered on
it once it is built, before the first forward), which only a job of several processes builds.

fp16_compress_hook does the same in float16: 3 more bits of mantissa than bf16 (the sum rounded less) but 5 bits of
exponent, so a bucket's sum beyond 65504 overflows to inf (the DDP hook divides by the world size before the cast,
which keeps gradients of ordinary size in range). One hook at a time: DDP takes a single communication hook, so each
hook's rung turns the hooks above it off in a cumulative ladder (Recipe refuses two at once)."""
from __future__ import annotations

from typing import Any, Callable

from .switch import RungSpec, Switch, WrapSwitch

FIELD = "bf16_compress_hook"
FP16 = "fp16_compress_hook"


def registers(name: str) -> Callable[[Any, bool], None]:
    """apply(wrapped, on): torch's default hook `name` on the built DDP object (state None: its default process
    group); off leaves DDP's own all-reduce in the gradients' dtype."""
    def register_hook(wrapped: Any, on: bool) -> None:
        if on:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            wrapped.register_comm_hook(None, getattr(default_hooks, name))
    return register_hook


def hook_name(wrapped: Any) -> str:
    """The name of the communication hook the DDP object all-reduces through ("": DDP's own all-reduce)."""
    return next((getattr(hook, "__name__", "") for hook, _ in getattr(wrapped, "_comm_hooks", ())), "")


def registered(name: str) -> Callable[[Any], bool]:
    """state(wrapped): whether the DDP object all-reduces through the hook `name` (the hooks it keeps)."""
    return lambda wrapped: hook_name(wrapped) == name


# the Trainer's reason, shared with powersgd.py
TRAINER_HAS_NO_HOOK = "Trainer builds its DDP from TrainingArguments, which has no setting for a communication hook"
ACCELERATE = "DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.{}) among kwargs_handlers"
SCRIPT_SETS_IT = ("the adapter does not register communication hooks on Lightning's DDP (its DDPStrategy registers one "
                  "on CUDA only); the script sets it with ")
SWITCHES = (
    Switch((FIELD,),
           rungs=(RungSpec(FIELD, {FIELD: True}, place=73.9),),    # after the other DDP switches, before batch sizes
           resumable=True,
           changes_math=True,             # the summed gradients are rounded to bf16
           wrap=WrapSwitch("comm hook bf16_compress_hook", strategies=("ddp",), apply=registers(FIELD),
                           state=registered(FIELD), comm_hook="bf16"),
           unreachable={"transformers": TRAINER_HAS_NO_HOOK,
                        "lightning": SCRIPT_SETS_IT + "DDPStrategy(ddp_comm_hook=default_hooks.bf16_compress_hook)"},
           frameworks={"accelerate": ACCELERATE.format("BF16")}),
    Switch((FP16,),
           # after bf16's, turning it off: DDP takes one hook, so a cumulative ladder swaps bf16 for fp16
           rungs=(RungSpec(FP16, {FP16: True, FIELD: False}, place=73.91),),
           resumable=True,
           changes_math=True,             # the summed gradients are rounded to fp16 (and may overflow past 65504)
           wrap=WrapSwitch("comm hook fp16_compress_hook", strategies=("ddp",), apply=registers(FP16),
                           state=registered(FP16), comm_hook="fp16"),
           unreachable={"transformers": TRAINER_HAS_NO_HOOK,
                        "lightning": SCRIPT_SETS_IT + "DDPStrategy(ddp_comm_hook=default_hooks.fp16_compress_hook)"},
           frameworks={"accelerate": ACCELERATE.format("FP16")}),
)
