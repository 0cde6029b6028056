"""The doctor's checks: each one reads the run's Observations (what the doctor measured, doctor/) and returns one
Finding: a status, the evidence behind it, the time it costs per step where that was measured, and the one
fix (a Recipe flag where one exists). A check that cannot run on this device says "not checked here",
never "0 ms" or "fine".

Statuses: "problem" (fix it), "fine" (checked, nothing wrong), "measured" (a number to know, not a fault:
the compute rate, the memory headroom), "not checked here" (this device, this loop or this recipe cannot
show it; the evidence says why). Findings are ranked problems first, by the time their fix would save.
"""
from __future__ import annotations

from typing import Callable

from . import compute, environment, evaluation, loader, loop, ranks, switches, syncs, text
from .compute import page_faults, untimed
from .findings import INPUT_BOUND_SHARE, MATERIAL_SHARE, NOT_HERE, SWITCH, Finding, Observations
from .loader import bound
from .syncs import sync_fix

__all__ = ["CHECKS", "INPUT_BOUND_SHARE", "MATERIAL_SHARE", "NOT_HERE", "SWITCH", "Finding", "Observations", "bound",
           "page_faults", "rank", "run_checks", "sync_fix", "untimed"]

# Every check, in the order a report lists findings of equal rank: the machine, where the time goes, then the
# mistakes in the loop.
CHECKS: tuple[Callable[[Observations], Finding | None], ...] = (
    environment.environment, environment.other_processes,
    loader.data_wait, syncs.syncs, compute.compute, compute.memory, compute.page_faults, compute.launch_bound,
    compute.compile_graphs, ranks.straggler,
    evaluation.eval_dropout, evaluation.eval_graph, evaluation.eval_mode,
    loop.host_copies, loop.zero_grad, loop.data_parallel, loop.cudnn_shapes, loader.num_workers,
    text.padding, text.attention_backend, *switches.SWITCH_CHECKS,
)


def run_checks(obs: Observations) -> list[Finding]:
    """Every check's finding; a check with nothing to say about this kind of run (padding, where no batch is
    padded) returns None and is left out."""
    return rank([f for f in (fn(obs) for fn in CHECKS) if f is not None])


def rank(findings: list[Finding]) -> list[Finding]:
    """Problems first, the costliest first (unmeasured costs after measured ones), then the rest."""
    order = {"problem": 0, SWITCH: 0.5, "measured": 1, "fine": 2, NOT_HERE: 3}
    return sorted(findings, key=lambda f: (order.get(f.status, 4), -(f.cost_s or 0.0), f.cost_s is None))
