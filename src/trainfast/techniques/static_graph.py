"""DDP's static graph: the job promises that every step uses the same parameters in the same graph, so
DistributedDataParallel learns from the first step which parameters are used and the order their gradients arrive
in, rebuilds its buckets once in that order, and stops searching the graph for unused parameters each step. It pays
where a model would otherwise need find_unused_parameters (a traversal of the autograd graph every step) and lets
reentrant activation checkpointing run under DDP. The arithmetic is the same. What it costs: a model whose forward
takes a different path from one step to the next (a branch on the data, a layer skipped) breaks the promise, and
DDP then fails or reduces the wrong gradients. It acts on the DDP wrapper, which only a job of several processes
builds."""
from __future__ import annotations

from typing import Any

from .switch import RungSpec, Switch, WrapSwitch

FIELD = "static_graph"


def graph_options(on: bool) -> dict[str, Any]:
    return {FIELD: True} if on else {}          # off: DDP's own default (the graph may change)


def graph_in_effect(wrapped: Any) -> bool:
    return bool(wrapped.static_graph)


SWITCHES = (
    Switch((FIELD,),
           rungs=(RungSpec(FIELD, {FIELD: True}, place=73.8),),    # with the other DDP switches, before the batch sizes
           resumable=True,
           wrap=WrapSwitch(FIELD, strategies=("ddp",), options=graph_options, state=graph_in_effect, keyword=FIELD,
                           trainer_argument="ddp_static_graph", show=bool),
           frameworks={"transformers": "TrainingArguments.ddp_static_graph",
                       "lightning": "DDPStrategy(static_graph=True), the Trainer's DDP strategy",
                       "accelerate": "DistributedDataParallelKwargs(static_graph=True) among kwargs_handlers"}),
)
