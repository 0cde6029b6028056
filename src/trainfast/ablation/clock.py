"""The one clock a ladder, and a search made of ladders, is priced by: the seconds given, what is left of them, and
what each kind of run has cost so far.

A run is priced by the runs already measured, most specific first: the same recipe's runs of the same kind (a
timed run, a baseline's accuracy-only seed, a run trained to a target), else any recipe's of that kind, else the
same recipe's of any kind, else any run's. A stage prices its plan this way before it starts, and the ladder prices
each run again before it starts it: a run is started only if its price fits in what is left. So a budget is kept
to within the one run whose true cost outran its price (the last one started), never more: an activation-
checkpointed rung that takes twice the baseline's time is priced by its own first run from then on, and a target
stage's extra seeds are each priced before they start.

A part (`part`) is a stage's share: its own deadline, never past its parent's, on the same clock and with the same
record of costs, so a later stage is priced by what the earlier ones measured.

Beside the runs, a ladder has fixed costs no run pays: its open (each precision's matmul peak and the machine's
reference workload, timed before the first run), its close (both timed again after the last run) and its report
(results.json, report.md, charts). Each is recorded as it happens (`spend_fixed`) and priced like a run
(`fixed_price`): a ladder keeps its close and report in hand when it prices a run, a search keeps a report's worth for
its own outputs, and a stage is started only where its fixed costs fit beside its runs. A failed run costs what it
took too: a run that fails after three minutes prices the next run of its recipe at three minutes, not at the
others' twenty seconds.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..report.progress import RunCosts


def recipe_key(recipe: Any) -> str:
    """A recipe as a price key: its fields without the seed (repeat i runs seed + i: the same cost)."""
    fields = recipe.to_dict() if hasattr(recipe, "to_dict") else {"recipe": str(recipe)}
    return json.dumps({k: v for k, v in fields.items() if k != "seed"}, sort_keys=True, default=str)


TARGET = "/target"       # a run kind's suffix for a run that stops at a target (--target)


def run_kind(measure: str, timed: bool = True, target: bool = False) -> str:
    """A run's kind for pricing: how it is measured ("speed" stops once timed, "full" trains to its end), whether it
    is timed (else a baseline's accuracy-only seed) and whether it stops at a target."""
    return measure + ("" if timed else "/seed") + (TARGET if target else "")


@dataclass
class RunClock:
    """Seconds given (`total_s`, None: no limit), counted from `started` on `now` (time.monotonic; a test's fake
    clock), and the measured cost of every run so far (`costs`, shared with every part; keyed by run_kind and
    recipe_key, priced as the progress display prices its runs: report/progress.RunCosts)."""
    total_s: float | None = None
    now: Callable[[], float] = time.monotonic
    started: float | None = None
    costs: RunCosts = field(default_factory=RunCosts)
    parent: "RunClock | None" = None
    # the fixed costs measured so far, by what they are ("open", "close", "report": module docstring), shared with
    # every part like `costs`
    fixed: dict[str, list[float]] = field(default_factory=dict)
    # seconds kept in hand for what comes after every part of this clock (a search's own outputs): `left` never
    # counts them
    reserve: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = self.now()

    def elapsed(self) -> float:
        return self.now() - self.started

    def left(self) -> float:
        """Seconds left: of this clock's own total and of every parent's, the fewer."""
        own = math.inf if self.total_s is None else self.total_s - self.elapsed()
        own -= self.reserve() if self.reserve is not None and math.isfinite(own) else 0.0
        return min(own, self.parent.left()) if self.parent is not None else own

    def fits(self, cost: float | None, left: float | None = None) -> bool:
        """Whether `cost` seconds fit in what is left (or in `left`, read once by a caller that asks more than once).
        An unpriced cost (None: nothing measured yet) fits while any time is left."""
        room = self.left() if left is None else left
        return room > 0 if cost is None else cost <= room

    def part(self, seconds: float | None) -> RunClock:
        """A stage's share from now: `seconds` (None: all that is left), never past this clock's own end."""
        return RunClock(seconds, self.now, None, self.costs, self, self.fixed)

    def spend(self, kind: str, recipe: Any, seconds: float) -> None:
        """A run of `kind` and `recipe` took `seconds`: later runs are priced by it."""
        self.costs.add(kind, recipe_key(recipe), seconds)

    def price(self, kind: str, recipe: Any = None) -> float | None:
        """What one run of `kind` and `recipe` should cost (module docstring), or None: nothing measured yet. A run to
        a target before any was measured: as a run of its measure without one (trained to its end, it is the nearest:
        a target run stops there at the latest, or at its cap), not as a timed run that stopped long before."""
        if kind.endswith(TARGET) and not any(k == kind for k, _ in self.costs.runs):
            nearest = kind.removesuffix(TARGET)
            kind = nearest if any(k == nearest for k, _ in self.costs.runs) else kind
        return self.costs.price(kind, recipe_key(recipe) if recipe is not None else None)

    def spend_fixed(self, what: str, seconds: float) -> None:
        """A fixed cost (module docstring: "open", "close", "report") took `seconds`: later ones are priced by it."""
        self.fixed.setdefault(what, []).append(float(seconds))

    def fixed_price(self, what: str) -> float | None:
        """What the next fixed cost of `what` should take (the mean of those measured), or None: none measured."""
        seen = self.fixed.get(what)
        return sum(seen) / len(seen) if seen else None

    def ladder_fixed_s(self) -> float:
        """A whole ladder's fixed costs as measured so far (its open, close and report; 0 for those not yet seen):
        what a stage costs beside its runs."""
        return sum(self.fixed_price(what) or 0.0 for what in ("open", "close", "report"))

    def price_runs(self, runs: list[tuple[str, Any]]) -> float | None:
        """The price of several runs, each (kind, recipe); None when none of them can be priced yet."""
        prices = [self.price(kind, recipe) for kind, recipe in runs]
        return sum(prices) if prices and None not in prices else None
