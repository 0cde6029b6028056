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

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..defaults import MAX_REPEATS, SETTLE_WITHIN_S, parse_size  # the CLI shows them before torch loads
from ..measure import measure_ceiling
from ..procstate import process_cpu_seconds, reference_check
from ..quiet import held_lines
from ..rankfaults import HEARTBEATS, explain_time_limit
from ..recipe import RecipeError
from ..results import AblationResult, Rung, Status
from ..stats import MIN_EFFECT
from ..target import Target, TargetError, parse_target
from ..track.names import check_names
from ..techniques.precision import DTYPES
from .metric import SCRIPT_CHOICE, MetricChoice, better, choose_metric, metric_goal
from .rung import TimingBudget
from .scoring import likely_unsettled, pick_best, score_rungs, seed_summary, unresolved
from .server import wait_rung_server
from .store import RunStore, write_json
from .aim import Aim
from .clock import RunClock
from .queue import kept_in_cut, run_key, take_added_rungs
from .recompiled import run_repeating
from .spending import Cut, LadderSpending, repeat_cost
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
    # --target: the runs the baseline, and each rung that changes the math, are measured over where the budget allows
    # (fewer where a search's last stage could not otherwise start: tune/target.py); at least MIN_RUNS, for an
    # interval. None: TARGET_SEEDS.
    target_seeds: int | None = None
    # The clock the ladder's time budget is a share of (clock.RunClock: a search's, with the costs its earlier
    # stages measured); None: a clock of its own.
    clock: RunClock | None = None
    # --track: tracker names (track/names.py), or a tune's open Tracking (this ladder is one of its stages)
    track: Any = ()

    def __post_init__(self) -> None:
        if not hasattr(self.track, "stage"):            # names (an open Tracking is a tune's, checked there)
            try:
                object.__setattr__(self, "track", check_names(self.track))
            except ValueError as exc:
                raise RecipeError(str(exc)) from None
        if self.target_seeds is None:
            object.__setattr__(self, "target_seeds", TARGET_SEEDS)
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
    what this process (display, event relay) took from the cores the runs use while they ran, and what each run
    took, told to the display with the runs still planned (its progress line: report/progress.py)."""

    def __init__(self, work: Work, launch: Callable, out_dir: Path) -> None:
        self.work, self.launch, self.out_dir = work, launch, out_dir
        self.store: RunStore | None = None
        self.ceilings: dict[str, float] = {}
        self.machine: dict[str, Any] = {}       # procstate.reference_check before and after the runs
        self.in_runs = (0.0, 0.0)               # this process's CPU seconds while runs ran, and those seconds
        self.display = None                     # the display plan() feeds, and what the ladder did when it last did
        self.seen: tuple[int, bool, int, int] | None = None
        self.aimed = False                      # --target: every run compiles afresh (techniques/compile.py)

    def start(self, settings: dict[str, Any], resume: bool, precisions: list[str]) -> None:
        self.store = RunStore(self.out_dir, settings, resume)
        wait_rung_server()
        self.ceilings.update({p: ceiling(self.work, p) for p in dict.fromkeys(precisions)})
        self.machine["start"] = reference_check(self.work.dev)

    def read_back(self, key: str, rung: Rung, budget: TimingBudget | None, display) -> dict[str, Any] | None:
        """A run finished before an interruption, or None; one read back is a run done at no cost."""
        result = self.store.load(key)
        if result is not None:
            display.finished(run_kind(rung, budget), None)
        return result

    def plan(self, ladder: "LadderRun", display) -> None:
        """Before each run: the runs still queued told to the display (runs done of planned, the time left), with
        why their number changed since the last run where the ladder did it: a settling pass, the time budget's
        cut, rungs a script's ladder added, the target's runs and seeds."""
        self.display = display
        restored = (ladder.cut.restored or []) if ladder.cut is not None else []
        seen = (len(ladder.added), ladder.cut is not None, len(ladder.measured), len(restored))
        why, last = None, self.seen
        if last is not None and seen[0] > last[0]:
            added = ladder.added[-1]
            why = (f"pass {added['repeat']} added: {', '.join(added['unsettled'])} still within the noise or "
                   f"unresolved (settling, within {ladder.opts.settle_within_s:.0f} s)")
        elif last is not None and seen[1] and not last[1]:
            why = f"cut to fit the time budget ({ladder.opts.time_budget_s:.0f} s)"
        elif last is not None and seen[2] > last[2]:
            why = "rungs added to the script's ladder"
        elif last is not None and seen[3] > last[3]:
            why = f"{', '.join(restored)} put back: the first pass ran cheaper than the cut priced it"
        elif ladder.aim is not None:
            why = "runs and seeds for the time to target (a rung that changes the math needs its own)"
        self.seen = seen
        # settle_within_s counts from the ladder's start; the display's clock from its own
        settle = ladder.opts.settle_within_s
        window = (settle or 0) - (time.monotonic() - ladder.started) + display.runs.elapsed_s()
        display.runs.settle = ((window, [r.name for r in ladder.measured if r.status != Status.SKIPPED])
                               if settle and ladder.repeats < MAX_REPEATS and not (ladder.cut and ladder.cut.trimmed)
                               else None)
        # what follows the runs, known in advance: the passes settling is likely to add (their verdicts still within
        # the noise), and the ladder's close (its peak and reference workload timed again, its report written)
        display.runs.settle_passes = (MAX_REPEATS - ladder.repeats if display.runs.settle is not None and
                                      likely_unsettled(ladder.measured, ladder.repeats, ladder.opts.min_effect,
                                                       ladder.opts.mode == "cumulative") else 0)
        display.runs.close_s = ladder.spending.held_s()
        if math.isfinite(ladder.spending.clock.left()):      # the time left never said past the budget's end
            display.runs.budget_left = ladder.spending.clock.left
        display.plan([run_kind(rung, budget) for rung, _, budget in ladder.queue
                      if rung.status not in (Status.NO_EFFECT, Status.SKIPPED)], why)

    def run(self, key: str, rung: Rung, recipe, budget: TimingBudget | None, display, limit: float | None,
            fits: Callable[[float], bool] = lambda seconds: True) -> dict[str, Any]:
        """The run launched in its own folder (its recipe beside its log), kept in the store unless it failed;
        `fits`: whether a run of so many seconds fits in the time left (a repeat for a recompile)."""
        run_dir = self.out_dir / "rungs" / key
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "recipe.json", recipe.to_dict())
        cpu, began = process_cpu_seconds(), time.monotonic()
        # once more where a recompile left too few timed steps (recompiled.py); its last launch timed below; a run
        # of several ranks stopped at its limit says which rank the others waited for (rankfaults.py)
        result, started = run_repeating(
            lambda folder: explain_time_limit(self.launch(rung, recipe, budget, folder, display, limit),
                                              folder / HEARTBEATS),
            run_dir, display, run_kind(rung, budget), fits, f"{rung.name}, seed {recipe.seed}")
        self.in_runs = (self.in_runs[0] + process_cpu_seconds() - cpu, self.in_runs[1] + time.monotonic() - began)
        took = time.monotonic() - started
        # a compiled rung's first run pays the compile its repeats read from the shared cache (not under a target:
        # each run compiles afresh there): the time left prices them without it
        first = not (rung.repeats or rung.seed_runs) and not self.aimed
        display.finished(run_kind(rung, budget), took, repeat_cost(result, took) if first else None)
        if "error" not in result:
            self.store.save(key, result)
        return result

    def finish(self) -> None:
        """After the last run: the ceilings measured again, the machine checked again, this process's share."""
        self.ceilings.update({p: max(c, ceiling(self.work, p)) for p, c in self.ceilings.items()})
        self.machine["end"] = reference_check(self.work.dev)
        cpu, seconds = self.in_runs
        self.machine["parent_cpu_share"] = cpu / seconds if seconds else None
        held = held_lines()        # libraries' import notices, kept off the console (quiet.py): kept here
        if held:
            (self.out_dir / "imports.log").write_text("\n".join(held) + "\n")


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
        self.launches.aimed = options.target is not None
        self.ceilings = self.launches.ceilings          # each precision's roof (Launches), filled as the runs start
        self.metric = LadderMetric(lambda: work.metric(measure), plan, settings)
        self.after_run = work.after_run(plan)
        self.repeats, self.noise_seeds = options.repeats, options.noise_seeds
        self.measured = [r for r in plan if r.status != Status.NO_EFFECT]
        # Interleaved: repeat 0 of every rung, then repeat 1 of every rung, ...; the baseline's extra seeds last.
        self.queue = [(rung, i, options.budget) for i in range(self.repeats) for rung in self.measured]
        # --target: the baseline's seeds number at least TARGET_SEEDS (its samples to target, its seed band), and
        # its runs go first (aim.py)
        self.aim = (Aim(options.target, plan, work, self.metric.choice, options.min_effect, options.target_seeds)
                    if options.target is not None else None)
        if self.aim is not None:
            self.noise_seeds = max(self.noise_seeds, options.target_seeds)
        self.queue += [(plan[0], i, None) for i in range(self.repeats, self.noise_seeds)]
        if self.aim is not None:
            self.queue = self.aim.order(self.queue)
        self.next_index = max(self.repeats, self.noise_seeds)
        self.seed_runs: list[dict[str, Any]] = []
        self.cut: Cut | None = None
        self.pass_times: dict[int, list[float]] = {}    # repeat index -> [start, end] of that pass's timed runs
        self.added: list[dict[str, Any]] = []           # the passes settling added, and why
        self.started = self.spending.clock.started
        self.tracking = track_ladder(options.track, plan, work, settings, out_dir)

    def run(self) -> AblationResult:
        display, interrupted = self.open(), False
        with display:
            try:
                while self.step(display):
                    pass
            except KeyboardInterrupt:
                interrupted = True
            self.wind_up(interrupted)
        return conclude(self, display, interrupted)

    def open(self, console=None):
        """The run store opened, the ceilings and the machine measured: the ladder's Display, to be entered (run() in
        parts: open, step, wind_up, conclude, so that several ladders run interleaved, a run at a time: world.py)."""
        from ..report import Display, environment

        with self.spending.fixed("open"):         # priced for the stages after it (clock.py)
            self.launches.start(self.settings, self.opts.resume, [r.recipe.precision for r in self.measured])
        self.env = environment(self.work.dev)
        return Display(self.plan, self.ceilings, self.env, self.opts.show, self.settings, console=console)

    def step(self, display) -> bool:
        """The next run (a settling pass or a target's seeds queued first if none is), scored; False: none left."""
        if not (self.queue or self.add_pass() or self.add_seeds()):
            return False
        self.launches.plan(self, display)          # the progress line's plan, and why it changed
        self.run_next(display)
        self.rescore()
        display.metric = self.metric.judged_metric()
        display.update()
        self.tracking.judged(self.plan, display.metric)
        return True

    def wind_up(self, interrupted: bool) -> None:
        if not interrupted:
            with self.spending.fixed("close"):
                self.launches.finish()
        for rung in self.plan:
            if rung.status == Status.PARTIAL and interrupted:
                rung.status = Status.DONE        # a partial report still shows what was measured
        self.rescore()

    def run_next(self, display) -> None:
        """The next run of the queue: read back from the store, or launched; its rung updated."""
        rung, i, budget = self.queue.pop(0)
        if rung.status in (Status.NO_EFFECT, Status.SKIPPED, Status.FAILED):   # found out: a failure's error stands
            return
        recipe = rung.recipe.replace(seed=rung.recipe.seed + i)
        key = run_key(rung, i)
        timed = budget is not None          # a timed repeat; else a baseline's accuracy-only seed
        result = self.launches.read_back(key, rung, budget, display)
        if result is None and not self.spending.affords(rung.recipe, timed):    # the ladder ends here
            return self.spending.stop(self, (rung, i, timed), display)
        if timed:
            self.pass_times.setdefault(i, [self.spending.clock.now(), 0.0])
        if result is None:
            rung.status = Status.RUNNING
            display.start_rung(rung, recipe.seed, len(rung.repeats) + 1 if timed else i + 1,
                               self.repeats if timed else self.noise_seeds)
            result = self.spending.spend(rung.recipe, timed, lambda: self.launches.run(
                key, rung, recipe, budget, display, rung_time_limit(self.opts, self.plan[0]), self.spending.fits_s))
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
            take_added_rungs(self)
        if self.aim is not None:
            self.aim.after_run(self.queue)
        if self.opts.time_budget_s is not None and "error" not in result:
            self.fit_budget(result)

    def fit_budget(self, first: dict[str, Any]) -> None:
        """After the first run: the plan cut to the time budget (LadderSpending.fit); after the first pass, the rungs
        it cut that now fit put back (LadderSpending.refit)."""
        if self.cut is not None:
            queue = self.spending.refit(self)
            self.queue = self.aim.order(queue) if self.aim is not None and queue is not self.queue else queue
            return
        held = sum(self.launches.store.holds(run_key(rung, i)) for rung, i, _ in self.queue)
        self.cut = self.spending.fit(self.measured, self.repeats, first, self.opts.time_budget_s, held)
        # --target: the baseline keeps its target_seeds seeds (its samples to target, its band, every interval)
        self.repeats, self.noise_seeds = self.cut.repeats, max(self.cut.repeats, self.spending.seeds)
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
        if (pass_s := self.spending.pass_price(self.measured, self.pass_times, settle)) is None:
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

def ladder_result(run: LadderRun) -> AblationResult:
    """The scored ladder, its recommendation and the settings as run (cut and settled), report written."""
    from ..report import write_report

    best, tie, odds = pick_best(run.plan, run.opts.min_effect, run.opts.memory_limit)
    if run.aim is not None and run.aim.target.known:      # judged on time to target, not on rate
        best, tie, odds = pick_soonest(run.plan, run.opts.memory_limit), [], {}
    result = AblationResult(run.plan, run.env, run.out_dir, best.recipe if best else None,
                            best.name if best else None, run.ceilings, run.seed_runs, tie, settings_as_run(run),
                            odds, run.metric.judged_metric())
    with run.spending.fixed("report"):
        write_report(result)
    return result


def conclude(run: LadderRun, display, interrupted: bool) -> AblationResult:
    """The last of a ladder's run: its result and report written, its trackers closed, its summary shown; raises
    KeyboardInterrupt once written, when interrupted."""
    result = ladder_result(run)
    run.tracking.finish(result, interrupted)
    display.final(result, interrupted)
    if interrupted:
        raise KeyboardInterrupt
    return result


def run_kind(rung: Rung, budget: TimingBudget | None) -> str:
    """A run's kind for its cost (report/progress.py): its rung, and whether it is timed or evaluated only."""
    from ..report.progress import SEEDS

    return rung.name + ("" if budget is not None else SEEDS)


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
    if run.launches.display is not None:        # the time it took beside the time planned after the first pass
        settings = {**settings, "time": run.launches.display.runs.summary()}
    return settings


class Untracked:
    """No tracker asked for: what the loop tells its trackers goes nowhere."""

    def judged(self, plan: list[Rung], metric: dict[str, Any] | None) -> None:
        pass

    def finish(self, result: AblationResult, interrupted: bool) -> None:
        pass


def track_ladder(track: Any, plan: list[Rung], work: Work, settings: dict[str, Any], out_dir: Path):
    """The ladder's trackers (LadderOptions.track; track/ladder.py), or Untracked when none is asked for; a script
    that logs to a tracker itself is told, in each run's environment, where its runs belong."""
    if not track:
        return Untracked()
    from ..track.ladder import LadderTracking          # only when asked: it reads the report's entries

    tracking = LadderTracking.open(track, plan, settings, out_dir)
    if tracking is None:
        return Untracked()
    if hasattr(work, "run_env"):
        work.run_env = tracking.run_env
    return tracking


def run_ladder(plan: list[Rung], work: Work, settings: dict[str, Any], out: str | Path | None,
               options: LadderOptions, measure: str = "speed", nodes=None) -> AblationResult:
    """The one ablation loop, for the built-in run and a user's command alike (LadderRun). `nodes` (nodes.Nodes,
    several): node 0 runs it with every run a job of all the nodes, the others follow it (nodes.py here)."""
    from .store import default_out_dir

    if nodes is not None and nodes.several and not nodes.leads:
        from .nodes import follow

        return follow(plan, work, settings, measure, nodes)      # no folder, no report: node 0 writes them
    out_dir = Path(out) if out is not None else default_out_dir()
    ladder = LadderRun(plan, work, settings, out_dir, options, measure)
    if nodes is not None and nodes.several:
        from .nodes import lead

        return lead(ladder, nodes)
    return ladder.run()
