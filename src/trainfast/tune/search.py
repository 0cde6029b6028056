"""The search: `tune()` as its stages, each a ladder of the ablation's own loop in a folder of its own, all
sharing one SearchBudget and one Search (the work, the base recipe, the options, the notes)."""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..ablation import LadderOptions, run_ladder
from ..ablation.clock import run_kind
from ..ablation.spending import trimmed
from ..ablation.scoring import recipe_changes
from ..ablation.script_rungs import add_script_rungs, script_settings
from ..ablation.store import default_out_dir
from ..ablation.target import TARGET_SEEDS
from ..ablation.work import BuiltinSpec, Work, prepare_builtin, prepare_command
from ..recipe import Recipe, RecipeError, resolve_device
from ..report.summary import judged_line, keep_line
from ..results import AblationResult, Rung, Status
from ..scriptargs import as_changes, check_rungs
from ..tasks import TASKS
from ..techniques.precision import auto_amp_dtype, slow_half_reason
from ..techniques.static import rung_names
from .batch import batch_finding, batch_rungs
from .budget import SearchBudget, singles_share
from .combine import Decision, break_even_steps, combine, combine_stage, decide, on_level_decision, tied_best
from .inputs import INPUT_SWITCHES, run_input
from .memory import held_to_limit, named_for_memory, run_memory
from .options import TuneOptions, tune_options
from .tracked import finish_tracking, open_tracking
from .outputs import write_outputs
from .target import TARGET_SHARE, run_target_stage
from .script import command_line, merged_script, stamp_stage
from .switches import firm_gain, is_level, kept_level, on_level_order, plan_singles, single_names


@dataclass
class Search:
    """What every stage shares: the work its runs are started by, the recipe they start from, the options,
    the one budget, and the notes on what was cut or skipped (they end the recommendation's notes)."""
    work: Work
    base: Recipe
    out_dir: Path
    options: TuneOptions
    budget: SearchBudget
    replan: Callable[[], list[Rung]]          # stage 1's rungs planned afresh, their effects marked
    notes: list[str] = field(default_factory=list)
    task: str = "classification"
    memory_choice: Rung | None = None         # --memory-limit: the fastest that fits, where the search went on from
    tracking: Any = None                      # --track: the search's parent run, each stage's ladder files under it

    def settings(self, name: str, rungs: list[Rung], repeats: int, measure: str, mode: str) -> dict[str, Any]:
        """A stage's plan.json: what identifies its runs, so a resumed stage reuses only runs of the same plan."""
        opts = self.options
        common = {**self.work.settings, "repeats": opts.repeats, "budget": dataclasses.asdict(opts.timing),
                  "min_effect": opts.min_effect, "device": str(self.work.dev),
                  **({"memory_limit": opts.memory_limit} if opts.memory_limit else {})}
        return {**common, "stage": name, "mode": mode, "repeats": repeats, "noise_seeds": repeats, "measure": measure,
                "rungs": {r.name: {**r.recipe.to_dict(), **script_settings(r)} for r in rungs
                          if r.status != Status.NO_EFFECT}}

    def stage(self, name: str, rungs: list[Rung], repeats: int, measure: str = "speed", mode: str = "each",
              share: float = 1.0, again: bool = False, credit_s: float = 0.0, last: bool = False,
              target=None, target_seeds: int = TARGET_SEEDS) -> AblationResult:
        """One stage: speed for the singles (a command's runs stop once timed), full for stage 2, whose
        candidates are also judged on the metric (the built-in run always trains to its end). `again`: the
        stage's folder is resumed (its runs so far reused, at no cost), with `credit_s`, what they took, added
        to its time so its plan prices them like the runs still to come.

        With `settle`, the budget the planned passes leave is spent where it changes an answer: more passes
        while a verdict is marked ? or a gain of min_effect or more is unresolved (the ladder's settling, as
        in `ablate`), until the stage has taken SETTLE_SHARE of the budget left when it started (all of it
        in the `last` stage), so later stages keep their time. A default search that stopped after 3 passes
        left channels_last on top of bf16 at 1.14x (1.02-1.27) "no measurable difference ?" with 12 of its
        15 minutes unused."""
        opts = self.options
        left = self.budget.left()
        allowed = self.budget.allowance(share, credit_s, left)
        settle_s = self.budget.settle_s(allowed, credit_s, left, last) if opts.settle else 0.0
        ladder = LadderOptions(mode=mode, repeats=repeats, noise_seeds=repeats, budget=opts.timing,
                               min_effect=opts.min_effect, resume=opts.resume or again, rung_timeout=None,
                               show=opts.show, settle_within_s=settle_s, time_budget_s=allowed,
                               paired=opts.paired, memory_limit=opts.memory_limit, target=target,
                               target_seeds=target_seeds,
                               track=self.tracking or (), clock=self.budget)
        settings = self.settings(name, rungs, repeats, measure, mode)
        if again:
            # The stage's own folder, gone on with: its plan.json names the rungs it was first planned with, which
            # a script's batches may since have replaced by its task's (work.follow_task); the runs are this
            # search's own, so the folder's plan stands and its runs are reused by rung.
            written = json.loads((self.out_dir / name / "plan.json").read_text())
            settings["rungs"] = written.get("rungs", settings["rungs"])
        return run_ladder(rungs, self.work, settings, self.out_dir / name, ladder, measure)

    def repeats_that_fit(self, runs_per_pass: int, per_run: float, left: float | None = None) -> int | None:
        """A stage's repeats within what is left of the budget (or `left`): the search's own, else 2 (the fewest
        that give an interval), else None: not even that fits."""
        asked = self.options.repeats
        return next((r for r in dict.fromkeys((asked, min(asked, 2)))
                     if self.budget.fits_runs(runs_per_pass * r, per_run, left)), None)

    def run_price(self, measure: str = "speed", recipe: Recipe | None = None, target: bool = False) -> float:
        """One run's price for a stage, from the runs the search measured so far (ablation/clock.py: the recipe's own
        runs of that kind first): a stage is checked with it before it starts, and each of its runs again."""
        return self.budget.price(run_kind(measure, target=target), recipe) or 0.0

    def note(self, text: str) -> None:
        """A note on what the budget cut or skipped: in tune.md, and on the console as it happens."""
        self.notes.append(text)
        if self.options.show:
            print(f"tune: {text}")

    def cut_note(self, result: AblationResult, why: str = "") -> None:
        """A note on what the stage's time budget cut from its plan, if anything: fewer repeats, its last rungs, or
        the runs left where a run's price no longer fitted (the ladder stopped there)."""
        cut = result.settings.get("budget_cut")
        if trimmed(cut) or (cut or {}).get("restored"):
            asked = cut["asked"]["repeats"]
            what = [f"{cut['repeats']} repeats instead of {asked}"] if cut["repeats"] < asked else []
            what += [f"without {', '.join(cut['skipped'])}"] if cut["skipped"] else []
            per_run = f"~{cut['seconds_per_run']:.0f} s a run"
            said = [f"ran {' and '.join(what)} to fit the budget ({per_run})"] if what else []
            if cut.get("restored"):
                said.append(f"put {', '.join(cut['restored'])} back after its first pass ran cheaper than priced")
            stopped = cut.get("stopped")
            if stopped:
                price = f"its ~{stopped['price_s']:.0f} s" if stopped["price_s"] is not None else "it"
                went_on = stopped.get("went_on")
                went = f"; went on with {', '.join(went_on)}, whose runs fitted" if went_on else ""
                said.append(f"stopped before {stopped['at']}: {price} would not fit the {stopped['left_s']:.0f} s "
                            f"left ({stopped['runs_left']} run(s) not run){went}")
            self.note(f"{result.settings['stage']}: {'; '.join(said)}{why}")


@dataclass
class Findings:
    """What the stages found so far, passed from each stage to the next."""
    singles: list[Rung]
    first: AblationResult                    # stage 1
    steps: int | None                        # the planned run's optimizer steps, when known
    combined: Recipe                         # the switches that gained, together
    in_combination: list[str]
    dropped: dict[str, str]                  # switch -> why it is not in the combination
    level: Rung | None = None                # the precision level the combination keeps
    on_level: AblationResult | None = None   # stage 1b
    second: AblationResult | None = None     # stage 2
    batch: AblationResult | None = None      # --batch-size-search
    inputs: list[AblationResult] = field(default_factory=list)    # stage 3, its rounds
    target: AblationResult | None = None     # --target: the candidates on their time to target
    script: dict[str, Any] = field(default_factory=dict)   # the script's own flags the combination holds (--rung)


def prepare_search(spec: BuiltinSpec, recipe: Recipe | None, device: str, opts: TuneOptions,
                   budget: SearchBudget) -> tuple[Search, list[Rung]]:
    """The work prepared and checked, the switches chosen, stage 1's rungs planned and marked: everything
    that can refuse the search does so here, before the first run."""
    out_dir = Path(opts.out) if opts.out is not None else default_out_dir("tune")
    if out_dir.exists() and not opts.resume and any(out_dir.iterdir()):
        raise RecipeError(f"{out_dir} already holds a search: pass --resume to continue it, or choose another --out")
    work: Work | None = None
    if opts.command is None:
        from ..tasks.effects import holds

        work = prepare_builtin(spec, recipe, device)
        base, dev, image_folder = work.base, work.dev, holds("image_folder", work.split)
        task = work.task.name
    else:          # a script: the task given, else the one its batches show in stage 1's first run
        base, dev, image_folder, task = recipe or Recipe(), resolve_device(device), False, spec.task or "classification"
    amp = auto_amp_dtype(dev) if opts.amp_dtype == "auto" else opts.amp_dtype
    slow = slow_half_reason(dev, amp) if opts.amp_dtype == "auto" else None
    names = chosen_switches(single_names(amp, image_folder, task), opts.switches)
    singles = with_own_rungs(plan_singles(base, names, amp, dev, slow, task), opts)
    # A script whose task was not given, its switches not named: each other task's stage 1, one of which its
    # batches may pick (ablation/work.py: CommandWork.follow_task). Detection has no search (its precision levels
    # past O1 are refused, so stage 1b has nothing to try): a detector's script keeps the default stages.
    others = {} if work is not None or spec.task or opts.switches else {
        name: single_names(amp, False, name) for name in TASKS if name not in (task, "detection")}
    if work is None:
        by_task = {name: plan_singles(base, switches, amp, dev, slow, name) for name, switches in others.items()}
        # Every candidate is a combination of the singles' fields: those are all a run may switch.
        work = prepare_command(opts.command, [r.changes for r in singles], recipe=base, device=device,
                               nproc=opts.nproc, measure="speed", budget=opts.timing, metric=opts.metric,
                               goal=opts.goal, by_task=by_task, task=spec.task, metric_pattern=opts.metric_pattern)
    work.mark_effects(singles)

    def replan() -> list[Rung]:
        """Stage 1 planned again on the search's base as it is now (the memory stage may have moved it)."""
        name = getattr(work, "learned", {}).get("script_task", {}).get("name", task)
        rungs = with_own_rungs(plan_singles(search.base, others.get(name, names), amp, dev, slow, name), opts)
        work.mark_effects(rungs)
        return rungs
    search = Search(work, base, out_dir, opts, budget, replan, task=task)
    return search, singles


def with_own_rungs(singles: list[Rung], opts: TuneOptions) -> list[Rung]:
    """Stage 1's rungs and, after them, each rung of the script's own flags (--rung) alone on the baseline."""
    if opts.script_rungs:
        own = check_rungs(as_changes(opts.script_rungs), rung_names(None))
        add_script_rungs(singles, own, opts.command, "each")
    return singles


def chosen_switches(names: list[str], switches: list[str] | None) -> list[str]:
    """`names` narrowed to --switches (every one of which must be among them or the input stage's), in the
    search's order."""
    if not switches:
        return names
    known = [*names, *(n for n in INPUT_SWITCHES if n not in names)]
    unknown = [n for n in switches if n not in known]
    if unknown:
        raise RecipeError(f"--switches: {', '.join(unknown)} not among {', '.join(known)}")
    return [n for n in names if n in switches]


def run_singles(search: Search, singles: list[Rung]) -> Findings:
    """Stage 1 (singles/): every switch alone against the baseline, then combined on paper (combine)."""
    opts, budget = search.options, search.budget
    share = singles_share(singles)
    first_started = time.monotonic()
    first = search.stage("singles", singles, opts.repeats, share=share)
    steps = opts.planned_steps or next((run.get("steps") for run in singles[0].repeats), None)
    combined, in_combination, dropped = combine(search.base, singles, steps, opts.memory_limit)
    cut = first.settings.get("budget_cut")
    if share < 1 and trimmed(cut) and not kept_level(singles, in_combination) and \
            budget.fits_runs(1, cut["seconds_per_run"]):
        # No precision level gained, so there is no stage 1b to keep the rest of the budget for: stage 1 goes
        # on with all of it, re-planned as if it had had it from the start (its runs so far reused).
        singles = search.replan()
        first = search.stage("singles", singles, opts.repeats, again=True, credit_s=time.monotonic() - first_started)
        combined, in_combination, dropped = combine(search.base, singles, steps, opts.memory_limit)
        share = 1.0
        search.notes.append("no precision level gained firmly, so stage 1 went on with the budget kept for stage 1b")
    search.cut_note(first, f"; {1 - share:.0%} of the budget was kept for stage 1b, where a switch cut here is "
                           f"judged on top of the precision level if one gains" if share < 1 else "")
    if steps is None and "compile" in in_combination:
        search.notes.append("the planned run's length is not known (a command's runs stop once timed): compile "
                            "was kept without its break-even check; pass --planned-steps to decide it")
    return Findings(singles, first, steps, combined, in_combination, dropped,
                    kept_level(singles, in_combination),
                    script=merged_script(singles, in_combination, search.options.command))


def run_on_level(search: Search, found: Findings) -> None:
    """Stage 1b (on-level/): precision changes every kernel, so the other switches are judged again on top of
    the level the combination keeps (channels_last, for one, pays in bf16 and not in fp32); the combination
    becomes the level plus what gained on top of it."""
    level, repeats = found.level, search.options.repeats
    others = [r for r in found.singles[1:] if r.status != Status.NO_EFFECT and not is_level(r)]
    if level is None or not others:
        return
    rungs = [Rung(f"on-{level.name}", dict(level.changes), level.recipe)]
    rungs += [Rung(r.name, dict(r.changes), level.recipe.replace(**r.changes), script=dict(r.script))
              for r in on_level_order(others)]
    # Run when the level and one switch fit twice: the stage cuts itself to the budget (the ladder's time budget).
    if not search.budget.fits_runs(2 * min(repeats, 2), search.run_price("speed", level.recipe)):
        search.note(f"the switches were not judged again on top of {level.name} (would not fit the budget)")
        return
    found.on_level = search.stage("on-level", rungs, repeats)
    search.cut_note(found.on_level)
    on_top, names_on_top, dropped_on_top = combine(level.recipe, rungs, found.steps)
    found.combined, found.in_combination = on_top, [level.name, *names_on_top]
    found.script = merged_script(rungs, names_on_top, search.options.command)
    levels = {r.name for r in found.singles if is_level(r)}
    dropped = {k: v for k, v in found.dropped.items() if k in levels}     # the others: judged on top instead
    dropped.update({k: f"on top of {level.name}: {v}" for k, v in dropped_on_top.items()})
    found.dropped = dropped


def recommend(search: Search, found: Findings) -> Decision:
    """The recommendation: the baseline when nothing gained; the best measured recipe when one switch gained
    or stage 2 would not fit (3 rungs, 2 repeats at the least); else what stage 2 decides."""
    if not found.in_combination:
        return Decision(search.base, "baseline", dropped=found.dropped,
                        notes=["no switch gained firmly on its own: the baseline is recommended"])
    full = search.run_price("full", found.combined)
    if len(found.in_combination) == 1 or not search.budget.fits_runs(3 * min(search.options.repeats, 2), full):
        decision = best_measured(search, found)
        if search.options.command is None:
            return decision
        # A script's stage-1 runs stop once timed: nothing judged its metric. Stage 2 would run in full; without
        # it, the recipe is run in full against the baseline before it is recommended, unless the runs that
        # measured it already ran the script to its end (a token script's, timed whole) and judged its metric.
        return guarded_by_its_runs(search, found, decision) or guard_measured(search, decision, full)
    return run_combine(search, found)


def guarded_by_its_runs(search: Search, found: Findings, decision: Decision) -> Decision | None:
    """The accuracy guard from the runs that measured the recipe, where each ran the script to its end (a token
    script's runs are timed whole, probe.Probe.whole_run) and reported its metric: the recipe's rung (stage 1's
    or stage 1b's) against stage 1's baseline, the script as it is, and its band over the baseline's seeds, as
    the scores judge a rung. None where those runs did not judge a metric: the guard then runs (guard_measured)."""
    from ..ablation.scoring import metric_band

    if not getattr(search.work, "learned", {}).get("whole_run") or not (found.first.metric or {}).get("name"):
        return None
    measured = [*found.singles, *(found.on_level.rungs if found.on_level else [])]
    rung = next((r for r in measured if r.status == Status.DONE and r.result.metric_values
                 and not recipe_changes(r.recipe, decision.recipe)), None)
    base = found.singles[0]
    seeds = [a for a in (base.result.metric_values if base.status == Status.DONE else []) if a is not None]
    if rung is None or len(seeds) < 2:
        return None
    metric = found.first.metric
    reference = statistics.fmean(seeds)
    value = statistics.fmean(rung.result.metric_values)
    band = metric_band(reference, None, seeds, runs=len(rung.result.metric_values))
    delta = value - reference
    worse = not math.isfinite(value) or (abs(delta) > band and (delta < 0) == (metric.get("goal") != "min"))
    said = (f"{metric['name']} {value:.4g} ({delta:+.3g}) against the script as it is ({reference:.4g} over "
            f"{len(seeds)} seeds, band ±{band:.3g}), on the {len(rung.result.metric_values)} runs that timed it, each "
            "run to the script's end")
    if worse:
        return Decision(search.base, "baseline", gainers=decision.gainers, dropped={
            **decision.dropped, decision.name: f"loses accuracy run to its end: {said}"}, notes=decision.notes)
    where = "inside the band" if abs(delta) <= band else "past the band on the better side"
    decision.notes.append(f"the accuracy guard: {where}: {said}")
    return decision


def guard_measured(search: Search, decision: Decision, per_run: float) -> Decision:
    """The accuracy guard for a script's recipe that stage 2 did not run (guard/): the baseline and the recipe,
    each run to its end and judged on the script's metric as stage 2 judges its rungs; a recipe outside the
    baseline's band on the wrong side is not recommended. Said, not skipped, when it does not fit the budget
    (priced at `per_run` seconds a run, as stage 2 is: Search.run_price)."""
    repeats = search.repeats_that_fit(2, per_run)
    if repeats is None:
        decision.notes.append("no accuracy guard: a full run of the baseline and the recipe would not fit the budget")
        return decision
    rungs = [Rung("baseline", {}, search.base),
             Rung(decision.name, recipe_changes(search.base, decision.recipe), decision.recipe,
                  script=dict(decision.script))]
    result = search.stage("guard", rungs, repeats, measure="full", last=True)
    rung = result.rungs[1]
    guarded = judged_line(result)
    if rung.status == Status.DONE and rung.result.metric_worse:
        return Decision(search.base, "baseline", gainers=decision.gainers, dropped={
            **decision.dropped, decision.name: f"loses accuracy run to its end ({rung.result.metric_delta:+.3g}, "
                                               "outside the baseline's band)"},
            notes=decision.notes + ([f"the accuracy guard {guarded[0].lower() + guarded[1:]}"] if guarded else []))
    if guarded:
        decision.notes.append(f"the accuracy guard {guarded[0].lower() + guarded[1:]}")
    elif (result.metric or {}).get("why"):
        decision.notes.append(f"no accuracy guard: {result.metric['why']}")
    return decision


def best_measured(search: Search, found: Findings) -> Decision:
    """Without stage 2: the single switch that gained most, as measured alone; or, where switches gained on
    top of the level, the best of those: the level plus that switch is a recipe stage 1b measured."""
    names = found.in_combination
    only = tied_best([r for r in found.singles if r.name in names and firm_gain(r)], found.singles,
                     search.options.min_effect)
    decision = Decision(only.recipe, only.name, gainers=list(names), combined=[only.name],
                        dropped=found.dropped, speedup=only.result.speedup,
                        speedup_interval=only.result.speedup_interval,
                        notes=["one switch gained: nothing to combine"] if len(names) == 1 else [],
                        script=dict(only.script))
    on_top = [r for r in (found.on_level.rungs[1:] if found.on_level else []) if r.name in names and firm_gain(r)]
    if len(names) > 1 and on_top and found.level is not None:
        decision = on_level_decision(found.level, max(on_top, key=lambda r: r.result.speedup), decision)
    if len(names) > 1 and set(decision.combined) == set(names):
        search.note(f"stage 2 was skipped (would not fit the budget); it had nothing to add: stage 1b "
                            f"measured {decision.name}, all that gained, together")
    elif len(names) > 1:
        search.note(f"stage 2 was skipped (would not fit the budget): {', '.join(names)} were not "
                            f"measured together; {decision.name} is recommended, the best measured recipe")
    return decision


def run_combine(search: Search, found: Findings) -> Decision:
    """Stage 2 (combine/): the combination against the baseline, the best single switch and itself without
    each switch, every run trained to its end; shortened to fit the budget (2 repeats, then no leave-one-out)."""
    opts = search.options
    changes = {r.name: r.changes for r in [*found.singles, *(found.on_level.rungs if found.on_level else [])]}
    rungs = combine_stage(search.base, found.singles, found.combined, found.in_combination, changes,
                          opts.min_effect)
    stamp_stage(rungs, [*found.singles, *(found.on_level.rungs if found.on_level else [])], found.in_combination,
                opts.command)           # each candidate's runs start the command line of the flags it holds
    fit = search.repeats_that_fit(len(rungs), search.run_price("full", found.combined), search.budget.left())
    repeats = fit or min(opts.repeats, 2)
    if repeats < opts.repeats:
        search.note(f"stage 2 ran {repeats} repeats instead of {opts.repeats} to fit the budget")
    if fit is None:
        rungs = rungs[:3]
        search.note("the leave-one-out rungs (the combination without each switch) were skipped to fit "
                            "the budget: harmful interactions were not looked for")
    found.second = search.stage("combine", rungs, repeats, measure="full", last=not opts.batch_size_search)
    search.cut_note(found.second)
    decision = decide(found.second.rungs, opts.min_effect)
    guarded = judged_line(found.second)
    if guarded:
        decision.notes.append(f"the accuracy guard {guarded[0].lower() + guarded[1:]}")
    elif opts.command is not None and (found.second.metric or {}).get("why"):
        decision.notes.append(f"no accuracy guard: {found.second.metric['why']}")
    decision.gainers = list(found.in_combination)
    decision.combined = list(found.in_combination)
    decision.dropped = {**found.dropped, **decision.dropped}
    return decision


def compile_note(singles: list[Rung], decision: Decision) -> None:
    """What compile's break-even was here, when stage 1 measured it."""
    compiled = next((r for r in singles if r.changes.get("compile") and r.status == Status.DONE), None)
    if compiled is not None and singles[0].status == Status.DONE:
        even = break_even_steps(compiled, singles[0])
        decision.notes.append(f"compile repays its compilation after ~{even:.0f} steps" if math.isfinite(even) else
                              "compile saved no time per step here: it never repays its compilation")


def run_batch_search(search: Search, decision: Decision) -> AblationResult | None:
    """--batch-size-search (batch/): the recommended recipe at larger batch sizes, a cumulative ladder; the
    finding goes to decision.batch, never into its recipe."""
    repeats = search.options.repeats
    rungs = batch_rungs(decision.recipe, len(search.work.split.train))
    if len(rungs) < 2:
        search.notes.append("--batch-size-search: no larger batch leaves two steps an epoch on this data")
        return None
    if not search.budget.fits_runs(len(rungs) * repeats, search.run_price("full", decision.recipe)):
        search.note("--batch-size-search was skipped: it would not fit the budget")
        return None
    batch = search.stage("batch", rungs, repeats, mode="cumulative", last=True)
    search.cut_note(batch)
    decision.batch = batch_finding(batch)
    return batch


def tune(model: str | Callable[[], torch.nn.Module] = "resnet9", train_set=None, val_set=None, loss_fn=None, *,
         data: str = "digits", image_size: int | None = None, recipe: Recipe | None = None, device: str = "auto",
         mean=None, std=None, task: str | None = None, **options) -> Decision:
    """Search for the fastest recipe that keeps accuracy (the package's docstring); best.yaml, tune.md and
    tune.json in the search's folder. The work: a built-in model and data as `ablate()` takes them, or
    `command`. `options`: TuneOptions' fields.

    `planned_steps`: the optimizer steps of the run the recipe is for (default: the recipe's epochs x steps
    per epoch), which decides compile. `budget_s`: the search plans within it; a stage that would not fit is
    shortened (fewer repeats, no leave-one-out rungs) or skipped, and the report says so. `switches`: search
    only these (names as single_names gives them, e.g. autocast-bf16, channels_last).

    `command`: search on a user's own training command instead of the built-in run (`trainfast tune --
    python train.py ...`; the ablation's CommandWork): stages 1 and 1b time each run in speed mode; stage 2
    runs every candidate to its end, so the accuracy guard compares the metric the script reports with
    `tf.report` (`metric`, `goal` as in ablate_command) with the baseline's band. `planned_steps` then
    decides compile (the script's run length is not known before it ends). `task` names the script's task (its
    stages' switches); without it, stage 1's first run reads it from the script's batches and plans its switches.

    `batch_size_search`: afterwards, the recommended recipe at 2x, 4x, 8x its batch size (stage batch/, a
    cumulative ladder): the largest that fits and is still firmly faster with accuracy kept is reported
    apart (decision.batch, tune.md), never written into best.yaml: a larger batch changes the optimization
    (steps per epoch, the learning rate it wants), which the user decides.

    `settle`: after a stage's planned `repeats` passes, more passes (up to the ladder's MAX_REPEATS) while a
    verdict is within the noise and the budget allows (Search.stage); False: exactly `repeats` passes in
    every stage."""
    opts = tune_options(options)
    # --target: the rate search keeps to its share, the stage on time to target gets the rest (tune/target.py)
    budget = SearchBudget(opts.budget_s * (1 - TARGET_SHARE) if opts.target is not None else opts.budget_s)
    if opts.started is not None:                  # the CLI's budget counts its process's start and imports too
        budget.started = min(budget.started, opts.started)
    spec = BuiltinSpec(model, train_set, val_set, loss_fn, data, image_size, mean, std, task)
    search, singles = prepare_search(spec, recipe, device, opts, budget)
    search.tracking = open_tracking(opts, search.out_dir, search.work.settings)
    memory = run_memory(search, search.task) if opts.memory_limit else None
    if memory is not None and search.base is not memory.rungs[0].recipe:
        singles = search.replan()                 # stage 1 on the recipe that fits
    found = run_singles(search, singles)
    run_on_level(search, found)
    decision = recommend(search, found)
    decision = run_input(search, found, decision, last=not opts.batch_size_search)
    measured = [*(memory.rungs if memory else []), *found.singles,
                *(found.on_level.rungs if found.on_level else []), *(found.second.rungs if found.second else []),
                *(r for stage in found.inputs for r in stage.rungs)]
    decision = named_for_memory(search, held_to_limit(search, decision, measured))
    compile_note(found.singles, decision)
    if opts.batch_size_search:
        found.batch = run_batch_search(search, decision)
    if opts.target is not None:                   # the rate pick and its batch sizes, on their time to target
        budget.total_s = opts.budget_s
        found.target, decision = run_target_stage(search, decision, found.singles)
    decision.notes += search.notes
    keep = keep_line(found.first.settings, decision.recipe)     # a script no recipe reaches: its environment
    if keep:
        decision.notes.append(keep[0].upper() + keep[1:])
    write_outputs(search.out_dir, decision, found.first, found.second, budget.elapsed(), opts.budget_s, found.steps,
                  found.on_level, found.batch, found.inputs, found.target)
    finish_tracking(search.tracking, decision, search.out_dir)
    if opts.show:
        print(f"recommended: {decision.name} ({decision.headline()}) — {search.out_dir}/best.yaml, "
              f"{search.out_dir}/tune.md" + (f"; run: {command_line(decision.script)}" if decision.script else ""))
        if keep:
            print(keep)
    return decision
