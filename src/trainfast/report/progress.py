"""A long job's progress: runs done of runs planned, and the time left, estimated from the runs measured so far.

One object (RunPlan) for every command that runs a list of things one after another: the ablation's runs (and so
the tune's stages, each a ladder), the selfcheck's checks. The command says what its plan is now (`plan`, with why
when it changed: a pass added for verdicts within the noise, a settling pass, a target's seeds, a cut to the time
budget) and what each run took (`finished`); the display asks for the line to show (`line`).

The estimate: a planned run costs what the runs of its kind took so far (their mean: the kind is its rung, and
whether the run is timed or only evaluated for the metric's noise); a kind not run yet costs what the other runs
of its sort took (timed or evaluated), else what its rung's other runs took, else the mean of every run so far.
After the first pass every rung has priced its own runs, and the rungs differ (a compiled rung's run costs its
compile; an fp32 run several bf16 ones), so the estimate then is the plan's own sum, not a count times an average.
Before the first run there is no estimate ("time left after the first of them"). What is known to come after the
planned runs is counted too: the job's close (an ablation's peak and reference workload timed again, its report
written: `close_s`) and the settling passes it expects (`settle_passes`: as many as end within the settle window,
each priced by its rungs' runs), so the time planned after the first pass is the time the job takes when verdicts
stay within the noise, as they mostly do on a busy CPU. "Up to" bounds what settling may add; every figure stops at
a time budget's end where one applies (`budget_left`). The prices come from one record
of costs, RunCosts, the one the ablation's time budget prices its runs by (ablation/clock.py, where the subject of
a cost is its recipe; here, its rung).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

SEEDS = "/seeds"        # a kind's suffix for a rung's runs that are only evaluated (the baseline's extra seeds)
TIMED = "timed"         # the sort of a rung's run without the suffix


@dataclass
class RunCosts:
    """What each run took, by its sort (`kind`: how it is measured) and its subject (`key`: a rung's name, a
    recipe's key), and what one more should cost: the mean of the runs most like it, most specific first: the same
    kind and subject, else the same kind, else the same subject, else every run. One record for the time left
    (RunPlan) and the time budget (ablation/clock.py's RunClock), so both price a run alike."""
    runs: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, kind: str, key: str, seconds: float) -> None:
        self.runs.setdefault((kind, key), []).append(float(seconds))

    def has(self, kind: str, key: str) -> bool:
        return bool(self.runs.get((kind, key)))

    def price(self, kind: str, key: str | None = None) -> float | None:
        """What one run of `kind` on `key` (None: any subject) should cost, or None: nothing measured yet."""
        tiers = (lambda k, r: k == kind and r == key, lambda k, r: k == kind,
                 lambda k, r: r == key, lambda k, r: True)
        for tier in tiers:
            seen = [s for (k, r), runs in self.runs.items() if tier(k, r) for s in runs]
            if seen:
                return statistics.fmean(seen)
        return None


def sort_of(kind: str) -> tuple[str, str]:
    """A planned run's kind ("amp", "baseline/seeds": report/progress's kinds) as RunCosts' (sort, rung)."""
    rung = kind.removesuffix(SEEDS)
    return (SEEDS if rung != kind else TIMED), rung


def seconds_text(seconds: float) -> str:
    """A duration as a person reads a time left: "40 s", "4 min", "1 h 05 min"."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


@dataclass
class RunPlan:
    """The runs still planned (their kinds, in order), what each finished one cost, and how the plan changed."""
    planned: list[str] = field(default_factory=list)
    costs: RunCosts = field(default_factory=RunCosts)
    done: int = 0
    changes: list[dict[str, Any]] = field(default_factory=list)
    planned_total_s: float | None = None     # elapsed + left once every planned kind had a cost of its own
    planned_up_to_s: float | None = None     # ... and the most it may take with the passes settling may add
    # Settling (--settle-within): passes may be added while a verdict is within the noise and another pass ends
    # within this many seconds of the start; (seconds, the kinds of one pass). The bound says how long that may go.
    settle: tuple[float, list[str]] | None = None
    clock: Callable[[], float] = time.monotonic
    noun: str = "runs"                       # what is counted: the ablation's runs, the selfcheck's checks
    planned_once: bool = False
    # The seconds a time budget leaves (its clock's `left`), or None: a plan that would run past them is stopped
    # there (a run starts only if its price fits), so the time left is never said as more than the budget's.
    budget_left: Callable[[], float] | None = None
    close_s: float = 0.0        # after the last run, known in advance (module docstring)
    settle_passes: int = 0      # the settling passes expected, at most (module docstring)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def plan(self, kinds: list[str], why: str | None = None) -> dict[str, Any] | None:
        """The runs not yet started, as the command now has them; a change in their number is recorded with `why`
        and returned (the display says it), the first plan excepted."""
        before, self.planned = len(self.planned), list(kinds)
        change = None
        if self.planned_once and len(kinds) != before:
            change = {"after_run": self.done, "runs": len(kinds) - before, "why": why or "the plan changed",
                      "total": self.total, "left_s": self.left_s(), "budget_stops": self.budget_stops()}
            self.changes.append(change)
        self.planned_once = True
        self.note_first_estimate()
        return change

    def finished(self, kind: str, seconds: float | None, repeat_s: float | None = None) -> None:
        """A run of `kind` is over, after `seconds` (None: read back from an earlier, interrupted job: no cost);
        `repeat_s`: what its repeats should take where that is known to differ (a compiled rung's first run paid a
        compile its repeats read from the cache), priced instead."""
        if kind in self.planned:
            self.planned.remove(kind)
        self.done += 1
        if seconds is not None:
            self.costs.add(*sort_of(kind), seconds if repeat_s is None else repeat_s)
        self.note_first_estimate()

    @property
    def total(self) -> int:
        return self.done + len(self.planned)

    def cost(self, kind: str) -> float | None:
        """What a run of `kind` is expected to take (module docstring), or None before any run."""
        return self.costs.price(*sort_of(kind))

    def runs_s(self) -> float | None:
        """The planned runs' seconds, or None while one of them cannot be priced."""
        costs = [self.cost(kind) for kind in self.planned]
        return None if None in costs else sum(costs)

    def passes_s(self) -> float:
        """The expected settling passes' seconds: of `settle_passes`, those that end within the settle window after
        the planned runs (a pass is added only then)."""
        runs = self.runs_s()
        if self.settle is None or not self.settle_passes or runs is None:
            return 0.0
        window, kinds = self.settle
        one_pass = sum(self.cost(k) or 0.0 for k in kinds)
        if one_pass <= 0:
            return 0.0
        fit = int(max(0.0, window - self.elapsed_s() - runs) // one_pass)
        return min(self.settle_passes, fit) * one_pass

    def left_s(self) -> float | None:
        runs = self.runs_s()
        if runs is None:
            return None
        return self.capped(runs + self.passes_s() + self.close_s)

    def capped(self, seconds: float) -> float:
        """`seconds`, never past the time budget's end where one applies."""
        return seconds if self.budget_left is None else min(seconds, max(0.0, self.budget_left()))

    def budget_stops(self) -> bool:
        """Whether the time budget ends the plan before its runs do (the runs past it will not start)."""
        runs = self.runs_s()
        return self.budget_left is not None and runs is not None and \
            runs + self.close_s > max(0.0, self.budget_left()) + 1.0

    def up_to_s(self) -> float | None:
        """The most the rest may take if settling adds passes: a pass is added only while it ends within the settle
        window, so the job ends by then, or one pass past the plan's own end, whichever is later, and its close;
        never past a time budget's end; None where nothing may be added or nothing is priced yet."""
        left = self.left_s()
        if self.settle is None or left is None:
            return None
        window, kinds = self.settle
        one_pass = sum(self.cost(k) or 0.0 for k in kinds)
        return self.capped(max(left, window + one_pass - self.elapsed_s() + self.close_s))

    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def note_first_estimate(self) -> None:
        """The planned time: the first estimate made with every planned kind priced by its own runs (after the
        first pass of an ablation), kept to set beside the time the job took."""
        if self.planned_total_s is None and self.planned and all(
                self.costs.has(TIMED, sort_of(k)[1]) for k in self.planned):
            self.planned_total_s = self.elapsed_s() + self.left_s()
            up_to = self.up_to_s()
            self.planned_up_to_s = self.elapsed_s() + up_to if up_to is not None else None

    def line(self) -> str:
        """"5 of 12 runs, ~3 min left" (the run about to start counted as the next one)."""
        left, up_to = self.left_s(), self.up_to_s()
        more = (f", up to ~{seconds_text(up_to)} if passes are added to settle verdicts"
                if up_to is not None and up_to > 1.1 * left + 5 else "")
        stops = ", where the time budget stops it" if self.budget_stops() else ""
        return (f"{min(self.done + 1, self.total)} of {self.total} {self.noun}, "
                + (f"~{seconds_text(left)} left{stops}{more}" if left is not None
                   else "time left after the first of them"))

    def change_line(self, change: dict[str, Any]) -> str:
        runs = change["runs"]
        left = change["left_s"]
        stops = " (the time budget stops it then)" if change.get("budget_stops") else ""
        return (f"plan: {'+' if runs > 0 else ''}{runs} run(s), {change['why']}: now {change['total']} {self.noun}"
                + (f", ~{seconds_text(left)} left{stops}" if left is not None else ""))

    def summary(self) -> dict[str, Any]:
        """What the finished job took beside what was planned (the report's line, results.json's settings)."""
        return {"total_s": self.elapsed_s(), "planned_s": self.planned_total_s, "planned_up_to_s": self.planned_up_to_s,
                "runs": self.done, "changes": self.changes}


def time_line(settings: dict[str, Any]) -> str | None:
    """The report's line: the time the ablation took beside the time planned after its first pass, and why they
    differ where the plan changed."""
    took = settings.get("time")
    if not took:
        return None
    text = f"The ablation took {seconds_text(took['total_s'])} for {took['runs']} runs"
    if took.get("planned_s") is not None:
        up_to = took.get("planned_up_to_s")
        text += (f" (planned after the first pass: {seconds_text(took['planned_s'])}"
                 + (f", up to {seconds_text(up_to)} with settling passes" if up_to and up_to > took["planned_s"] + 5
                    else "") + ")")
    changes = [f"{'+' if c['runs'] > 0 else ''}{c['runs']} run(s) after run {c['after_run']}: {c['why']}"
               for c in took.get("changes", [])]
    return text + (f"; the plan changed: {'; '.join(changes)}." if changes else ".")
