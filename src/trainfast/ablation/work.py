"""The kinds of work an ablation runs, behind one protocol (Work): the built-in run and a user's training
command today; a framework adapter is one more kind. The loop (loop.py) knows only the protocol.

A kind of work is prepared once in the parent, where everything it needs is checked before the first run
(a bad model name, a missing script, a rung that cannot work): it rules out the rungs whose switches cannot
act, starts one run of a rung (`launcher`), says which number a run is judged on (`metric`), and may learn
from the first run what the others cannot do (`after_run`).
"""
from __future__ import annotations

import dataclasses
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import torch

from ..curves import CurvePlan, judged_name
from ..frameworks import SECTION as FRAMEWORKS
from ..measure import runs_tf32
from ..probe import PROBE_MODES, PROCESS_SWITCHES
from ..probe.inject import PLAIN
from ..printedmetric import PrintedMetric, check_metric_flags
from ..procs import run_supervised
from ..recipe import Recipe, RecipeError, resolve_device, validate_for_device
from ..results import EffectLabel, Rung, Status
from ..run import as_split, build_module
from ..tasks import Task
from ..target import Target
from ..tasks.effects import changes_effect, data_effect, in_context
from ..techniques import needs_fresh_process, prepare_once, starting_with
from ..techniques.switch import RunContext
from ..techniques.compile import CACHE_ENV, fresh_compile_cache
from .metric import SCRIPT_CHOICE, TASK_METRIC
from .proof import (framework_names, lacks_a_switch, needs_session, no_session_reason, not_applied, process_not_applied,
                    script_settings, unreached, unsupported)
from .rung import Job, TimingBudget, rung_main
from .server import rung_context, start_rung_server
from .script_rungs import note_unchanged, rung_command, rung_env
from .store import write_json

# launch(rung, recipe, budget or None, run_dir, display, time_limit_s) -> the run's record, or {"error", "log_tail"}
Launch = Callable[[Rung, Recipe, "TimingBudget | None", Path, Any, "float | None"], dict]


class Work(Protocol):
    dev: torch.device
    base: Recipe                         # the recipe every rung starts from
    settings: dict[str, Any]             # what identifies this work in plan.json (a resumed plan must match)
    learned: dict[str, Any]              # what its runs revealed, for the report (not compared on resume)
    flops_per_sample: float | None       # the model's, when known here

    def mark_effects(self, plan: list[Rung]) -> None:
        """Rule out the rungs whose switches cannot act on this device, model or data (Status.NO_EFFECT)."""

    def launcher(self, measure: str) -> Launch:
        """What starts one run; `measure`: a PROBE_MODES value (a built-in run always trains to its end)."""

    def metric(self, measure: str) -> tuple[str | None, str | None]:
        """(the metric a run is judged on, "max" or "min"), or (None, None) when runs are only timed."""

    def after_run(self, plan: list[Rung]) -> Callable[[Rung, dict], None] | None:
        """Called after each run: what a run revealed that changes the plan, or None."""

    def aim(self, target: Target, cap_seen: float | None) -> None:
        """--target: the runs started from now on record their curves and stop at `target` (once its level is
        known) or past `cap_seen` samples without it (target.py, curves.py)."""

    # Optional: pair_against(reference), where the work can time each run against the baseline inside the run's
    # own process (the built-in work; a user's command cannot: its loop is its own).


def mark_effects(plan: list[Rung], run: RunContext, effect_of: Callable = data_effect) -> None:
    """Every rung after the baseline whose switches cannot act in `run` (its device, model, data, processes, loop,
    saves and workers: each switch's declarations judge them) is not run: its effect says why. In a cumulative
    ladder what a ruled-out rung switched is not passed on to the rungs below it (a backend that cannot run here,
    carried into the next rung, would fail it)."""
    base, dropped = plan[0].recipe if plan else None, {}
    for rung in plan[1:]:
        inherited = {k: getattr(base, k) for k, v in dropped.items()
                     if k not in rung.changes and getattr(rung.recipe, k) == v}
        if inherited:
            rung.recipe = rung.recipe.replace(**inherited)
        if rung.status == Status.NO_EFFECT:         # ruled out when planned (a slow half type)
            continue
        # each rung is judged under the wrapper its own recipe builds: below an FSDP2 rung, FSDP2's switches act
        wrapped = run if run.strategy is None else dataclasses.replace(run, strategy=rung.recipe.strategy)
        effect = changes_effect(rung.changes, run.device, run.model, run.split, in_context(effect_of, wrapped))
        rung.effect, rung.reason = EffectLabel(effect.label), effect.reason
        if not effect.acts:
            rung.status = Status.NO_EFFECT
            dropped.update({k: v for k, v in rung.changes.items() if getattr(base, k) != v})


@dataclass
class Builtin:
    """The built-in run's model and data, loaded and checked once in the parent (prepare_builtin), and what
    starts one run of it: a process forked from the warm fork server running rung.rung_main."""
    job: Job
    dev: torch.device
    base: Recipe                         # the recipe with num_workers="auto" resolved
    split: Any
    probe_model: torch.nn.Module         # a copy built here: what the switches would act on, and its FLOPs
    flops_per_sample: float | None
    settings: dict[str, Any]
    task: Task                           # tasks/: judges which switches can act on its model and data
    learned: dict[str, Any] = dataclasses.field(default_factory=dict)    # nothing: checked before the runs
    fresh: bool = False                  # every run spawned, none forked from the server (a switch read at start)

    def mark_effects(self, plan: list[Rung]) -> None:
        """As Work's, judged on the model and data; what a switch's runs read is made once here and opened by the
        rungs (Switch.prepare: the decode cache). A plan with a switch read as a runtime loads (passive_threads)
        starts every run, the baseline's too, as a fresh process: that rung needs one, and a baseline forked from
        the warm server would then differ from it by more than the switch (what is imported during the first
        epoch, the memory a process counts)."""
        mark_effects(plan, self.context, self.task.task_effect)
        prepare_once(self.split, [r.recipe for r in plan if r.status != Status.NO_EFFECT])
        self.fresh = any(needs_fresh_process(r.recipe) and r.status != Status.NO_EFFECT for r in plan)

    @property
    def context(self) -> RunContext:
        """The run every rung is: trainfast's own loop, with the base recipe's saves and loader workers."""
        return RunContext(self.dev, self.probe_model, self.split, self.job.nproc, self.base.strategy, builtin=True,
                          saves=bool(self.base.save_every), workers=self.base.num_workers)

    def curve_metric(self) -> tuple[str, str]:
        """The key its curves keep the task's judged metric under, and its goal: what --target auto is about."""
        return judged_name(self.task), self.task.metric.goal

    def aim(self, target: Target, cap_seen: float | None) -> None:
        """Every run evaluates on a schedule and stops at the target or its cap (curves.CurvePlan)."""
        self.job = dataclasses.replace(self.job, curve=CurvePlan(target=target, cap_seen=cap_seen))

    def pair_against(self, reference: Recipe) -> None:
        """Every timed run is also timed against `reference` (the baseline) inside its own process (paired.py)."""
        self.job = dataclasses.replace(self.job, reference=reference)

    def metric(self, measure: str = "speed") -> tuple[str, str]:
        """A built-in run is always trained to its end and evaluated (and timed on the way): its task's metric
        (Task.metric: accuracy, detection's mAP, a language model's validation loss; the run's record holds it as
        `metric`), with the task's goal."""
        return (TASK_METRIC, self.task.metric.goal)

    def after_run(self, plan: list[Rung]) -> None:
        """Nothing a run can reveal changes the plan: the model and data were checked in the parent."""
        return None

    def launcher(self, measure: str = "speed") -> Launch:
        def launch(rung: Rung, recipe: Recipe, run_budget: TimingBudget | None, run_dir: Path, display, limit):
            with starting_with(recipe):                  # the process switches: in the spawned process's environment
                return run_supervised(rung_context(self.fresh), rung_main, (self.job, recipe, run_budget),
                                      on_event=lambda e: display.progress(rung, e), log_path=run_dir / "log.txt",
                                      time_limit_s=limit)
        return launch


@dataclass(frozen=True)
class BuiltinSpec:
    """What the built-in run is made of, as `ablate()` and `tune()` take it: a model (a timm/built-in name or a
    picklable zero-argument factory), data (a spec string, or train_set/val_set datasets), its loss and task."""
    model: str | Callable[[], torch.nn.Module] = "resnet9"
    train_set: Any = None
    val_set: Any = None
    loss_fn: Callable | None = None
    data: str | None = None
    image_size: int | None = None
    mean: Any = None
    std: Any = None
    task: str | None = None


def prepare_builtin(spec: BuiltinSpec, recipe: Recipe | None = None, device: str = "auto", nproc: int = 1) -> Builtin:
    """Everything the built-in runs need, checked here, before the first run starts."""
    from ..tasks import build_task, declared, infer_task

    name = infer_task(spec.task, spec.model, spec.train_set)
    if spec.train_set is None:          # a --data no loader reads: refused before the rung server starts its imports
        declared(name).check_data(spec.data)
    start_rung_server()
    task = build_task(name, spec.loss_fn)
    base = recipe or Recipe()
    dev = resolve_device(device)
    validate_for_device(base, dev)
    task.validate(base)
    if isinstance(spec.model, str):
        task.check_model(spec.model)
    data = spec.data or task.default_data
    split = (as_split(spec.train_set, spec.val_set, mean=spec.mean, std=spec.std) if spec.train_set is not None
             else task.load_data(data, spec.image_size))
    # num_workers="auto" is measured once, here: every rung then runs with the same worker count, so the
    # differences between rungs come from their techniques, not from a noisy per-rung choice.
    base = task.resolve_workers(base, split, dev)
    probe_model = build_module(spec.model, task, split)
    flops_per_sample = task.flops_per_sample(probe_model, split, base)
    # The rungs get the loaded split itself (a forked process receives its tensors through shared memory),
    # not the spec to load again: loading the built-in data costs each process more than its training.
    job = Job(spec.model, split, spec.loss_fn, device, nproc, name)
    image_size = split.image_size or spec.image_size
    settings = {"model": spec.model if isinstance(spec.model, str) else getattr(spec.model, "__qualname__",
                                                                                  repr(spec.model)),
                "data": data if spec.train_set is None else split.name, "image_size": image_size,
                "device": str(dev), "task": name, "metric_name": task.metric.name, "metric_label": task.metric.label,
                "rate_unit": f"{task.rate_unit}/s"}
    per_sample = task.tokens_per_sample(split)
    if per_sample is not None:     # a language model: its rate in documents/s beside tokens/s
        settings["tokens_per_sample"] = per_sample
    if runs_tf32(probe_model, dev):
        settings["fp32_roof"] = "tf32"      # an fp32 rung's kernels run in TF32 here: its roof is TF32's
    return Builtin(job, dev, base, split, probe_model, flops_per_sample, settings, task)


@dataclass
class CommandWork:
    """A user's training command (launch.py): what starts one run of it (the command with the run's switches in
    TRAINFAST_RECIPE, timed by the probe in it, probe/) and what the first run tells about it."""
    cmd: Any                             # launch.Command
    dev: torch.device
    base: Recipe
    switched: list[str]                  # the Recipe fields any run may switch (plus the seed)
    budget: TimingBudget
    settings: dict[str, Any]
    metric_name: str | None = None       # what the script reports (tf.report) that full runs are judged on
    goal: str | None = None              # "max" or "min"; None: from the metric's name
    flops_per_sample: float | None = None     # the script's model is not known here
    # What its runs revealed for the report (a framework, the script's own settings): kept apart from `settings`,
    # which identify the work when a run folder is resumed.
    learned: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The default ladder's rungs for a script no recipe reaches: added to the plan once its baseline shows it
    # has neither a Session nor a framework adapter (the process-wide switches, the only ones that can act).
    if_no_session: list[Rung] = dataclasses.field(default_factory=list)
    # Each task's default ladder, for a script whose task was not given: its baseline's batches pick one
    # (follow_task), which replaces the default ladder before any other rung runs. `task`: the one given.
    by_task: dict[str, list[Rung]] = dataclasses.field(default_factory=dict)
    task: str | None = None
    target: Target | None = None         # --target: the probe records the curve, stops past cap_seen without it
    cap_seen: float | None = None
    # Variables a run of a rung adds to the command's environment beside the recipe (the loop's trackers: the
    # tracker run the script's own runs belong under)
    run_env: Callable[[Rung], dict[str, str]] = lambda rung: {}

    def aim(self, target: Target, cap_seen: float | None) -> None:
        """Every run records a point at each evaluation it reports and stops at the target or its cap (probe/)."""
        self.target, self.cap_seen = target, cap_seen

    def fields(self, recipe: Recipe) -> dict[str, Any]:
        """What reaches the script: the switched fields (its own settings, grad_accum_steps..., stand; the baseline
        turns off what the script turned on), and the settings given to the ablation that every run takes (given)."""
        values = recipe.to_dict()
        return {**given(self.base), **{k: values[k] for k in self.switched}}

    @property
    def ranks(self) -> int:
        """The processes each run of the command is (--nproc; a test's fake command has none: one)."""
        return getattr(self.cmd, "nproc", None) or 1

    @property
    def context(self) -> RunContext:
        """What is known of a run of the command before it runs: its device and processes (its model, data, saves
        and workers are the script's)."""
        return RunContext(self.dev, ranks=self.ranks, strategy=self.base.strategy)

    def mark_effects(self, plan: list[Rung]) -> None:
        """What the device alone rules out (the script's model and data are not known before it runs)."""
        mark_effects(plan, self.context)

    def launcher(self, measure: str) -> Launch:
        """measure "speed": a run stops once warm-up and the timing budget are timed; "full": it runs to its
        end (the metric it reports is compared). A run without a budget (a baseline noise seed) is full."""
        from ..launch import command_main, run_environment
        from ..probe import MeasureSpec

        def launch(rung: Rung, recipe: Recipe, run_budget: TimingBudget | None, run_dir: Path, display, limit):
            spec = MeasureSpec(str((run_dir / "result.json").resolve()), measure if run_budget else "full",
                               steady_window=True, **dataclasses.asdict(self.budget),
                               target=self.target.to_dict() if self.target is not None else None,
                               cap_seen=self.cap_seen, printed_metric=printed_metric(self))
            env = {**self.run_env(rung), **run_environment(self.fields(recipe), spec), **rung_env(rung)}  # --rung's
            argv = rung_command(rung, self.cmd).launch_argv()              # a --rung's flags too
            # A time to target counts compilation: every run pays what a fresh machine pays
            with fresh_compile_cache() if self.target is not None else nullcontext() as cache:
                if cache is not None:
                    env[CACHE_ENV] = cache
                write_json(run_dir / "command.json", {"argv": argv, "env": env, "cwd": os.getcwd()})
                return run_supervised(rung_context(), command_main, (argv, env, str(run_dir)),
                                      log_path=run_dir / "log.txt", time_limit_s=limit)
        return launch

    def metric(self, measure: str) -> tuple[str | None, str | None]:
        """In full mode the metric named by --metric, else the script's own choice (metric.choose_metric: what it
        declares, reports with tf.report, or its validation loss); in speed mode nothing (the runs stop early),
        unless its runs are timed whole (a token script's, probe.Probe.whole_run): each then ran to its end, and
        what it reported is judged as in full mode, at no extra run."""
        whole = measure == "full" or self.learned.get("whole_run")
        return (self.metric_name or SCRIPT_CHOICE, self.goal) if whole else (None, None)

    def after_run(self, plan: list[Rung]) -> Callable[[Rung, dict], None]:
        """The baseline tells whether the script uses a Session or a framework trainfast switches from inside
        (frameworks/); without either no switch can reach it. A framework's rung is ruled out where the
        framework has no setting for its switches, and any run whose switches were not read back as applied
        rules its rung out as "not applied", never timed as no difference."""
        def after(rung: Rung, result: dict[str, Any]) -> None:
            if "error" in result:
                return
            note_unchanged(plan)           # a --rung whose runs were observed doing what the rung above did
            sections = result.get(FRAMEWORKS) or {}
            if rung is plan[0]:
                self.baseline_seen(plan, result, sections)
            elif not sections and not result.get("session", True) and rung.status != Status.NO_EFFECT:
                problem = process_not_applied(rung.changes, result.get(PROCESS_SWITCHES, {}))
                if problem:
                    rung.rule_out(EffectLabel.NOT_APPLIED, problem)
            elif not sections and result.get("unsupported") and rung.status != Status.NO_EFFECT:
                # A Session's switch that its script's own loader gave nothing to act on (no padding to remove)
                why = {k: v for k, v in result["unsupported"].items() if k in rung.changes}
                if why:
                    rung.rule_out(EffectLabel.NOT_APPLICABLE, "; ".join(dict.fromkeys(why.values())))
            elif sections and rung.status != Status.NO_EFFECT:
                lacking = lacks_a_switch(rung.changes, sections)
                problem = not_applied(rung.changes, sections)
                if lacking:
                    rung.rule_out(EffectLabel.NOT_APPLICABLE, lacking)
                elif problem:
                    rung.rule_out(EffectLabel.NOT_APPLIED, problem)
                else:
                    note_carried(rung, sections)
        return after

    def baseline_seen(self, plan: list[Rung], result: dict[str, Any], sections: dict[str, Any]) -> None:
        self.follow_task(plan, result)
        if sections:
            if PLAIN in sections:      # a plain loop (probe/inject.py): reached in measured runs, process-wide too
                self.learned.update(no_session=True, plain_loop=True)
                self.grow(plan)
            self.learned["framework"] = framework_names(sections)
            self.learned["script_settings"] = script_settings(sections)
            fields = {s["field"]: True for rec in sections.values() for s in rec.get("switches", {}).values()}
            self.learned["baseline_not_applied"] = not_applied(fields, sections)
            for other in plan[1:]:
                why = unsupported(other.changes, sections) or lacks_a_switch(other.changes, sections)
                if why and other.status != Status.NO_EFFECT:
                    other.rule_out(EffectLabel.NOT_APPLICABLE, why)
        elif not result.get("session", True):
            # Only the process-wide switches reach it (the environment its process starts with): a rung of
            # those alone is timed, every other rung has no effect.
            self.learned["no_session"] = True
            self.grow(plan)
            why = no_session_reason([r.changes for r in plan[1:]])
            base = plan[0].recipe.to_dict()
            for other in plan[1:]:
                if needs_session(other.changes):
                    other.rule_out(EffectLabel.NO_SESSION, why)
                    continue
                carried = unreached(other.recipe.to_dict(), base)
                if carried and other.status != Status.NO_EFFECT:
                    other.reason = (f"its runs had the process-wide switches only: {', '.join(carried)}, carried "
                                    "from the rungs above, cannot reach a script without a Session")


    def follow_task(self, plan: list[Rung], result: dict[str, Any]) -> None:
        """The task the script's batches showed in its baseline's first run (the probe's `batches`): recorded for
        the report, and where its task was not given and its rungs not named, that task's default ladder replaces
        the default one (only the baseline has run: its runs stand, every other rung is the new ladder's)."""
        if "script_task" in self.learned:  # every baseline run comes here; the first one decided
            return
        if result.get("whole_run"):
            self.learned["whole_run"] = True      # its runs were timed whole (probe.Probe.whole_run): the report says
        seen = result.get("batches") or {}
        by_task, self.by_task = self.by_task, {}
        if self.task is not None:
            self.learned["script_task"] = {"name": self.task, "from": "--task"}
            return
        if not seen.get("task"):
            return
        self.learned["script_task"] = {"name": seen["task"], "from": seen["seen"],
                                      "ladder": seen["task"] in by_task}
        ladder = by_task.get(seen["task"])
        if ladder is None:                 # classification (the default ladder already), or the rungs were named
            return
        mark_effects(ladder, self.context)
        plan[1:] = ladder[1:]

    def grow(self, plan: list[Rung]) -> None:
        """Once, on a script without a Session: the default ladder's process-wide rungs join the plan (the loop
        queues their runs), each ruled out first where this machine cannot run it (reuse_memory off glibc)."""
        added, self.if_no_session = self.if_no_session, []
        if not added:
            return
        mark_effects([plan[0], *added], self.context)
        for rung in added:
            rung.reason = f"{GROWN}; {rung.reason}" if rung.reason else GROWN
        plan.extend(added)
        self.learned["added_rungs"] = [r.name for r in added]


def printed_metric(work: CommandWork) -> dict[str, Any] | None:
    """--metric read from the script's output too (printedmetric.py: a plain loop reports it no other way), by
    --metric-pattern where one was given."""
    pattern = work.settings.get("metric_pattern")
    return PrintedMetric(work.metric_name, pattern).to_dict() if work.metric_name else None


GROWN = ("added to the default ladder: the script has no trainfast.Session, and this switch reaches it through "
         "the environment its process starts with")


def note_carried(rung: Rung, sections: dict[str, Any]) -> None:
    """A switch a cumulative rung carries from a rung above (ruled out or not) that its runs did not end up with:
    its own numbers stand (its switch was applied) and its reason says which carried switch was not."""
    carried = {s["field"]: True for rec in sections.values() for s in rec.get("switches", {}).values()
               if s["field"] not in rung.changes and s["field"] != "seed"}
    problem = not_applied(carried, sections)
    text = f"carried from the rungs above but not applied in its runs: {problem}" if problem else ""
    if text and text not in rung.reason:
        rung.reason = f"{rung.reason}; {text}" if rung.reason else text


def given(base: Recipe) -> dict[str, Any]:
    """A collective's timeout given to the ablation (--dist-timeout) reaches every run of a script: a rank that does not
    arrive ends the run then, named (rankfaults.py). Not given, the script's own timeout stands."""
    return {"dist_timeout_s": base.dist_timeout_s} if base.dist_timeout_s != Recipe.dist_timeout_s else {}


def prepare_command(command: Sequence[str], plan_changes: list[dict[str, Any]], *, recipe: Recipe | None,
                    device: str, nproc: int, measure: str, budget: TimingBudget, metric: str | None = None,
                    goal: str | None = None, if_no_session: Sequence[Rung] = (),
                    by_task: dict[str, list[Rung]] | None = None, task: str | None = None,
                    metric_pattern: str | None = None) -> CommandWork:
    """The command checked before any run (empty, not on PATH, a missing script, a Python that cannot import
    trainfast), and the fields its runs may switch: every field some candidate changes, those of the rungs
    added for a script without a Session (`if_no_session`) and those of each task's ladder its batches may pick
    (`by_task`) included."""
    from ..launch import Command, check_command

    check_measure(measure, goal)
    check_metric_flags(metric, metric_pattern)
    start_rung_server()
    cmd = Command(tuple(command), nproc, measure)
    check_command(cmd)
    by_task = by_task or {}
    candidates = [*plan_changes, *(r.changes for r in if_no_session),
                  *(r.changes for ladder in by_task.values() for r in ladder)]
    switched = sorted({k for changes in candidates for k in changes} | {"seed"})
    settings = {"command": list(cmd.argv), "nproc": nproc, "cwd": os.getcwd(),
                **({"metric_pattern": metric_pattern} if metric_pattern else {})}    # a resume reads it the same way
    return CommandWork(cmd, resolve_device(device), recipe or Recipe(), switched, budget, settings, metric, goal,
                       if_no_session=list(if_no_session), by_task=by_task, task=task)


def check_measure(measure: str, goal: str | None) -> None:
    if measure not in PROBE_MODES:
        raise RecipeError(f"--measure {measure!r} is not one of {', '.join(PROBE_MODES)}")
    if goal not in (None, "max", "min"):
        raise RecipeError(f"--metric-goal {goal!r} must be max or min")
