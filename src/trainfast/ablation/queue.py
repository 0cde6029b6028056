"""A ladder's queue of runs: each entry a rung, its repeat (or seed) index and its timing budget (None: a baseline's
accuracy-only seed), interleaved pass by pass so that a drift of the machine falls on every rung alike; the runs of
rungs added after the ladder started (a script's own ladder, rungs a time budget put back) join it the same way."""
from __future__ import annotations

from ..results import Rung, Status
from .rung import TimingBudget


def run_key(rung: Rung, index: int) -> str:
    """A run's name in the ladder's store and folder: its rung and its repeat (or seed) index."""
    return f"{rung.name}-r{index}"


def queue_with_added(queue: list[tuple[Rung, int, TimingBudget | None]], added: list[Rung], base: Rung,
                     repeats: int, budget: TimingBudget) -> list[tuple[Rung, int, TimingBudget | None]]:
    """The queue with the added rungs' runs: each pass's run of every added rung right after the baseline's run of
    that pass, still queued; the passes whose baseline run is over get theirs first."""
    queued = {i for r, i, b in queue if r is base and b is not None}
    runs = [(r, i, budget) for i in range(repeats) if i not in queued for r in added]
    for entry in queue:
        runs.append(entry)
        if entry[0] is base and entry[2] is not None:
            runs += [(r, entry[1], entry[2]) for r in added]
    return runs


def kept_in_cut(entry: tuple[Rung, int, TimingBudget | None], base: Rung, repeats: int, seeds: int) -> bool:
    """Whether a queued run survives the time budget's cut: a repeat within `repeats` of a rung not skipped, or a
    baseline seed within `seeds`."""
    rung, index, budget = entry
    if rung.status == Status.SKIPPED:
        return False
    return index < repeats or (rung is base and budget is None and index < seeds)


def take_added_rungs(ladder) -> None:
    """After a run of `ladder` (a LadderRun): rungs the work put in the plan (work.py: a script's default ladder,
    grown by what can reach it or replaced by its task's) join every pass not yet over, each run queued right after
    the baseline's run of its pass, so they stay interleaved with it like the planned rungs; rungs it took out leave
    the queue."""
    kept = {id(r) for r in ladder.plan}
    ladder.queue = [entry for entry in ladder.queue if id(entry[0]) in kept]
    ladder.measured = [r for r in ladder.measured if id(r) in kept]
    known = {id(r) for r in ladder.measured}
    added = [r for r in ladder.plan if id(r) not in known and r.status != Status.NO_EFFECT]
    if not added:
        return
    ladder.measured += added
    ladder.queue = queue_with_added(ladder.queue, added, ladder.plan[0], ladder.repeats, ladder.opts.budget)
    if ladder.aim is not None:            # the baseline's runs still first: they set the target and the cap
        ladder.queue = ladder.aim.order(ladder.queue)
