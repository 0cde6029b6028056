"""The DDP gradient bucket size: DistributedDataParallel all-reduces gradients in buckets of about this many MiB,
each launched as soon as every gradient in it is ready during the backward. A bigger bucket means fewer all-reduce
calls (less per-call latency, better bandwidth on a slow link) but a later start for the first one, so less of the
communication hides behind the backward; a smaller one the reverse. DDP's default is 25 MiB (with a small first
bucket). It changes when gradients are summed, not what they sum to: the same update up to float reordering.
It acts on the DDP wrapper, which only a job of several processes builds."""
from __future__ import annotations

from typing import Any

from .switch import RungSpec, Switch, WrapSwitch

FIELD = "ddp_bucket_mb"
MIB = 2 ** 20


def bucket_options(mb: float | None) -> dict[str, Any]:
    """DDP's constructor keyword; None leaves DDP's own default, which is not the same as 25 given explicitly
    (given none, DDP keeps its first bucket small so the first all-reduce starts early)."""
    return {} if mb is None else {"bucket_cap_mb": mb}


def bucket_mb(wrapped: Any) -> float:
    """The bucket cap the DDP object holds, in MiB (its `bucket_bytes_cap`)."""
    return wrapped.bucket_bytes_cap / MIB


def bucket_shown(mb: float | None) -> float:
    """The cap a DDP object holds for `mb` (None: DDP's own default, 25 MiB)."""
    return float(DDP_DEFAULT_MB if mb is None else mb)


DDP_DEFAULT_MB = 25
SWITCHES = (
    Switch((FIELD,),
           rungs=(RungSpec("ddp_buckets", {FIELD: 100.0}, place=73.5),),   # 4x DDP's 25: fewer all-reduce calls
           resumable=True,
           wrap=WrapSwitch("bucket_cap_mb", strategies=("ddp",), options=bucket_options, state=bucket_mb,
                           keyword="bucket_cap_mb", trainer_argument="ddp_bucket_cap_mb", show=bucket_shown),
           frameworks={"transformers": "TrainingArguments.ddp_bucket_cap_mb",
                       "lightning": "DDPStrategy(bucket_cap_mb=...), the Trainer's DDP strategy",
                       "accelerate": "DistributedDataParallelKwargs(bucket_cap_mb=...) among kwargs_handlers"}),
)
