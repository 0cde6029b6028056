"""The interleaved loop: one ablation's runs, for every kind of work alike (work.py).

Every rung runs `repeats` times, each in a fresh process, in interleaved passes (every rung once, then every
rung again; repeat i with seed + i in every rung), so a slow spell of the machine hits all rungs alike. Each
finished run is kept in the run store (an interrupted ablation resumes), the ladder is scored after every run
(scoring.py) and shown live; the report is written at the end (report/).

The loop owns its time: `LadderOptions.time_budget_s` cuts the plan to fit after the first run has priced
one (fewer repeats first, then the last rungs, counting the seeds the plan adds), every run is started only if
its price fits what is left (clock.py: priced by the runs measured so far, else the ladder stops and says so), and
`settle_within_s` adds passes while a verdict is one a rerun may not repeat, as long as another pass, priced by
its rungs' measured runs, ends within that many seconds of the start.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..defaults import MAX_REPEATS, SETTLE_WITHIN_S, parse_size  # the CLI shows them before torch loads
from ..measure import measure_ceiling
from ..procstate import process_cpu_seconds, reference_check
from ..recipe import RecipeError
from ..results import AblationResult, Rung, Status
from ..stats import MIN_EFFECT
from ..target import Target, TargetError, parse_target
from ..techniques.precision import DTYPES
from .metric import SCRIPT_CHOICE, MetricChoice, better, choose_metric, metric_goal
from .rung import TimingBudget
from .scoring import pick_best, score_rungs, seed_summary, unresolved
from .server import wait_rung_server
from .store import RunStore, write_json
from .aim import Aim
from .clock import RunClock, run_kind
from .target import TARGET_SEEDS, pick_soonest
from .work import Work



@dataclass(frozen=True)
class LadderOptions:
    """How a ladder is run and judged; checked when made, before any work starts.

    repeats: timed runs of every rung (interleaved). noise_seeds: baseline runs in all, the extra ones for
    accuracy only (the accuracy band's seed-to-seed noise). budget: steady steps each run is timed over.
    min_effect: a difference below it (a fraction) is never called a gain or a loss. rung_timeout: seconds
    a run may take (default: 10x the baseline's first run, at least 300 s). settle_within_s: passes added
    while a verdict is within the noise (None or 0: exactly `repeats`). time_budget_s: the seconds the whole
    ladder may take (the first run prices the rest; the plan is cut to fit). paired: the built-in work's timed runs
    are also timed against the baseline inside their own processes (paired.py); False (default): compared across
    processes only. memory_limit: bytes (or "2GiB"): a rung whose peak is over it (measure.memory.limit_peak) is
    measured and shown, never recommended."""
    mode: str = "cumulative"
    repeats: int = 3
    noise_seeds: int = 3
    budget: TimingBudget = field(default_factory=TimingBudget)
    min_effect: float = MIN_EFFECT
    resume: bool = False
    rung_timeout: float | None = None
    show: bool = True
    settle_within_s: float | None = SETTLE_WITHIN_S
    time_budget_s: float | None = None
    paired: bool = False
    memory_limit: int | str | None = None
    # --target (target.py): every run records its curve and stops at the target; each rung is judged on its time to
    # target beside its rate (ablation/target.py). A string as written ("val_loss<=3.2", "auto") or a Target.
    target: str | Target | None = None
    # The clock the ladder's time budget is a share of (clock.RunClock: a search's, with the costs its earlier
    # stages measured); None: a clock of its own.
    clock: RunClock | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "target", parse_target(self.target))
        except TargetError as exc:
            raise RecipeError(str(exc)) from None
        if self.memory_limit is not None:           # bytes, or a size as written ("2GiB")
            try:
                object.__setattr__(self, "memory_limit", parse_size(self.memory_limit))
            except ValueError as exc:
                raise RecipeError(f"--memory-limit {exc}") from None
        for flag, value in (("--noise-seeds", self.noise_seeds), ("--repeats", self.repeats)):
            check_positive_int(flag, value)
        if self.rung_timeout is not None and not self.rung_timeout > 0:
            raise RecipeError(f"--rung-timeout {self.rung_timeout!r} must be a positive number of seconds")
        if not 0 <= self.min_effect < 1:
            raise RecipeError(f"--min-effect {self.min_effect!r} must be a fraction in [0, 1), e.g. 0.05 for 5%")


def check_positive_int(flag: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RecipeError(f"{flag} {value!r} must be a positive integer")


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

    @property
    def trimmed(self) -> bool:
        return trimmed(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {"seconds_per_run": self.seconds_per_run, "rungs": self.rungs, "repeats": self.repeats,
                "asked": self.asked, "skipped": self.skipped, **({"stopped": self.stopped} if self.stopped else {})}


def trimmed(cut: dict[str, Any] | None) -> bool:
    """Whether a cut (a result's settings["budget_cut"]) left fewer repeats or rungs than asked: no pass is added
    to a ladder that could not even fit its plan."""
    return cut is not None and bool(cut["skipped"] or cut["repeats"] < cut["asked"]["repeats"] or cut.get("stopped"))


def fit_to_budget(rungs: int, repeats: int, per_run: float, seconds_left: float, seeds: int = 0) -> tuple[int, int]:
    """How many rungs (the plan's first ones, baseline included) and repeats fit `seconds_left` at `per_run`
    seconds a run, one run (the first) already done. Repeats go first, down to 2 (the fewest that give a
    process-to-process spread, so an interval); then the last rungs, down to 2 (a baseline and one rung).
    The plan's order is its priority: the precision levels, the largest gains, come first. Two rungs get 3
    repeats, not 2, when that many are asked for: at 2 the interval has one degree of freedom and no verdict.
    `seeds`: the runs every kept rung may need in all whatever its repeats (--target: the baseline's seeds, and
    those of a rung that changes the math, aim.py), counted so the plan leaves room for them."""
    floor = min(repeats, 2)
    runs_left = 1 + max(0.0, seconds_left) / max(per_run, 1e-9)      # the runs the budget pays for, the first included

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
                  seeds: int = 0) -> Cut:
    """The plan cut to the time budget (fit_to_budget): the rungs past those kept marked skipped, with why."""
    rungs_kept, repeats_kept = fit_to_budget(len(measured), repeats, per_run, left, seeds)
    for skipped in measured[rungs_kept:]:
        skipped.status = Status.SKIPPED
        skipped.reason = (f"would not fit the time budget ({budget_s:.0f} s at ~{per_run:.0f} s a run, "
                          f"{repeats_kept} repeats)")
    return Cut(per_run, rungs_kept, repeats_kept, {"rungs": len(measured), "repeats": repeats},
               [r.name for r in measured[rungs_kept:]])


def ceiling(work: Work, precision: str) -> float:
    """The roof a rung of this precision is measured against: the matmul peak in its dtype, TF32 for an fp32
    run whose kernels run in TF32 (measure.runs_tf32: a conv net on CUDA by default)."""
    return measure_ceiling(work.dev, DTYPES[precision], tf32=fp32_roof_is_tf32(work) and precision == "fp32")


def fp32_roof_is_tf32(work: Work) -> bool:
    return bool(work.settings.get("fp32_roof") == "tf32")


class LadderMetric:
    """The metric a ladder's runs are judged on, one for the whole ladder: the work's (name, goal), read against
    the plan (its baseline's runs) and the ladder's settings."""

    def __init__(self, metric: Callable[[], tuple[str | None, str | None]], plan: list[Rung],
                 settings: dict[str, Any]) -> None:
        self.metric, self.plan, self.settings = metric, plan, settings

    def choice(self) -> MetricChoice | None:
        """The metric every run is judged on (metric.choose_metric), one for the whole ladder: a script's own
        choice is read from the baseline's first finished run, so every rung is compared on the same name. Asked
        of the work when needed: a script's first run may change it (a token script's runs, timed whole, are
        judged on its metric in speed mode too)."""
        key, goal = self.metric()
        if key is None:
            return None
        if key == SCRIPT_CHOICE:
            runs = self.plan[0].repeats + self.plan[0].seed_runs
            return choose_metric(None, goal, runs[0] if runs else None)
        if self.settings.get("command"):
            return choose_metric(key, goal, None)
        goal = goal or metric_goal(key)
        return MetricChoice(key, goal, f"the task's metric on held-out data, {better(goal)}")

    def judged_metric(self) -> dict[str, Any] | None:
        """The metric every rung is judged on, by name, with its goal and why that metric: the task's (accuracy, mAP,
        validation loss: settings' metric_name), or a script's (metric.py); None when runs are only timed."""
        choice = self.choice()
        if choice is None:
            return None
        name = choice.name if self.settings.get("command") else self.settings.get("metric_name") or choice.name
        return {**choice.to_dict(), "name": name}


class Launches:
    """Where a ladder's runs come from, and the machine they run on: a finished run read back from the run store
    (an interrupted ablation resumed) or launched in its own folder and kept there; each precision's matmul ceiling
    (a peak: measured before the runs and again after, the higher kept, so a slow spell on a shared machine at the
    start puts no rung "above" it); the machine's reference check before and after (procstate.reference_check),
    and what this process (display, event relay) took from the cores the runs use while they ran."""

    def __init__(self, work: Work, launch: Callable, out_dir: Path) -> None:
        self.work, self.launch, self.out_dir = work, launch, out_dir
        self.store: RunStore | None = None
        self.ceilings: dict[str, float] = {}
        self.machine: dict[str, Any] = {}       # procstate.reference_check before and after the runs
        self.in_runs = (0.0, 0.0)               # this process's CPU seconds while runs ran, and those seconds

    def start(self, settings: dict[str, Any], resume: bool, precisions: list[str]) -> None:
        self.store = RunStore(self.out_dir, settings, resume)
        wait_rung_server()
        self.ceilings.update({p: ceiling(self.work, p) for p in dict.fromkeys(precisions)})
        self.machine["start"] = reference_check(self.work.dev)

    def read_back(self, key: str) -> dict[str, Any] | None:
        return self.store.load(key)

    def run(self, key: str, rung: Rung, recipe, budget: TimingBudget | None, display, limit: float | None
            ) -> dict[str, Any]:
        """The run launched in its own folder (its recipe beside its log), kept in the store unless it failed."""
        run_dir = self.out_dir / "rungs" / key
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "recipe.json", recipe.to_dict())
        cpu, started = process_cpu_seconds(), time.monotonic()
        result = self.launch(rung, recipe, budget, run_dir, display, limit)
        self.in_runs = (self.in_runs[0] + process_cpu_seconds() - cpu, self.in_runs[1] + time.monotonic() - started)
        if "error" not in result:
            self.store.save(key, result)
        return result

    def finish(self) -> None:
        """After the last run: the ceilings measured again, the machine checked again, this process's share."""
        self.ceilings.update({p: max(c, ceiling(self.work, p)) for p, c in self.ceilings.items()})
        self.machine["end"] = reference_check(self.work.dev)
        cpu, seconds = self.in_runs
        self.machine["parent_cpu_share"] = cpu / seconds if seconds else None


class LadderRun:
    """One ladder's runs (module docstring). `run()` returns the scored result and writes the report folder;
    on Ctrl-C it writes the partial report and raises KeyboardInterrupt (resume with the same out_dir)."""

    def __init__(self, plan: list[Rung], work: Work, settings: dict[str, Any], out_dir: Path,
                 options: LadderOptions, measure: str = "speed") -> None:
        self.plan, self.work, self.settings, self.out_dir, self.opts = plan, work, settings, out_dir, options
        self.spending = LadderSpending(options, measure)      # its clock: every run priced before it starts
        pair_against = getattr(work, "pair_against", None)      # the built-in work can pair; a command cannot
        if options.paired and pair_against is not None:
            pair_against(plan[0].recipe)
        self.launches = Launches(work, work.launcher(measure), out_dir)
        self.ceilings = self.launches.ceilings          # each precision's roof (Launches), filled as the runs start
        self.metric = LadderMetric(lambda: work.metric(measure), plan, settings)
        self.after_run = work.after_run(plan)
        self.repeats, self.noise_seeds = options.repeats, options.noise_seeds
        self.measured = [r for r in plan if r.status != Status.NO_EFFECT]
        # Interleaved: repeat 0 of every rung, then repeat 1 of every rung, ...; the baseline's extra seeds last.
        self.queue = [(rung, i, options.budget) for i in range(self.repeats) for rung in self.measured]
        # --target: the baseline's seeds number at least TARGET_SEEDS (its samples to target, its seed band), and
        # its runs go first (aim.py)
        self.aim = (Aim(options.target, plan, work, self.metric.choice, options.min_effect)
                    if options.target is not None else None)
        if self.aim is not None:
            self.noise_seeds = max(self.noise_seeds, TARGET_SEEDS)
        self.queue += [(plan[0], i, None) for i in range(self.repeats, self.noise_seeds)]
        if self.aim is not None:
            self.queue = self.aim.order(self.queue)
        self.next_index = max(self.repeats, self.noise_seeds)
        self.seed_runs: list[dict[str, Any]] = []
        self.cut: Cut | None = None
        self.pass_times: dict[int, list[float]] = {}    # repeat index -> [start, end] of that pass's timed runs
        self.added: list[dict[str, Any]] = []           # the passes settling added, and why
        self.started = self.spending.clock.started

    def run(self) -> AblationResult:
        from ..report import Display, environment

        self.launches.start(self.settings, self.opts.resume, [r.recipe.precision for r in self.measured])
        self.spending.close_s = self.spending.clock.elapsed()     # its close measures them again: kept in hand
        env = environment(self.work.dev)
        display = Display(self.plan, self.ceilings, env, show=self.opts.show, settings=self.settings)
        interrupted = False
        with display:
            try:
                while self.queue or self.add_pass() or self.add_seeds():
                    self.run_next(display)
                    self.rescore()
                    display.metric = self.metric.judged_metric()
                    display.update()
            except KeyboardInterrupt:
                interrupted = True
            if not interrupted:
                self.launches.finish()
            for rung in self.plan:
                if rung.status == Status.PARTIAL and interrupted:
                    rung.status = Status.DONE        # a partial report still shows what was measured
            self.rescore()
        result = self.result(env)
        display.final(result, interrupted)
        if interrupted:
            raise KeyboardInterrupt
        return result

    def run_next(self, display) -> None:
        """The next run of the queue: read back from the store, or launched; its rung updated."""
        rung, i, budget = self.queue.pop(0)
        if rung.status in (Status.NO_EFFECT, Status.SKIPPED):     # no-effect: found out by an earlier run
            return
        recipe = rung.recipe.replace(seed=rung.recipe.seed + i)
        key = f"{rung.name}-r{i}"
        timed = budget is not None          # a timed repeat; else a baseline's accuracy-only seed
        result = self.launches.read_back(key)
        if result is None and not self.spending.affords(rung.recipe, timed):    # the ladder ends here
            self.cut = self.spending.stop(self.measured, self.cut, self.repeats, (rung, i, timed), self.queue, display)
            return
        if timed:
            self.pass_times.setdefault(i, [self.spending.clock.now(), 0.0])
        if result is None:
            rung.status = Status.RUNNING
            display.start_rung(rung, recipe.seed, len(rung.repeats) + 1 if timed else i + 1,
                               self.repeats if timed else self.noise_seeds)
            result = self.spending.spend(rung.recipe, timed, lambda: self.launches.run(
                key, rung, recipe, budget, display, rung_time_limit(self.opts, self.plan[0])))
        else:
            display.reused(rung, i)
        if "error" in result:
            rung.fail(result["error"], result.get("log_tail", ""))
        elif rung.status != Status.FAILED:
            (rung.repeats if timed else rung.seed_runs).append(result)
            rung.status = Status.DONE if len(rung.repeats) == self.repeats else Status.PARTIAL
        if timed:
            self.pass_times[i][1] = self.spending.clock.now()
        if self.after_run is not None:
            self.after_run(rung, result)
            self.take_added_rungs()
        if self.aim is not None:
            self.aim.after_run(self.queue)
        if self.opts.time_budget_s is not None and self.cut is None and "error" not in result:
            self.fit_budget(result)

    def take_added_rungs(self) -> None:
        """Rungs the work put in the plan after a run (work.py: a script's default ladder, grown by what can reach
        it or replaced by its task's) join every pass not yet over, each run queued right after the baseline's run
        of its pass, so they stay interleaved with it like the planned rungs; rungs it took out leave the queue."""
        kept = {id(r) for r in self.plan}
        self.queue = [entry for entry in self.queue if id(entry[0]) in kept]
        self.measured = [r for r in self.measured if id(r) in kept]
        known = {id(r) for r in self.measured}
        added = [r for r in self.plan if id(r) not in known and r.status != Status.NO_EFFECT]
        if not added:
            return
        self.measured += added
        self.queue = queue_with_added(self.queue, added, self.plan[0], self.repeats, self.opts.budget)
        if self.aim is not None:            # the baseline's runs still first: they set the target and the cap
            self.queue = self.aim.order(self.queue)

    def fit_budget(self, first: dict[str, Any]) -> None:
        """After the first run: the plan cut to the time budget (LadderSpending.fit)."""
        self.cut = self.spending.fit(self.measured, self.repeats, first, self.opts.time_budget_s)
        # --target: the baseline keeps its TARGET_SEEDS seeds (its samples to target, its band, every interval)
        self.repeats, self.noise_seeds = self.cut.repeats, max(self.cut.repeats, TARGET_SEEDS if self.aim else 0)
        self.queue = [e for e in self.queue if kept_in_cut(e, self.plan[0], self.repeats, self.noise_seeds)]

    def add_pass(self) -> bool:
        """Queue one more pass of every measured rung, if a verdict is unsettled or a gain unresolved and the
        pass fits settle_within_s; whether one was queued."""
        self.queue = self.another_pass()
        return bool(self.queue)

    def add_seeds(self) -> bool:
        """--target: queue the seeds a rung that changed the math still needs (aim.py); whether any were."""
        if self.aim is None or self.spending.stopped:
            return False
        self.queue = self.aim.seeds(self.next_index)
        self.next_index = max([self.next_index - 1, *(i for _, i, _ in self.queue)]) + 1
        return bool(self.queue)

    def another_pass(self) -> list[tuple[Rung, int, TimingBudget]]:
        """The runs of one more pass (add_pass), or none."""
        shaky = [r.name for r in self.plan[1:]
                 if r.measured and (r.result.unsettled or unresolved(r, self.opts.min_effect))]
        settle = self.opts.settle_within_s
        if (not settle or self.spending.stopped or (self.cut is not None and self.cut.trimmed) or not shaky
                or self.repeats >= MAX_REPEATS or not self.pass_times):
            return []
        first, last = self.pass_times[max(self.pass_times)]
        if (pass_s := self.spending.pass_price([r.recipe for r in self.measured if r.measured], last - first,
                                               settle)) is None:
            return []
        self.added.append({"repeat": self.repeats + 1, "unsettled": shaky, "pass_s": pass_s})
        self.repeats += 1
        extra = [(r, self.next_index, self.opts.budget) for r in self.measured if r.measured]
        for r, _, _ in extra:
            r.status = Status.PARTIAL
        self.next_index += 1
        return extra

    def rescore(self) -> None:
        base = self.plan[0]
        choice = self.metric.choice()
        metric = (choice.name, choice.goal) if choice is not None else (None, None)
        self.seed_runs = [seed_summary(r, metric[0]) for r in base.repeats + base.seed_runs]
        score_rungs(self.plan, self.ceilings, [s["metric"] for s in self.seed_runs], self.work.flops_per_sample,
                    self.opts.mode, self.opts.min_effect, metric)
        if self.aim is not None:
            self.aim.score()

    def result(self, env: dict[str, Any]) -> AblationResult:
        """The scored ladder, its recommendation and the settings as run (cut and settled), report written."""
        from ..report import write_report

        best, tie, odds = pick_best(self.plan, self.opts.min_effect, self.opts.memory_limit)
        if self.aim is not None and self.aim.target.known:      # judged on time to target, not on rate
            best, tie, odds = pick_soonest(self.plan, self.opts.memory_limit), [], {}
        result = AblationResult(self.plan, env, self.out_dir, best.recipe if best else None,
                                best.name if best else None, self.ceilings, self.seed_runs, tie, settings_as_run(self),
                                odds, self.metric.judged_metric())
        write_report(result)
        return result


class LadderSpending:
    """A ladder's time (clock.py): its part of the clock it is given (a search's: the costs its earlier stages
    measured), each run priced and checked before it starts with the ladder's close kept in hand, each run's cost
    recorded, and where it stopped."""

    def __init__(self, options: LadderOptions, measure: str) -> None:
        self.clock = (options.clock or RunClock()).part(options.time_budget_s)
        self.measure, self.aimed = measure, options.target is not None
        self.close_s = 0.0          # what the ladder's close takes (its ceilings measured again): as long as its start
        self.stopped = False        # a run's price no longer fitted: nothing more starts, no pass or seed is added
        self.why = ""

    def kind(self, timed: bool) -> str:
        return run_kind(self.measure, timed, self.aimed)

    def affords(self, recipe, timed: bool) -> bool:
        price = self.clock.price(self.kind(timed), recipe)
        return self.clock.fits(None if price is None else price + self.close_s)

    def spend(self, recipe, timed: bool, launch: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`launch`'s run, its cost recorded: the clock's, or the run's own wall time where the clock saw less (a
        faked run)."""
        started = self.clock.now()
        result = launch()
        if "error" not in result:
            seconds = max(self.clock.now() - started, result.get("wall_time_s") or 0.0)
            self.clock.spend(self.kind(timed), recipe, seconds)
        return result

    def fit(self, measured: list[Rung], repeats: int, first: dict[str, Any], budget_s: float) -> Cut:
        """The plan cut to the time budget, priced by the first run (the baseline's, fp32: usually the slowest),
        whole-process wall time. The seconds left are the ladder's own budget's: a resumed ladder's counts the runs it
        reads back (tune adds what they took), and each run is checked against the clock before it starts. --target:
        every kept rung may need TARGET_SEEDS runs (the baseline's seeds, a rung that changes the math)."""
        per_run = max(self.clock.elapsed(), first.get("wall_time_s") or 0.0)
        return cut_to_budget(measured, repeats, per_run, budget_s - self.clock.elapsed(), budget_s,
                             TARGET_SEEDS if self.aimed else 0)

    def pass_price(self, recipes: list, span: float, within: float) -> float | None:
        """One more pass priced by its rungs' measured runs (else by the last pass's `span`), or None: it would not
        end within `within` seconds of the start, or not fit the time budget."""
        priced = self.clock.price_runs([(self.kind(True), recipe) for recipe in recipes])
        pass_s = priced if priced is not None else span
        return pass_s if self.clock.elapsed() + pass_s <= within and self.clock.fits(pass_s) else None

    def stop(self, measured: list[Rung], cut: Cut | None, repeats: int, run: tuple[Rung, int, bool], queue: list,
             display=None) -> Cut:
        """The ladder ends before `run` (its rung, its index, timed or a seed), its `queue` emptied: a rung with runs
        is scored on those, one without any is skipped, and the cut (made here if the plan had none) says where, at
        what price, with how much time left; on the console too, where `display` shows."""
        rung, index, timed = run
        runs_left = len(queue) + 1
        queue.clear()
        price = self.clock.price(self.kind(timed), rung.recipe)
        left = max(0.0, self.clock.left())
        self.stopped = True
        self.why = (f"{runs_left} run(s) left would not fit the time budget (~{price:.0f} s a run, {left:.0f} s left)"
                    if price is not None else f"{runs_left} run(s) left would not fit the time budget (none left)")
        for r in measured:
            if r.status in (Status.PENDING, Status.PARTIAL, Status.RUNNING):
                r.status, r.reason = (Status.DONE, r.reason) if r.repeats else (Status.SKIPPED, self.why)
        cut = cut or Cut(price or 0.0, len(measured), repeats, {"rungs": len(measured), "repeats": repeats}, [])
        skipped = [r.name for r in measured if r.status == Status.SKIPPED and r.name not in cut.skipped]
        cut.skipped += skipped
        cut.rungs -= len(skipped)
        cut.stopped = {"at": f"{rung.name}, run {index + 1}", "runs_left": runs_left, "price_s": price, "left_s": left}
        if display is not None and display.show:
            display.console.print(f"stopped before {rung.name} (run {index + 1}): {self.why}")
        return cut


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


def rung_time_limit(options: LadderOptions, baseline: Rung) -> float | None:
    """--rung-timeout, or by default 10x the baseline's first run (at least 5 minutes: compilation alone
    can take that); the first run itself is unlimited by default."""
    if options.rung_timeout is not None:
        return options.rung_timeout
    walls = [r["wall_time_s"] for r in baseline.repeats if r.get("wall_time_s")]
    return max(300.0, 10 * walls[0]) if walls else None


def settings_as_run(run: LadderRun) -> dict[str, Any]:
    """The ladder's settings as it ran: what the work learned from its runs (a framework script: the framework,
    the script's own settings) joins the settings it started with, and the repeats the time budget cut or
    settling added, the passes added and the machine check are recorded beside them."""
    settings = {**run.settings, **run.work.learned}
    if run.cut is not None:
        settings = {**settings, "repeats": run.repeats, "noise_seeds": run.noise_seeds,
                    "budget_cut": run.cut.to_dict()}
    if run.added:
        settings = {**settings, "repeats": run.repeats,
                    "settle": {"within_s": run.opts.settle_within_s, "passes": run.added}}
    if run.launches.machine:
        settings = {**settings, "machine_check": run.launches.machine}
    if run.aim is not None:
        settings = {**settings, "target": run.aim.to_dict()}
    return settings


def run_ladder(plan: list[Rung], work: Work, settings: dict[str, Any], out: str | Path | None,
               options: LadderOptions, measure: str = "speed") -> AblationResult:
    """The one ablation loop, for the built-in run and a user's command alike (LadderRun)."""
    from .store import default_out_dir

    out_dir = Path(out) if out is not None else default_out_dir()
    return LadderRun(plan, work, settings, out_dir, options, measure).run()
