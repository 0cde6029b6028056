"""The search's one clock: the seconds it was given, what is left of them, and how a stage's share is priced."""
from __future__ import annotations

import time
from typing import Callable

from ..ablation.clock import RunClock
from ..recipe import RecipeError
from ..results import Rung, Status
from .switches import is_level

# With a precision level to try, stage 1 may spend at most this share of the budget: the rest is kept for
# stage 1b, the switches on top of the level, which is the recipe the user will run. Priced by the fp32
# baseline, stage 1 alone would otherwise take a tight budget whole (ResNet-18 at 128 on photos, 12 min:
# the fp32 singles of decode_cache, channels_last, compile and fused were cut and never judged anywhere).
SINGLES_SHARE = 0.5
# Passes added to settle a stage's verdicts may take it up to this share of the budget left when it starts
# (the last stage: all of it), so the stages after it keep theirs.
SETTLE_SHARE = 0.5


def parse_budget(text: str) -> float:
    """'600', '600s', '10m', '1h' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    value = text.strip().lower()
    try:
        seconds = float(value[:-1]) * units[value[-1]] if value and value[-1] in units else float(value)
    except ValueError:
        raise RecipeError(f"--budget {text!r}: a time like 600, 600s, 10m or 1h") from None
    if not seconds > 0:
        raise RecipeError(f"--budget {text!r} must be positive")
    return seconds


def process_started() -> float:
    """When this process started, on time.monotonic()'s clock: a command's --budget counts the interpreter's start
    and its imports (torch's take seconds on 2 cores) too, as the clock of the person who gave it does."""
    import psutil

    return time.monotonic() - max(0.0, time.time() - psutil.Process().create_time())


def singles_share(singles: list[Rung]) -> float:
    """The share of the budget stage 1 may spend: SINGLES_SHARE when a precision level and another switch
    are both to be run (stage 1b may follow), else all of it."""
    live = [r for r in singles[1:] if r.status != Status.NO_EFFECT]
    levels = [r for r in live if is_level(r)]
    return SINGLES_SHARE if levels and len(levels) < len(live) else 1.0


class SearchBudget(RunClock):
    """The seconds the whole search may take, counted from when it started: every stage is priced against
    what is left, so a stage that ran long leaves the later ones less, never more than the total. The one pricing
    object of the search (ablation/clock.py: RunClock): each stage's ladder runs on a part of it, so every run is
    priced by the runs measured before it (its own recipe's, in any stage) and started only if it fits."""

    def __init__(self, total_s: float, now: Callable[[], float] = time.monotonic) -> None:
        # The search's own outputs (tune.md, tune.json, best.yaml) are written after its last stage: kept in hand as a
        # ladder's report, measured at every stage's close (clock.py), which writes more (charts, results.json).
        super().__init__(total_s, now, reserve=lambda: self.fixed_price("report") or 0.0)

    def fits_runs(self, runs: float, per_run: float, left: float | None = None) -> bool:
        """Whether a stage of `runs` runs of ~`per_run` seconds fits in what is left (or in `left`), beside its
        ladder's fixed costs (its open, close and report, as the stages before it measured them: clock.py), so no
        stage starts that could pay for its fixed costs and nothing more."""
        return self.fits(runs * per_run + self.ladder_fixed_s(), left)

    @staticmethod
    def allowance(share: float, credit_s: float, left: float) -> float:
        """The seconds a stage may take: `share` of the `left` it starts with, plus `credit_s`, what its
        runs so far took when it is resumed (its plan prices them like the runs still to come)."""
        return share * left + credit_s

    @staticmethod
    def settle_s(allowed: float, credit_s: float, left: float, last: bool) -> float:
        """The seconds within which a stage may add passes to settle its verdicts: SETTLE_SHARE of the `left`
        it starts with (all of it in the last stage), so later stages keep their time, and never beyond its
        allowance."""
        return min(allowed, (left if last else SETTLE_SHARE * left) + credit_s)
