"""A distributed run's ranks: the slowest one named with the phase that makes it slow, or that none is
(measure/ranks.py judges; the doctor gathers the figures: doctor/ranks.py)."""
from __future__ import annotations

from ..measure.ranks import straggler_line
from .findings import Finding, Observations

FIXES = {"data": "give that rank's loader what the others have (workers, a local copy of the data, a core of its own): "
                 "every rank waits for its batches at each gradient all-reduce",
         "compute": "even the work per rank (the same batch shapes on every rank) or move it off a busier or slower "
                    "device: every rank waits for its compute at each gradient all-reduce"}


def straggler(obs: Observations) -> Finding | None:
    """None for a run of one process: there is no other rank to compare with."""
    judged = obs.ranks
    if not judged or judged.get("spread") is None:
        return None
    found = judged.get("straggler")
    step = obs.step_s
    if found is None:
        return Finding("a slow rank", "time", "fine", straggler_line(judged))
    cost = found["excess_s"]
    return Finding("a slow rank", "time", "problem", straggler_line(judged), cost, cost / step if step else None,
                   FIXES[found["phase"]])
