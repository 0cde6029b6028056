"""A ladder's time: the plan cut to a time budget after its first run, and each run priced and checked against the
ladder's part of its clock before it starts (clock.py), the ladder stopped where a price no longer fits."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..results import Rung, Status
from .clock import RunClock, recipe_key, run_kind
from .queue import queue_with_added


@dataclass
class Cut:
    """What the time budget cut from the plan, priced by the first run."""
    seconds_per_run: float
    rungs: int
    repeats: int
    asked: dict[str, int]
    skipped: list[str]
    # Where the ladder stopped because its next run's price no longer fitted: the runs left, their price, the time
    # left (LadderRun.stop); None: every run planned after the cut was run.
    stopped: dict[str, Any] | None = None
    # The rungs put back after the first pass, once every kept rung's own price was measured (LadderSpending.refit)
    restored: list[str] | None = None

    @property
    def trimmed(self) -> bool:
        return trimmed(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {"seconds_per_run": self.seconds_per_run, "rungs": self.rungs, "repeats": self.repeats,
                "asked": self.asked, "skipped": self.skipped, **({"stopped": self.stopped} if self.stopped else {}),
                **({"restored": self.restored} if self.restored else {})}


def trimmed(cut: dict[str, Any] | None) -> bool:
    """Whether a cut (a result's settings["budget_cut"]) left fewer repeats or rungs than asked: no pass is added
    to a ladder that could not even fit its plan."""
    return cut is not None and bool(cut["skipped"] or cut["repeats"] < cut["asked"]["repeats"] or cut.get("stopped"))


def fit_to_budget(rungs: int, repeats: int, per_run: float, seconds_left: float, seeds: int = 0,
                  done: int = 1) -> tuple[int, int]:
    """How many rungs (the plan's first ones, baseline included) and repeats fit `seconds_left` at `per_run`
    seconds a run, `done` of the plan's runs already paid for (the first, and a resumed ladder's runs its store
    holds: read back at no cost). Repeats go first, down to 2 (the fewest that give a
    process-to-process spread, so an interval); then the last rungs, down to 2 (a baseline and one rung).
    The plan's order is its priority: the precision levels, the largest gains, come first. Two rungs get 3
    repeats, not 2, when that many are asked for: at 2 the interval has one degree of freedom and no verdict.
    `seeds`: the runs every kept rung may need in all whatever its repeats (--target: the baseline's seeds, and
    those of a rung that changes the math, aim.py), counted so the plan leaves room for them."""
    floor = min(repeats, 2)
    runs_left = done + max(0.0, seconds_left) / max(per_run, 1e-9)   # the runs the budget pays for, those done included

    def runs(kept: int, each: int) -> int:
        return kept * max(each, seeds)

    fitted = next((r for r in range(repeats, floor - 1, -1) if runs(rungs, r) <= runs_left), None)
    if fitted is not None:
        return rungs, fitted
    fitted = floor
    kept = next((k for k in range(rungs, 2, -1) if runs(k, fitted) <= runs_left), 2)
    if kept == 2 and fitted == 2:
        # Two rungs twice leave the pooled noise one degree of freedom (t = 12.7 at 95%): even a 2x gain at 7%
        # noise is "no measurable difference". A third repeat (two degrees, t = 4.3) is what a verdict needs.
        fitted = min(repeats, 3)
    return kept, fitted


def cut_to_budget(measured: list[Rung], repeats: int, per_run: float, left: float, budget_s: float,
                  seeds: int = 0, done: int = 1) -> Cut:
    """The plan cut to the time budget (fit_to_budget): the rungs past those kept marked skipped, with why."""
    rungs_kept, repeats_kept = fit_to_budget(len(measured), repeats, per_run, left, seeds, done)
    for skipped in measured[rungs_kept:]:
        skipped.status = Status.SKIPPED
        skipped.reason = (f"would not fit the time budget ({budget_s:.0f} s at ~{per_run:.0f} s a run, "
                          f"{repeats_kept} repeats)")
    return Cut(per_run, rungs_kept, repeats_kept, {"rungs": len(measured), "repeats": repeats},
               [r.name for r in measured[rungs_kept:]])


def repeat_cost(result: dict[str, Any], seconds: float) -> float:
    """What another run of the same rung should take, from a first run of `seconds`: a compiled run's first run pays
    its compilation, which its repeats read from the shared compile cache (techniques/compile.py: a compiled
    ResNet-9's first step took 18 s, then 1.4 s), so the seconds its epoch took beyond its steps at their steady pace
    are left out of the price where they are most of the run (a cold compile: the default ResNet-9's 15 s of 21; one
    read from a warm cache costs ~2 s of 8, and its repeats pay that too); any other run: `seconds`."""
    timing = result.get("timing") or {}
    if not (result.get("compile") or {}).get("graphs") or not timing.get("timed_steps"):
        return seconds
    steady = (timing.get("timed_seconds") or 0.0) / timing["timed_steps"]
    extra = (result.get("epoch_time_s") or 0.0) - (result.get("steps_run") or 0) * steady
    return seconds - extra if extra > seconds - extra else seconds


class LadderSpending:
    """A ladder's time (clock.py): its part of the clock it is given (a search's: the costs its earlier stages
    measured), each run priced and checked before it starts with the ladder's close kept in hand, each run's cost
    recorded, and where it stopped."""

    def __init__(self, options: Any, measure: str) -> None:
        self.clock = (options.clock or RunClock()).part(options.time_budget_s)
        self.measure, self.aimed = measure, options.target is not None
        # the runs every kept rung may need whatever its repeats (--target: the baseline's seeds, a rung that changes
        # the math: aim.py); 0 without a target
        self.seeds = options.target_seeds if self.aimed else 0
        self.close_s: float | None = None   # the ladder's close (its ceilings measured again): as long as its start
        self.stopped = False        # a run's price no longer fitted: nothing more starts, no pass or seed is added
        self.why = ""

    @contextmanager
    def fixed(self, what: str) -> Iterator[None]:
        """A fixed cost of the ladder ("open", "close", "report"), timed on its clock and recorded (clock.py)."""
        began = self.clock.now()
        yield
        self.clock.spend_fixed(what, self.clock.now() - began)

    def kind(self, timed: bool) -> str:
        return run_kind(self.measure, timed, self.aimed)

    def affords(self, recipe, timed: bool) -> bool:
        """Whether the run's price fits, the ladder's close kept in hand (held_s)."""
        self.close_s = self.clock.elapsed() if self.close_s is None else self.close_s
        price = self.clock.price(self.kind(timed), recipe)
        return self.clock.fits(None if price is None else price + self.held_s())

    def held_s(self) -> float:
        """What the ladder's close will cost after its last run (clock.py): its ceilings and reference workload timed
        again and its report written, priced by the closes measured so far (an earlier stage's); before any, as
        long as its own start (close_s, read at its first run)."""
        close = self.clock.fixed_price("close")
        return (close if close is not None else self.close_s or 0.0) + (self.clock.fixed_price("report") or 0.0)

    def fits_s(self, seconds: float) -> bool:
        """Whether a run of `seconds` fits, the ladder's close kept in hand (a repeat, priced by its first run)."""
        return self.clock.fits(seconds + self.held_s())

    def spend(self, recipe, timed: bool, launch: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`launch`'s run, its cost recorded: the clock's, or the run's own wall time where the clock saw less (a
        faked run). A failed run's too: the next run of its recipe is priced by what this one took (a compile that
        failed after three minutes is not a twenty-second run)."""
        started = self.clock.now()
        result = launch()
        seconds = max(self.clock.now() - started, result.get("wall_time_s") or 0.0)
        self.clock.spend(self.kind(timed), recipe, seconds)
        return result

    def fit(self, measured: list[Rung], repeats: int, first: dict[str, Any], budget_s: float, held: int = 0) -> Cut:
        """The plan cut to the time budget, priced by the runs measured so far (plan_price), with the ladder's close
        kept in hand, and each run checked against the clock again before it starts. `held`: the queued runs a
        resumed ladder's store already holds, read back at no cost, so counted as done: a search's stage 1 gone on
        with the budget kept for stage 1b plans its new rungs with the time it has, not all its runs again (at
        100 s a run with 400 s left, the first four runs held, the two switches it had cut are judged; counted
        again, the same two rungs got a third repeat and the cut switches were never judged). --target: every kept
        rung may need `seeds` runs (the baseline's seeds, a rung that changes the math)."""
        per_run = self.plan_price(measured, first)
        left = min(budget_s - self.clock.elapsed(), self.clock.left()) - self.held_s()
        return cut_to_budget(measured, repeats, per_run, left, budget_s, self.seeds, 1 + held)

    def refit(self, ladder: Any) -> list:
        """`ladder`'s queue (a LadderRun's), with the rungs its cut skipped put back where they now fit: once its
        first pass is over (every kept rung's own price measured, the rungs it cut priced at their mean), in the
        plan's order, as many as the time left pays for beside the runs still queued and the ladder's close. The cut
        prices every run by the first (the baseline's, usually the dearest): where the others ran cheaper, the time
        they left judges the switches it cut instead of going unspent. Their runs join every pass (queue_with_added),
        the finished first pass's first. Done once; nothing where the ladder stopped."""
        cut, kind = ladder.cut, self.kind(True)
        if cut.restored is not None or any(i == 0 and b is not None for _, i, b in ladder.queue):
            return ladder.queue
        cut.restored = []
        priced = [self.clock.price(kind, r.recipe) for r in ladder.measured if r.repeats]
        skipped = [r for r in ladder.measured if r.status == Status.SKIPPED and r.name in cut.skipped]
        if self.stopped or not skipped or not priced:
            return ladder.queue
        mean = sum(priced) / len(priced)

        def price(rung: Rung) -> float:
            return self.clock.price(kind, rung.recipe) if self.clock.costs.has(kind, recipe_key(rung.recipe)) else mean

        # every kept rung's runs still to come, the seeds a target may add included (the cut counted them alike)
        runs = max(ladder.repeats, self.seeds)
        owed = [(r, max(runs, ladder.noise_seeds if r is ladder.plan[0] else 0) - len(r.repeats) - len(r.seed_runs))
                for r in ladder.measured if r.status not in (Status.SKIPPED, Status.FAILED)]
        room = self.clock.left() - self.held_s() - sum(max(0, n) * price(r) for r, n in owed)
        for rung in skipped:
            cost = runs * price(rung)
            if cost > room:
                break
            room -= cost
            rung.status, rung.reason = Status.PENDING, None
            cut.restored.append(rung.name)
        back = [r for r in skipped if r.name in cut.restored]
        cut.skipped = [name for name in cut.skipped if name not in cut.restored]
        cut.rungs += len(back)
        return queue_with_added(ladder.queue, back, ladder.plan[0], ladder.repeats, ladder.opts.budget)

    def plan_price(self, measured: list[Rung], first: dict[str, Any]) -> float:
        """One run of the plan, on average: each rung's own price where its recipe has runs of this kind measured (in
        this ladder or an earlier stage's), the first run's cost for the rungs not run yet (whole-process wall time:
        the baseline's, fp32, usually the slowest)."""
        kind = self.kind(True)
        first_s = max(first.get("wall_time_s") or 0.0, self.clock.price(kind, measured[0].recipe) or 0.0)
        prices = [self.clock.price(kind, r.recipe) if self.clock.costs.has(kind, recipe_key(r.recipe)) else first_s
                  for r in measured]
        return max(sum(prices) / len(prices), 1e-9) if prices else first_s

    def pass_price(self, measured: list[Rung], pass_times: dict[int, list[float]], within: float) -> float | None:
        """One more pass priced by its rungs' measured runs (else by the last pass's span), or None: it would not
        end within `within` seconds of the start, or not fit the time budget."""
        priced = self.clock.price_runs([(self.kind(True), r.recipe) for r in measured if r.measured])
        first, last = pass_times[max(pass_times)]
        pass_s = priced if priced is not None else last - first
        return pass_s if self.clock.elapsed() + pass_s <= within and self.fits_s(pass_s) else None

    def stop(self, ladder: Any, run: tuple[Rung, int, bool], display=None) -> None:
        """`run` (its rung, its index, timed or a seed) of `ladder` (a LadderRun) does not fit: its rung's runs leave
        the queue, and the ladder goes on with the runs still queued whose price fits (a cheaper rung's: the fp32
        baseline's run is often the dearest), else ends there, its queue emptied. No pass or seed is added after
        either. A rung that leaves with runs is scored on those, one without any is skipped; the cut (made here if
        the plan had none) says where it first stopped, at what price, with how much time left, how many runs were
        not run and which rungs went on; on the console too, where `display` shows."""
        measured, cut, repeats = ladder.measured, ladder.cut, ladder.repeats
        rung, index, timed = run
        dropped = 1 + sum(entry[0] is rung for entry in ladder.queue)
        ladder.queue = [entry for entry in ladder.queue if entry[0] is not rung]
        price = self.clock.price(self.kind(timed), rung.recipe)
        left = max(0.0, self.clock.left() - self.held_s())       # what the runs had: the close is kept in hand
        going_on = list(dict.fromkeys(r.name for r, _, b in ladder.queue if self.affords(r.recipe, b is not None)))
        if not going_on:
            dropped += len(ladder.queue)
            ladder.queue.clear()
        first = not self.stopped
        self.stopped = True
        self.why = (f"{dropped} run(s) left would not fit the time budget (~{price:.0f} s a run, {left:.0f} s left)"
                    if price is not None else f"{dropped} run(s) left would not fit the time budget (none left)")
        for r in measured if not going_on else [rung]:
            if r.status in (Status.PENDING, Status.PARTIAL, Status.RUNNING):
                r.status, r.reason = (Status.DONE, r.reason) if r.repeats else (Status.SKIPPED, self.why)
        cut = cut or Cut(price or 0.0, len(measured), repeats, {"rungs": len(measured), "repeats": repeats}, [])
        skipped = [r.name for r in measured if r.status == Status.SKIPPED and r.name not in cut.skipped]
        cut.skipped += skipped
        cut.rungs -= len(skipped)
        if first:
            cut.stopped = {"at": f"{rung.name}, run {index + 1}", "runs_left": dropped, "price_s": price,
                           "left_s": left, **({"went_on": going_on} if going_on else {})}
        else:
            cut.stopped["runs_left"] += dropped
        if display is not None and display.show:
            went = f"; going on with {', '.join(going_on)}, whose runs fit" if going_on else ""
            display.console.print(f"stopped before {rung.name} (run {index + 1}): {self.why}{went}")
        ladder.cut = cut
