"""`trainfast.ablate(...)` and `ablate -- COMMAND`: a ladder planned, its work prepared and checked, the loop run."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch

from ..defaults import parse_world_sizes
from ..recipe import Recipe, RecipeError, resolve_device
from ..scriptargs import as_changes, check_rungs
from ..results import AblationResult, Status
from ..tasks import TASKS
from ..techniques import process_wide_fields
from ..techniques.static import rung_names
from .ladders import SCRIPT, plan_rungs, target_ladder
from .loop import LadderOptions, check_positive_int, run_ladder
from .script_rungs import add_script_rungs, script_settings
from .work import BuiltinSpec, prepare_builtin, prepare_command
from .world import ablate_sizes, check_devices

# What `ablate` and `ablate_command` take beside their work: LadderOptions' fields, plus these.
PLAN_OPTIONS = ("rungs", "amp_dtype", "nproc", "out", "script_rungs", "nodes")


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], LadderOptions]:
    """(the plan's options, the loop's LadderOptions) from ablate()'s keyword arguments; an unknown one is
    refused with the names it can be."""
    known = {f.name for f in dataclasses.fields(LadderOptions)}
    unknown = sorted(set(options) - known - set(PLAN_OPTIONS))
    if unknown:
        raise TypeError(f"ablate(): unknown option(s) {', '.join(unknown)}; choose from "
                        f"{', '.join(sorted(known | set(PLAN_OPTIONS)))}")
    plan = {k: options[k] for k in PLAN_OPTIONS if k in options}
    plan.setdefault("nproc", 1)
    if isinstance(plan["nproc"], (tuple, list)):      # world sizes side by side (world.py); one count as always
        try:
            plan["nproc"] = parse_world_sizes(plan["nproc"])
        except ValueError as exc:
            raise RecipeError(str(exc)) from None
    else:
        check_positive_int("--nproc", plan["nproc"])
    loop = LadderOptions(**{k: v for k, v in options.items() if k in known and not (k == "budget" and v is None)})
    return plan, loop


def ablate(model: str | Callable[[], torch.nn.Module] = "resnet9", train_set=None, val_set=None, loss_fn=None, *,
           data: str | None = None, image_size: int | None = None, recipe: Recipe | None = None,
           device: str = "auto", mean=None, std=None, task: str | None = None, **options) -> AblationResult:
    # 11 named parameters: the built-in work as users describe it (model, data, loss, task), the same names as
    # trainfast.train takes; everything about the ladder itself goes through **options (LadderOptions).
    """Run the ladder on the built-in run and write the report folder. `model` is a timm/built-in name (or a
    detection model's) or a picklable zero-argument factory (each rung runs in its own process, so lambdas
    cannot cross). With `train_set`/`val_set` the datasets are used instead of `data` (default: the task's
    built-in data). `task`: classification, or detection (inferred from a detection model's name or a
    DetectionSplit): its own ladder and every rung judged on COCO mAP instead of accuracy.

    `options`: `rungs` (names; default the task's ladder), `amp_dtype` ("auto", "bf16", "fp16"), `nproc` (>1:
    every rung as that many DDP processes, rank 0 reporting; a tuple (1, 2): the ladder at each size, world.py),
    `nodes` (nodes.Nodes: this node's place in a job of several; node 0 returns the result, the others a
    nodes.Followed), `out` (the report folder), and every field of LadderOptions (mode, repeats, noise_seeds, budget,
    min_effect, resume, rung_timeout, show, settle_within_s). Every rung runs `repeats` times, each in a fresh
    process, interleaved, repeat i with seed recipe.seed + i; the baseline `noise_seeds` times in all, so the
    accuracy band includes seed-to-seed training noise."""
    plan_opts, opts = split_options(options)
    if plan_opts.get("script_rungs"):
        raise RecipeError("--rung: a rung of a script's own flags needs the script: trainfast ablate --rung "
                          "NAME='ARGS' -- python train.py ...")
    spec = BuiltinSpec(model, train_set, val_set, loss_fn, data, image_size, mean, std, task)
    sizes = plan_opts["nproc"] if isinstance(plan_opts["nproc"], tuple) else None
    if sizes and getattr(plan_opts.get("nodes"), "several", False):
        raise RecipeError(f"--nproc {','.join(map(str, sizes))}: a list of process counts is measured on one node; "
                          "with --nnodes give one count")
    work = prepare_builtin(spec, recipe, device, sizes[0] if sizes else plan_opts["nproc"])
    if sizes:                  # the same ladder at each size, each size's work the one prepared here
        check_devices(work, sizes)
        return ablate_sizes(sizes, lambda n: builtin_ladder(dataclasses.replace(
            work, job=dataclasses.replace(work.job, nproc=n)), plan_opts, opts), plan_opts.get("out"), opts)
    plan, _, settings = builtin_ladder(work, plan_opts, opts)
    return run_ladder(plan, work, settings, plan_opts.get("out"), opts, nodes=plan_opts.get("nodes"))


def builtin_ladder(work, plan_opts: dict[str, Any], opts: LadderOptions) -> tuple[list, Any, dict[str, Any]]:
    """The built-in work's plan (its effects marked) and settings, at the work's process count."""
    named = plan_opts.get("rungs") or (target_ladder(work.job.task) if opts.target is not None else None)
    plan = plan_rungs(work.base, named, opts.mode, plan_opts.get("amp_dtype", "auto"), work.dev, work.job.task)
    work.mark_effects(plan)
    settings = {**work.settings, "mode": opts.mode, "repeats": opts.repeats, "noise_seeds": opts.noise_seeds,
                "nproc": work.job.nproc, "budget": dataclasses.asdict(opts.budget), "min_effect": opts.min_effect,
                **({"paired": True} if opts.paired else {}),
                **({"memory_limit": opts.memory_limit} if opts.memory_limit else {}),
                "rungs": {r.name: r.recipe.to_dict() for r in plan if r.status != Status.NO_EFFECT}}
    return plan, work, settings


def ablate_command(command: Sequence[str], *, recipe: Recipe | None = None, device: str = "auto",
                   measure: str = "speed", metric: str | None = None, goal: str | None = None,
                   task: str | None = None, metric_pattern: str | None = None, **options) -> AblationResult:
    """`trainfast ablate -- COMMAND`: the ladder on a user's own training command (work.CommandWork). Every run
    starts the command with the rung's switches in TRAINFAST_RECIPE; the probe in it (probe/) times its
    steps and writes the result. `measure="speed"`: each run stops once warm-up plus the timing budget is
    timed. `measure="full"`: each runs to its end and the metric it reports with `tf.report` (`metric`,
    default the first one reported; `goal` "max" or "min", default "min" for names with loss/error in them)
    is compared with the baseline's noise band, as the built-in ablation compares accuracy; a plain loop's is read
    from what it prints (printedmetric.py: `metric` followed by a number, or `metric_pattern`). A command that
    never creates a trainfast.Session is measured too (steps/s from the global optimizer hook): the rungs of
    process-wide switches are timed on it (the default ladder gains them once its baseline shows no Session),
    every other rung is reported as having no effect on it. `task`: the script's task (its ladder); None: the
    task its batches show in the baseline's first run (instruments/batches.py), whose ladder then replaces the
    default one unless `rungs` named the rungs. `script_rungs` (scriptargs.CommandChange, or "NAME=ARGS" as
    --rung takes it): the script's own flags or variables as rungs, after the switches' (with no `rungs`, the
    baseline and these alone).
    `options`: as ablate()'s."""
    plan_opts, opts = split_options(options)
    if isinstance(plan_opts["nproc"], tuple):
        raise RecipeError(f"--nproc {','.join(map(str, plan_opts['nproc']))}: a list of process counts measures the "
                          "built-in run; a `-- COMMAND` takes one count (run the ablation once per size)")
    if opts.target is not None:     # a run must go on to its target (or its cap): the script's whole run, judged
        measure = "full"
    if measure != "full":           # speed mode: nothing to judge accuracy on, so no extra baseline seeds
        opts = dataclasses.replace(opts, noise_seeds=opts.repeats)
    base = recipe or Recipe()
    dev = resolve_device(device)
    amp = plan_opts.get("amp_dtype", "auto")
    own = as_changes(plan_opts.get("script_rungs") or ())      # --rung: the script's own flags, after the switches
    named = plan_opts.get("rungs") or (["baseline"] if own else None)
    ladder = task if task and not named else SCRIPT

    def default(name: str) -> list[str] | None:          # --target: each default ladder with the batch rungs
        return target_ladder(name) if opts.target is not None else None
    plan = plan_rungs(base, named or default(ladder), opts.mode, amp, dev, ladder)
    own = check_rungs(own, rung_names(None))       # every switch's rung name (a Python caller's too)
    add_script_rungs(plan, own, command, opts.mode)
    # The default ladder on a script without a Session: what can reach it is added once its baseline shows that;
    # on a script whose task was not given, its batches pick the ladder (each task's, planned here, checked now).
    grown = [] if named else plan_rungs(base, list(process_wide_fields()), opts.mode, amp, dev, SCRIPT)[1:]
    by_task = {} if named or task else {name: plan_rungs(base, default(name), opts.mode, amp, dev, name)
                                        for name in TASKS if name != "classification"}
    work = prepare_command(command, [r.changes for r in plan], recipe=base, device=device, nproc=plan_opts["nproc"],
                           measure=measure, budget=opts.budget, metric=metric, goal=goal, if_no_session=grown,
                           by_task=by_task, task=task if not named else None, metric_pattern=metric_pattern)
    work.mark_effects(plan)
    settings = {**work.settings, "measure": measure, "metric": {"name": metric, "goal": goal}, "mode": opts.mode,
                "repeats": opts.repeats, "noise_seeds": opts.noise_seeds, "device": str(dev),
                "budget": dataclasses.asdict(opts.budget), "min_effect": opts.min_effect,
                **({"paired": True} if opts.paired else {}),
                **({"memory_limit": opts.memory_limit} if opts.memory_limit else {}),
                "rungs": {r.name: {**work.fields(r.recipe), **script_settings(r)} for r in plan
                          if r.status != Status.NO_EFFECT}}
    return run_ladder(plan, work, settings, plan_opts.get("out"), opts, measure, plan_opts.get("nodes"))
