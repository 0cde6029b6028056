"""Gradients as views into DDP's buckets: DistributedDataParallel keeps each bucket of gradients in one flat buffer
for its all-reduce; by default every parameter's `.grad` is a separate tensor, copied into the bucket before the
all-reduce and back after it. With gradient_as_bucket_view the `.grad` tensors are views into the buckets: one
gradient-sized buffer less (the model's gradients' bytes, again) and two copies less per step. The arithmetic is
the same. What it costs: a gradient can no longer be detached in place (`detach_()` on a view fails; torch's own
zero_grad avoids it, a script's hand-written zeroing may not). It acts on the DDP wrapper, which only a job of
several processes builds."""
from __future__ import annotations

from typing import Any

from .switch import RungSpec, Switch, WrapSwitch

FIELD = "gradient_as_bucket_view"


def view_options(on: bool) -> dict[str, Any]:
    return {FIELD: True} if on else {}          # off: DDP's own default (separate gradients)


def views_in_effect(wrapped: Any) -> bool:
    return bool(wrapped.gradient_as_bucket_view)


SWITCHES = (
    Switch((FIELD,),
           rungs=(RungSpec(FIELD, {FIELD: True}, place=73.7),),    # before the batch sizes, which change the math
           resumable=True,
           wrap=WrapSwitch(FIELD, strategies=("ddp",), options=view_options, state=views_in_effect, keyword=FIELD,
                           show=bool),
           frameworks={"lightning": "DDPStrategy(gradient_as_bucket_view=True), the Trainer's DDP strategy",
                       "accelerate": "DistributedDataParallelKwargs(gradient_as_bucket_view=True) among "
                                     "kwargs_handlers"},
           unreachable={"transformers": "Trainer builds its DDP from TrainingArguments, which has no setting for it "
                                        "(ddp_bucket_cap_mb is its only bucket setting)"}),
)
