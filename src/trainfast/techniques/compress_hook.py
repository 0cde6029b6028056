"""Gradients all-reduced in bf16: DDP's bf16_compress_hook casts each bucket of gradients to bfloat16 before the
all-reduce and back after it, so half the bytes cross the link. It pays where the all-reduce is held by the
link's bandwidth (several nodes, no NVLink) and costs a cast of every bucket on each side. It changes the
arithmetic: the summed gradients are rounded to bf16's 8 bits of mantissa, so a run with it follows another
trajectory and is judged on its time to a target, not on its rate alone. It acts on the DDP wrapper (registered on
it once it is built, before the first forward), which only a job of several processes builds."""
from __future__ import annotations

from typing import Any

from .switch import RungSpec, Switch, WrapSwitch

FIELD = "bf16_compress_hook"


def register_hook(wrapped: Any, on: bool) -> None:
    """bf16_compress_hook on the built DDP object (state None: its default process group); off leaves DDP's own
    all-reduce in the gradients' dtype."""
    if on:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        wrapped.register_comm_hook(None, bf16_compress_hook)


def hook_registered(wrapped: Any) -> bool:
    """Whether the DDP object all-reduces through bf16_compress_hook (the hooks it keeps as registered)."""
    return any(getattr(hook, "__name__", "") == FIELD for hook, _ in getattr(wrapped, "_comm_hooks", ()))


SCRIPT_SETS_IT = "the adapter does not register communication hooks on the framework's DDP; the script sets it with "
SWITCHES = (
    Switch((FIELD,),
           rungs=(RungSpec(FIELD, {FIELD: True}, place=73.9),),    # after the other DDP switches, before batch sizes
           resumable=True,
           changes_math=True,             # the summed gradients are rounded to bf16
           wrap=WrapSwitch("comm hook bf16_compress_hook", strategies=("ddp",), apply=register_hook,
                           state=hook_registered),
           unreachable={"transformers": "Trainer builds its DDP from TrainingArguments, which has no setting for a "
                                        "communication hook",
                        "lightning": SCRIPT_SETS_IT + "DDPStrategy(ddp_comm_hook=default_hooks.bf16_compress_hook)",
                        "accelerate": SCRIPT_SETS_IT + ("DistributedDataParallelKwargs("
                                                        "comm_hook=DDPCommunicationHookType.BF16)")}),
)
