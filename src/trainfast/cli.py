"""`trainfast ablate|tune|doctor|train|bench-data|selfcheck`. Every Recipe field is one flag (`--set-to-none`,
`--num-workers 2`, ...), generated from the dataclass so the two can never drift (cliflags.py). Unknown flags, bad
values, bad config keys, missing folders and unknown model names are refused before torch loads; what needs
torch to be judged (a timm name, the device) is refused before any data is loaded or any model is built."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from . import selfcheck
from .cliargs import check_out_folder, resume_checkpoint, resume_folder
# build_parser and SUBCOMMANDS too: the CLI's names, found here by its callers and tests
from .cliflags import SUBCOMMANDS, build_parser, check_before_torch, parse_command_line, recipe_from_args  # noqa: F401
from .recipe import Recipe, RecipeError
from .track.names import choose_trackers


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    start_process_wide_switches(argv)                    # process switches that must precede torch's import
    args = parse_command_line(argv)                 # argparse's refusals exit 2 here: torch is not loaded yet
    try:
        check_before_torch(args)                    # folders, recipe files, model names: still no torch
    except (RecipeError, ValueError) as exc:
        return refuse(args, exc)
    return run_command(args)


def refuse(args: argparse.Namespace, exc: Exception) -> int:
    print(f"trainfast {args.command}: error: {exc}", file=sys.stderr)
    return 2


def run_command(args: argparse.Namespace) -> int:
    from .checkpoint import WriteError
    from .distributed import RankTimeoutError  # these import torch: only once a command runs, never for
    from .measure import LossTermsError, NonFiniteLossError  # --help, --version or a refused command line

    try:
        if args.command == "selfcheck":
            return selfcheck.main(args)
        if args.command == "switches":
            from .report.switches import field_help, switch_table

            print(switch_table(measured_only=not args.all))
            if args.all:
                print("\n" + field_help())
            return 0
        if args.command == "bench-data":
            from .bench_data import bench_data

            bench_data(args.data, args.batch_size, args.num_workers, args.image_size, args.passes, args.device)
            return 0
        use_gpu_default(args)
        recipe = prepare_task(args)
        if args.command == "ablate":
            return _ablate(args, recipe)
        if args.command == "tune":
            return _tune(args, recipe)
        if args.command == "doctor":
            return _doctor(args, recipe)
        return _train(args, recipe)
    except (RecipeError, ValueError, FileNotFoundError) as exc:
        return refuse(args, exc)
    except (NonFiniteLossError, LossTermsError, RankTimeoutError) as exc:   # decided on every rank at the same step
        print(f"trainfast {args.command}: stopped: {exc}", file=sys.stderr)
        return 1
    except WriteError as exc:          # a full disk or a read-only folder: named, and nothing half-written left
        print(f"trainfast {args.command}: error: {exc}", file=sys.stderr)
        return 1


def start_process_wide_switches(argv: list[str]) -> None:
    """`trainfast train`'s process switches that a runtime reads once as it loads (passive_threads: the OpenMP wait
    policy), put in place before torch is imported, so first of all, before anything that might import it. Only the
    places such a switch can come from are read here (--recipe FILE and each one's --[no-]flag); a recipe that
    cannot be read is left to the full parse and prepare_task to report."""
    from .techniques import process_wide_fields, set_before_torch

    if not argv or argv[0] != "train":
        return
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--recipe")
    for name in process_wide_fields():
        early.add_argument("--" + name.replace("_", "-"), dest=name, action=argparse.BooleanOptionalAction)
    known, _ = early.parse_known_args(argv[1:])
    try:
        recipe = recipe_from_args(argparse.Namespace(recipe=known.recipe, **{
            f.name: getattr(known, f.name, None) for f in dataclasses.fields(Recipe)}))
    except (RecipeError, ValueError, OSError):
        return
    set_before_torch(recipe)


GPU_DEFAULT_FLAGS = ("task", "model", "data", "image_size", "batch_size", "epochs", "switches", "recipe")


def use_gpu_default(args: argparse.Namespace) -> None:
    """`trainfast ablate` with none of the workload's flags, on a machine whose default device is a GPU: the
    classification task's GPU workload (tasks.classification.Classification.gpu_default) instead of the CPU's,
    said before it starts."""
    if args.command != "ablate" or args.user_command is not None or any(getattr(args, f, None) is not None
                                                                         for f in GPU_DEFAULT_FLAGS):
        return
    import torch

    from .tasks.classification import Classification

    if not (args.device in ("auto", "cuda") and torch.cuda.is_available()):
        return
    workload = Classification.gpu_default
    for name, value in workload.items():
        setattr(args, name, value)
    print(f"trainfast ablate: a GPU is here, so the default workload is {workload['model']} on the built-in digits "
          f"at {workload['image_size']} px, batch {workload['batch_size']}, {workload['epochs']} epochs (the CPU's "
          f"default is launch-bound on a GPU); rungs {workload['switches']} (add compile with --switches: each run "
          "then compiles for about a minute). Any workload flag turns this off.", file=sys.stderr)


def prepare_task(args: argparse.Namespace) -> Recipe:
    """Resolve --task, --model and --data (the task's defaults where left out) into `args`, and return the
    recipe: the task's starting point (its declaration's default_recipe) unless --recipe gives one, with the
    explicit flags on top, checked against the task before any data is loaded (check_before_torch has refused
    what needs no torch; this also judges what does, a timm model name, and the GPU default's flags)."""
    from .tasks import build_task, resolve_task

    args.task_given = args.task          # a script's task: given, or read from its batches (ablate -- COMMAND)
    args.task, args.model, args.data = resolve_task(args.task, args.model, args.data)
    task = build_task(args.task)
    if args.user_command is None:
        task.declaration.check_command(args.command)
    recipe = recipe_from_args(args, task.default_recipe if args.recipe is None else None)
    task.validate(recipe)
    task.check_model(args.model)
    return recipe


def split_names(text: str | None) -> list[str] | None:
    """--switches a,b -> ["a", "b"]; not given -> None (the subcommand's default set)."""
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def _ablate(args, recipe: Recipe) -> int:
    from .ablation import TimingBudget, ablate, ablate_command

    resume, out = resume_folder(args.resume, args.out)
    # the python API keeps its names (rungs, budget, settle_within_s); the CLI's are mapped here
    options = dict(rungs=split_names(args.switches), amp_dtype=args.amp_dtype, nproc=args.nproc, out=out,
                   nodes=getattr(args, "nodes", None),
                   mode=args.mode, repeats=args.repeats, noise_seeds=args.noise_seeds,
                   budget=TimingBudget(steps=args.timing_steps, seconds=args.timing_budget),
                   min_effect=args.min_effect, resume=resume, rung_timeout=args.rung_timeout,
                   settle_within_s=args.settle_within, paired=args.paired, memory_limit=args.memory_limit,
                   target=args.target, track=choose_trackers(args.track))
    try:
        if args.user_command is not None:
            result = ablate_command(args.user_command, recipe=recipe, device=args.device, measure=args.measure,
                                    metric=args.metric, goal=args.metric_goal, task=args.task_given,
                                    metric_pattern=args.metric_pattern,
                                    script_rungs=getattr(args, "script_rungs", []), **options)
        else:
            result = ablate(args.model, data=args.data, image_size=args.image_size, recipe=recipe,
                            device=args.device, task=args.task, **options)
    except KeyboardInterrupt:
        return 130                        # the partial report is written; Display said where

    if getattr(result, "follower", False):           # a following node: node 0's exit status
        return result.exit_code
    # Non-zero when a run failed, and when nothing could be recommended (every run failed, or the baseline did).
    return 0 if result.best is not None and all(r.status != "failed" for r in result.rungs) else 1


def _tune(args, recipe: Recipe) -> int:
    from .ablation import TimingBudget
    from .tune import tune
    from .tune.budget import process_started

    resume, out = resume_folder(args.resume, args.out)      # refused already, if it cannot work (check_before_torch)
    try:
        tune(args.model, data=args.data, image_size=args.image_size, recipe=recipe, device=args.device, out=out,
             amp_dtype=args.amp_dtype, repeats=args.repeats, budget_s=args.budget, planned_steps=args.planned_steps,
             timing=TimingBudget(steps=args.timing_steps, seconds=args.timing_budget), min_effect=args.min_effect,
             resume=resume, command=args.user_command, nproc=args.nproc, metric=args.metric, goal=args.metric_goal,
             metric_pattern=args.metric_pattern,
             batch_size_search=args.batch_size_search, settle=args.settle, switches=split_names(args.switches),
             paired=args.paired, task=args.task_given if args.user_command is not None else args.task,
             memory_limit=args.memory_limit, target=args.target, track=choose_trackers(args.track),
             script_rungs=getattr(args, "script_rungs", []), started=process_started())
    except KeyboardInterrupt:
        return 130
    return 0


def _doctor(args, recipe: Recipe) -> int:
    """Checks every flag, the device and the model name first, then loads the data and runs the short passes
    (doctor/); prints the ranked findings and writes doctor.json. Exit status 0 whatever it finds."""
    from datetime import datetime

    import torch

    from .doctor import DEFAULT_STEPS, ScriptFailed, doctor, observe_builtin, observe_script, watch_steps
    from .doctor.progress import DoctorProgress
    from .recipe import resolve_device, validate_for_device

    out = Path(args.out) if args.out else Path("runs") / datetime.now().strftime("doctor-%Y%m%d-%H%M%S")
    steps = args.timing_steps or DEFAULT_STEPS
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        from .envcheck import collect_environment

        # the question the doctor is asked most: say why, not only that
        raise ValueError(f"--device {args.device}: torch sees no GPU: {collect_environment()['no_gpu_reason']}")
    device = resolve_device(args.device)
    validate_for_device(recipe, device)
    if args.user_command:                # an empty one is refused by check_before_torch
        fields = {k: v for k, v in recipe.to_dict().items() if v != getattr(Recipe(), k)}   # the flags given
        try:
            with DoctorProgress() as progress:          # steps done of planned, the time left (as ablate's runs)
                obs = observe_script(args.user_command, out, steps=steps, sync_steps=watch_steps(recipe.log_every),
                                     device=str(device), timeout_s=args.script_timeout,
                                     eval_within=args.eval_within, recipe_fields=fields, nproc=args.nproc,
                                     progress=progress)
        except ScriptFailed as exc:
            print(f"trainfast doctor: {exc}", file=sys.stderr)
            return 1
    else:
        from .tasks import build_task

        task = build_task(args.task)
        split = task.load_data(args.data, args.image_size)
        with DoctorProgress() as progress:
            obs = observe_builtin(lambda: task.build_model(args.model, split), split, recipe=recipe, device=device,
                                  steps=steps, progress=progress)
    doctor(obs, out)
    print(f"doctor.json: {out / 'doctor.json'}")
    return 0


def idle_switches(recipe: Recipe, device, split) -> list[str]:
    """The switches this run turns on that cannot act here (a CUDA-only one on the CPU), each with why: accepted,
    as a recipe moves between machines, but said rather than passed over in silence."""
    import torch

    from .tasks.effects import data_effect, in_context
    from .techniques.switch import RunContext

    default = Recipe()
    workers = recipe.num_workers if isinstance(recipe.num_workers, int) else None
    judge = in_context(data_effect, RunContext(device, None, split, int(os.environ.get("WORLD_SIZE", "1")),
                                               recipe.strategy, builtin=True, workers=workers))
    notes = [f"--{name.replace('_', '-')} has no effect here: {effect.reason}"
             for name in (f.name for f in dataclasses.fields(Recipe))
             if getattr(recipe, name) != getattr(default, name) and isinstance(getattr(recipe, name), bool)
             and not (effect := judge(name, device, None, split)).acts]
    if recipe.strategy == "fsdp" and int(os.environ.get("WORLD_SIZE", "1")) < 2:
        notes.append("--strategy fsdp has no effect here: one process has nothing to shard over (start it under "
                     "torchrun --nproc-per-node N)")
    if recipe.strategy == "dp" and torch.cuda.device_count() < 2:
        notes.append("--strategy dp has no effect here: DataParallel replicates over 2 or more GPUs")
    return notes


def target_line(target, curve: dict) -> str:
    """`train --target`: where the run reached its target, or that it did not."""
    from .target import first_reach

    point = first_reach(curve["curve"], target)
    if point is None:
        return f"target {target.text()}: not reached in {len(curve['curve'])} evaluations"
    return (f"target {target.text()}: reached at step {point['step']}, after {point['train_s']:.1f} s of training "
            f"(evaluation excluded) and {point['seen']:,} samples")


def _train(args, recipe: Recipe) -> int:
    from datetime import datetime

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .checkpoint import CheckpointError
    from .measure import LossTermsError, NonFiniteLossError
    from .recipe import resolve_device, validate_for_device
    from .tasks import build_task
    from .techniques import apply_recipe_rewrites
    from .track import Tracking
    from .trainer import train
    resume, folder = resume_checkpoint(args.resume, args.out)
    device = resolve_device(args.device)
    validate_for_device(recipe, device)
    task = build_task(args.task)
    split = task.load_data(args.data, args.image_size)
    out = Path(folder) if folder else Path("runs") / datetime.now().strftime("train-%Y%m%d-%H%M%S")
    # Under torchrun every rank runs this; rank 0 alone prints (the trainer makes it the only writer).
    rank, world = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("WORLD_SIZE", 1)))
    check_out_folder(out, fresh=resume is None, probe=rank == 0)
    for note in idle_switches(recipe, device, split):
        print(f"note: {note}", file=sys.stderr)
    console = Console(quiet=rank != 0)
    steps_per_epoch = len(split.train) // (apply_recipe_rewrites(recipe).batch_size * world)  # the batch it trains with
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=console)
    bar = progress.add_task("train", total=steps_per_epoch * recipe.epochs, loss="…")
    tracking = (Tracking.open(choose_trackers(args.track), out.name, "train", recipe.to_dict(), out)
                if rank == 0 else None)                    # --track: one run, the recipe as params, epoch metrics

    def build_model():
        # The bar appears once the model exists: a model refused for its input (a named model that cannot take
        # the image size) gets its message on a clean terminal, not under an empty bar.
        model = task.build_model(args.model, split)
        progress.start()
        return model

    def on_window(step, stats):
        progress.update(bar, completed=step, loss=f"{stats.losses[-1]:.3f}")

    def on_epoch(record):
        skipped = (record.get("skipped_files") or 0) + (record.get("val_skipped_files") or 0)
        progress.console.print(f"epoch {record['epoch']}: train loss {record['train_loss']:.4f}  "
                               f"{task.summary(record)}  {record['epoch_time_s']:.1f}s"
                               + (f"  ({skipped} unreadable image(s) skipped, named above)" if skipped else ""))
        if tracking is not None:
            tracking.epoch(record)

    try:
        trained = train(build_model, split, recipe=recipe, device=device, out=out, on_window=on_window,
                        on_epoch=on_epoch, resume=resume, task=args.task, target=args.target)
    except (NonFiniteLossError, LossTermsError, CheckpointError) as exc:
        # Non-zero exit; checkpoints already in out/checkpoints are complete and untouched.
        progress.stop()
        print(f"trainfast train: error: {exc}", file=sys.stderr)
        if tracking is not None:
            tracking.end("failed")
        return 1
    finally:
        progress.stop()
    if tracking is not None:
        tracking.artifacts(out)
        tracking.end()
    if trained.curve is not None:
        console.print(target_line(args.target, trained.curve))
    console.print(f"run folder: {out}/ (metrics.jsonl, recipe.json, model.pt"
                  + (", curve.json)" if trained.curve is not None else ")"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
