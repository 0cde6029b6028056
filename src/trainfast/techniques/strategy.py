"""The data-parallel wrapper itself, DDP or FSDP2, as a rung. DistributedDataParallel keeps a whole replica of the
parameters, gradients and optimizer state on every rank and all-reduces the gradients in buckets during the
backward; FSDP2 (fully_shard, per block and at the root: distributed.apply_fsdp) keeps a 1/N shard of each on every
rank, all-gathers a block's parameters before its forward and backward, and reduce-scatters its gradients. FSDP2
trades more communication (an all-gather per block and pass, where DDP has one all-reduce per bucket) for a model,
its gradients and its optimizer state that fit where a replica does not; at a size DDP fits, it is usually slower.
The update is the same up to float reordering (its mixed precision casts the parameters rather than autocasting the
ops, distributed.precision_name). It acts on the job's wrapper, which only a job of several processes builds, and
is read back from the object the run built (DDP, or fully_shard's FSDPModule)."""
from __future__ import annotations

from typing import Any

from .switch import RungSpec, Switch, WrapSwitch

FIELD = "strategy"


def wrapper_kind(wrapped: Any) -> str:
    """The strategy the built wrapper is ("ddp", "fsdp"), from its class; another wrapper: its class name."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(wrapped, DistributedDataParallel):
        return "ddp"
    return "fsdp" if isinstance(wrapped, FSDPModule) else type(wrapped).__name__


BUILT_BY_FRAMEWORK = "the framework builds the wrapper its own way and the adapter sets DDP's settings on it; the " \
                     "script chooses FSDP2 with "
SWITCHES = (
    Switch((FIELD,),
           # after the DDP switches (in a cumulative ladder they are then left alone: they act on DDP only), before
           # the batch sizes, which change the math
           rungs=(RungSpec("fsdp", {FIELD: "fsdp"}, place=73.95),),
           own_process=True,              # the ranks of a multi-process job
           wrap=WrapSwitch("wrapper (DistributedDataParallel, or FSDP2's fully_shard)", strategies=("ddp", "fsdp"),
                           state=wrapper_kind),
           unreachable={"transformers": BUILT_BY_FRAMEWORK + "TrainingArguments(fsdp=..., fsdp_config={'version': 2})",
                        "lightning": BUILT_BY_FRAMEWORK + "Trainer(strategy=ModelParallelStrategy()) and fully_shard "
                                                          "in configure_model",
                        "accelerate": BUILT_BY_FRAMEWORK + "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin("
                                                           "fsdp_version=2))"}),
)
