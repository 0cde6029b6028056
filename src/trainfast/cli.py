"""`trainfast ablate|tune|doctor|train|bench-data|selfcheck`. Every Recipe field is one flag (`--set-to-none`,
`--num-workers 2`, ...), generated from the dataclass so the two can never drift. Unknown flags, bad values and
bad config keys are refused before any data is loaded or any model is built."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from pathlib import Path
from typing import Any, Callable

from . import __version__, selfcheck
from .cliargs import (DEVICE_HELP, AliasHelpFormatter, Duration, add_aliased, add_comparison, add_out, add_resume,
                      add_script_flags, add_switches, add_timing, check_out_folder, format_duration, int_or_auto,
                      optional, positive_int, resume_checkpoint, resume_folder, worker_count_or_auto)
from .recipe import FIELD_CHOICES, Recipe, RecipeError, field_docs, preset


def add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("recipe (one flag per Recipe field; default: the field's default)")
    hints = typing.get_type_hints(Recipe)
    docs = field_docs()
    for f in dataclasses.fields(Recipe):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        args = typing.get_args(hint)
        default = format_duration(f.default) if f.name.endswith("_s") else f.default
        # argparse expands %-formats in help: escape the comments' own % signs
        text = f"{docs.get(f.name, '')} (default: {default})".strip().replace("%", "%%")
        if f.name.endswith("_s"):      # seconds (dist_timeout_s): --dist-timeout DURATION, the unit in the value
            add_aliased(group, flag[:-2], flag, dest=f.name, type=Duration(whole=True), default=None,
                        metavar="DURATION", help=text)
        elif hint is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
        elif type(None) in args:      # Optional[int] / Optional[float]
            inner = next(a for a in args if a is not type(None))
            group.add_argument(flag, dest=f.name, type=optional(inner), default=None, metavar=inner.__name__.upper(),
                               help=text)
        elif set(args) == {int, str}:  # int | str, e.g. num_workers: 2 or auto
            group.add_argument(flag, dest=f.name, type=int_or_auto, default=None, metavar="INT|auto", help=text)
        elif f.name in FIELD_CHOICES:
            group.add_argument(flag, dest=f.name, choices=FIELD_CHOICES[f.name], default=None, help=text)
        else:
            group.add_argument(flag, dest=f.name, type=hint, default=None, metavar=hint.__name__.upper(), help=text)


def recipe_from_args(args: argparse.Namespace, base: Recipe | None = None) -> Recipe:
    """--recipe (a preset name or a YAML file) gives the base; explicit flags override its fields."""
    if base is None:
        source = getattr(args, "recipe", None)
        if source is None:
            base = Recipe()
        elif Path(source).suffix.lower() in (".yaml", ".yml", ".json"):
            base = Recipe.from_file(source)
        else:
            base = preset(source)
    changes = {f.name: getattr(args, f.name) for f in dataclasses.fields(Recipe) if getattr(args, f.name) is not None}
    return base.replace(**changes) if changes else base


def add_common(parser: argparse.ArgumentParser) -> None:
    from .detection.models import DEFAULT_DETECTION_MODEL, DETECTION_MODELS
    from .tasks import TASKS

    parser.add_argument("--task", choices=TASKS, default=None,
                        help="classification (default) or detection; inferred as detection when --model is a "
                             "detection model")
    parser.add_argument("--model", default=None,
                        help="classification: built-in resnet9 (default) or any timm model name; detection: "
                             f"{' | '.join(DETECTION_MODELS)} (default {DEFAULT_DETECTION_MODEL})")
    parser.add_argument("--data", default=None,
                        help="classification: digits (default, ships with scikit-learn) | synthetic | imagefolder:PATH "
                             "| cifar10:PATH; detection: synthetic (default: shapes on real photos) | "
                             "synthetic:digits | coco:PATH")
    parser.add_argument("--image-size", type=positive_int, default=None,
                        help="input resolution (default: 16 for digits, 32 for synthetic, 224 for an image folder)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument("--recipe", default=None, help="a preset (baseline, fast) or a YAML recipe file")
    add_recipe_flags(parser)


class LazyParser(argparse.ArgumentParser):
    """A subcommand's parser whose flags are added on first use (parsing its arguments, or its help), so
    `trainfast --help` and `trainfast --version` import no torch: the flags' choices and help name the tasks,
    models and rungs, from modules that import it."""

    def __init__(self, *args: Any, add_flags: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_flags = add_flags

    def ensure_flags(self) -> None:
        add_flags, self.add_flags = self.add_flags, None
        if add_flags is not None:
            add_flags(self)

    def parse_known_args(self, args=None, namespace=None):     # what the parent parser calls on a subcommand
        self.ensure_flags()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self.ensure_flags()
        return super().format_usage()

    def format_help(self) -> str:
        self.ensure_flags()
        return super().format_help()


def add_ablate_flags(ab: argparse.ArgumentParser) -> None:
    from .ablation import DETECTION_LADDER, LADDER_MODES, RUNGS
    from .ablation.loop import MAX_REPEATS, SETTLE_WITHIN_S

    add_common(ab)
    ab.add_argument("--mode", choices=LADDER_MODES, default="cumulative",
                    help="cumulative (default): each rung adds its switches to the rung above; each: one rung's "
                         "switches at a time on the baseline")
    add_switches(ab, f"{','.join(RUNGS)} (fp32 = baseline); --task detection: {','.join(DETECTION_LADDER)}, or "
                     "non_blocking, fused, autocast-bf16, autocast-fp16", "the task's ladder")
    add_comparison(ab, "rung")
    ab.add_argument("--noise-seeds", type=positive_int, default=3, metavar="N",
                    help="train the baseline with this many seeds in all to measure accuracy noise (default "
                         "%(default)s; the first --repeats of them are its timed repeats)")
    ab.add_argument("--settle-within", type=Duration(zero=True), default=SETTLE_WITHIN_S, metavar="DURATION",
                    help="after the --repeats passes, run every rung once more while a verdict is marked ? (a rerun "
                         "might not repeat it) and the next pass still ends within DURATION of the ladder's start "
                         f"(at most {MAX_REPEATS} repeats; default {format_duration(SETTLE_WITHIN_S)}, which keeps "
                         "the default ablation under 3 minutes on 2 cores; 0: never)")
    add_timing(ab)
    ab.add_argument("--rung-timeout", type=Duration(), default=None, metavar="DURATION",
                    help="stop a run that takes longer and report it failed (default: 10x the baseline's first run, "
                         "at least 5m)")
    add_out(ab, "ablate", "the report")
    add_resume(ab, "continue an interrupted ablation in DIR: finished runs are reused, the rest run")
    ab.add_argument("--nproc", type=positive_int, default=1, metavar="N",
                    help="run every rung as N processes (built-in run: DDP, gloo on CPU / nccl on CUDA; a COMMAND: "
                         "under torchrun; default %(default)s)")
    cmd = ab.add_argument_group("your own script: trainfast ablate [flags] -- python train.py ARGS")
    cmd.add_argument("--measure", choices=("speed", "full"), default="speed",
                     help="speed (default): stop each run once warm-up and the timing budget are timed; full: run "
                          "the script to its end and compare the metric it reports (tf.report) with the baseline's "
                          "noise band")
    add_script_flags(cmd, "with --measure full")


def add_tune_flags(tu: argparse.ArgumentParser) -> None:
    from .ablation.loop import MAX_REPEATS
    from .tune import PRIORITY, TuneOptions

    add_common(tu)
    tu.add_argument("--budget", type=Duration(), default=TuneOptions.budget_s, metavar="DURATION",
                    help=f"time for the whole search (default {format_duration(TuneOptions.budget_s)}); stages that "
                         "would not fit are shortened and the report says so")
    add_switches(tu, f"the O1/O2 precision levels (autocast-bf16, master-bf16, ...), {','.join(PRIORITY)}",
                 "every one that can act here")
    add_comparison(tu, "candidate")
    tu.add_argument("--no-settle", dest="settle", action="store_false",
                    help="run exactly --repeats passes in every stage (default: while a verdict is within the "
                         f"noise, more passes, up to {MAX_REPEATS}, with the time the budget leaves)")
    tu.add_argument("--planned-steps", type=positive_int, default=None, metavar="N",
                    help="optimizer steps of the run the recipe is for (decides compile; default: the recipe's epochs)")
    add_timing(tu)
    add_out(tu, "tune", "the search, best.yaml")
    add_resume(tu, "continue an interrupted search in DIR")
    tu.add_argument("--batch-size-search", action="store_true",
                    help="then try the recommended recipe at 2x, 4x, 8x its batch size; the largest that is still "
                         "firmly faster and keeps accuracy is reported apart (not written into best.yaml)")
    tcmd = tu.add_argument_group("your own script: trainfast tune [flags] -- python train.py ARGS")
    tcmd.add_argument("--nproc", type=positive_int, default=1, metavar="N",
                      help="run the command as N processes under torchrun (default %(default)s; the built-in run is "
                           "one process)")
    add_script_flags(tcmd, "the accuracy guard")


def add_doctor_flags(dr: argparse.ArgumentParser) -> None:
    from .doctor import DEFAULT_EVAL_WITHIN, DEFAULT_STEPS

    timeout = 600.0                  # the CLI passes it on (observe_script's timeout_s)

    add_common(dr)
    add_timing(dr, steps=None, budget=False, aliases=("--steps",),   # --steps: tune has --planned-steps
               steps_help=f"steps timed after the watched ones (default {DEFAULT_STEPS}; a script: {DEFAULT_STEPS} "
                          f"after 1 + {DEFAULT_STEPS} watched)")
    add_out(dr, "doctor", "doctor.json")
    script = dr.add_argument_group("your own script: trainfast doctor [flags] -- python train.py ARGS")
    add_aliased(script, "--script-timeout", "--timeout", dest="script_timeout", type=Duration(), default=timeout,
                metavar="DURATION", help=f"stop the script after this long and report it failed (default "
                                         f"{format_duration(timeout)})")
    script.add_argument("--eval-within", type=Duration(zero=True), default=DEFAULT_EVAL_WITHIN, metavar="DURATION",
                        help="most scripts evaluate at the end of an epoch, after the watched steps; one that has not "
                             "evaluated by then is kept running, untimed, until its first evaluation or this long, so "
                             f"the evaluation checks see it (default {format_duration(DEFAULT_EVAL_WITHIN)}: a small "
                             "epoch; 0: stop right after the watched steps)")


def add_train_flags(tr: argparse.ArgumentParser) -> None:
    add_common(tr)
    add_out(tr, "train", "the run (metrics, recipe, weights, checkpoints/)")
    add_resume(tr, "continue from the newest good checkpoint in the run folder DIR (fresh start when there is none; "
                   "use it under torchrun --max-restarts), or from the checkpoint FILE", metavar="DIR|FILE")


def add_bench_data_flags(bd: argparse.ArgumentParser) -> None:
    bd.add_argument("--data", required=True, help="imagefolder:PATH")
    bd.add_argument("--batch-size", type=positive_int, default=64, metavar="INT",
                    help="samples per batch (default %(default)s)")
    bd.add_argument("--num-workers", type=worker_count_or_auto, default=2, metavar="INT|auto",
                    help="DataLoader worker processes, or auto (default %(default)s)")
    bd.add_argument("--image-size", type=positive_int, default=224, help="input resolution (default %(default)s)")
    bd.add_argument("--passes", type=positive_int, default=5, metavar="N",
                    help="timed passes over the folder per pipeline (default %(default)s)")
    bd.add_argument("--device", default="auto", help=DEVICE_HELP)


# name -> (the line `trainfast --help` shows, what adds its flags)
def add_switches_flags(sw: argparse.ArgumentParser) -> None:
    sw.add_argument("--all", action="store_true", help="also the run's settings (epochs, lr, ...) and every field's "
                                                       "description")


SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "ablate": ("measure what each technique buys on this model, data and machine", add_ablate_flags),
    "tune": ("find the fastest recipe that keeps accuracy; writes best.yaml", add_tune_flags),
    "doctor": ("what holds this run back, and the mistakes in it (a short run; `-- python train.py ARGS` for your "
               "own script)", add_doctor_flags),
    "train": ("train with a recipe and write a run folder", add_train_flags),
    "bench-data": ("images/s of the input pipeline alone, beside torchvision's default", add_bench_data_flags),
    "selfcheck": (selfcheck.HELP, selfcheck.add_flags),
    "switches": ("every switch: its Recipe fields, rungs, scope, and how each framework sets it", add_switches_flags),
}
# Shown under each subcommand's --help. A script after `--` must create a trainfast.Session for the recipe to
# reach it (three changed lines: README's first screen); without one only its speed is measured.
EXAMPLES = {
    "ablate": """\
  trainfast ablate                                   # the default ladder: resnet9 on the built-in digits
                                                     # (on a GPU: ResNet-50 on them at 160 px, batch 256)
  trainfast ablate --model resnet18 --data imagefolder:PHOTOS --image-size 128
  trainfast ablate --out runs/a1 --resume                     # continue an interrupted ablation
  trainfast ablate --switches amp,channels_last -- python train.py --epochs 1    # your own script""",
    "tune": """\
  trainfast tune --budget 15m                        # writes runs/tune-*/best.yaml
  trainfast tune --model resnet18 --data imagefolder:PHOTOS --image-size 128 --budget 30m
  trainfast tune --budget 20m -- python train.py --epochs 1""",
    "doctor": """\
  trainfast doctor                                   # the built-in run
  trainfast doctor -- python train.py --epochs 1     # your own script, as it is
  trainfast doctor --model resnet18 --data imagefolder:PHOTOS --num-workers 2""",
    "train": """\
  trainfast train --recipe runs/tune-X/best.yaml --model resnet18 --data imagefolder:PHOTOS --epochs 10
  trainfast train --precision bf16 --channels-last --out runs/r9 --resume    # continue from its newest checkpoint
  torchrun --nproc-per-node 2 -m trainfast train --recipe best.yaml""",
    "bench-data": """\
  trainfast bench-data --data imagefolder:PHOTOS
  trainfast bench-data --data imagefolder:PHOTOS --image-size 128 --num-workers 2 --passes 7""",
    "selfcheck": selfcheck.EXAMPLES,
    "switches": """\
  trainfast switches               # the measured switches, one markdown row each
  trainfast switches --all         # every Recipe field's owner, the run's settings included""",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainfast", description=__doc__)
    parser.add_argument("--version", action="version", version=f"trainfast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=LazyParser)
    for name, (text, add_flags) in SUBCOMMANDS.items():
        sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".", add_flags=add_flags,
                       epilog="examples:\n" + EXAMPLES[name], formatter_class=AliasHelpFormatter)
    return parser


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    """The flags, and the user's command after `--` as `args.user_command` (None without one). The command
    is cut off before argparse sees it, so a flag with an optional value (`--resume [DIR]`) never swallows it."""
    parser = build_parser()
    # `trainfast ablate|tune [flags] -- COMMAND ...`: everything after the first `--` is the user's command, as is.
    command = argv[argv.index("--") + 1:] if "--" in argv else None
    argv = argv[:argv.index("--")] if "--" in argv else argv
    args, unknown = parser.parse_known_args(argv)    # bad types exit here, before any work
    if unknown:              # refused by the subcommand's parser: its usage line, not the top level's
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
        sub.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.user_command = command
    if command is not None and args.command not in ("ablate", "tune", "doctor"):
        parser.error(f"`-- COMMAND` is for `trainfast ablate`, `tune` and `doctor`, not `trainfast {args.command}`")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    start_process_switches(argv)                    # before torch loads (the parser's flags import it)
    args = parse_command_line(argv)
    from .checkpoint import WriteError
    from .distributed import RankTimeoutError  # these import torch: only once a command runs, never for
    from .measure import LossTermsError, NonFiniteLossError  # --help or --version

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
        print(f"trainfast {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (NonFiniteLossError, LossTermsError, RankTimeoutError) as exc:   # decided on every rank at the same step
        print(f"trainfast {args.command}: stopped: {exc}", file=sys.stderr)
        return 1
    except WriteError as exc:          # a full disk or a read-only folder: named, and nothing half-written left
        print(f"trainfast {args.command}: error: {exc}", file=sys.stderr)
        return 1


def start_process_switches(argv: list[str]) -> None:
    """`trainfast train`'s process switches that a runtime reads once as it loads (passive_threads: the OpenMP wait
    policy), put in place before torch is imported, so before the full parser, whose flags import it. Only the
    places such a switch can come from are read here (--recipe FILE and each one's --[no-]flag); a recipe that
    cannot be read is left to the full parse and prepare_task to report."""
    from .techniques import process_wide, set_before_torch

    if not argv or argv[0] != "train":
        return
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--recipe")
    for name in process_wide():
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
    recipe: the task's starting point (detection: tasks.detection.DEFAULT_RECIPE) unless --recipe gives one,
    with the explicit flags on top, checked against the task before any data is loaded."""
    from .tasks import build_task, resolve_task

    args.task, args.model, args.data = resolve_task(args.task, args.model, args.data)
    task = build_task(args.task)
    if args.task == "detection" and args.command in ("tune", "doctor") and args.user_command is None:
        raise RecipeError(f"trainfast {args.command} runs the built-in classification run only; measure --task "
                          f"{args.task} with trainfast ablate (or {args.command} -- python your_script.py)")
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
                   mode=args.mode, repeats=args.repeats, noise_seeds=args.noise_seeds,
                   budget=TimingBudget(steps=args.timing_steps, seconds=args.timing_budget),
                   min_effect=args.min_effect, resume=resume, rung_timeout=args.rung_timeout,
                   settle_within_s=args.settle_within, paired=args.paired)
    try:
        if args.user_command is not None:
            result = ablate_command(args.user_command, recipe=recipe, device=args.device, measure=args.measure,
                                    metric=args.metric, goal=args.metric_goal, **options)
        else:
            result = ablate(args.model, data=args.data, image_size=args.image_size, recipe=recipe,
                            device=args.device, task=args.task, **options)
    except KeyboardInterrupt:
        return 130                        # the partial report is written; Display said where

    # Non-zero when a run failed, and when nothing could be recommended (every run failed, or the baseline did).
    return 0 if result.best is not None and all(r.status != "failed" for r in result.rungs) else 1


def _tune(args, recipe: Recipe) -> int:
    from .ablation import TimingBudget
    from .tune import tune

    resume, out = resume_folder(args.resume, args.out)
    if args.nproc > 1 and args.user_command is None:
        raise ValueError("--nproc runs a `-- COMMAND` under torchrun; the built-in search runs one process")
    try:
        tune(args.model, data=args.data, image_size=args.image_size, recipe=recipe, device=args.device, out=out,
             amp_dtype=args.amp_dtype, repeats=args.repeats, budget_s=args.budget, planned_steps=args.planned_steps,
             timing=TimingBudget(steps=args.timing_steps, seconds=args.timing_budget), min_effect=args.min_effect,
             resume=resume, command=args.user_command, nproc=args.nproc, metric=args.metric, goal=args.metric_goal,
             batch_size_search=args.batch_size_search, settle=args.settle, switches=split_names(args.switches),
             paired=args.paired)
    except KeyboardInterrupt:
        return 130
    return 0


def _doctor(args, recipe: Recipe) -> int:
    """Checks every flag, the device and the model name first, then loads the data and runs the short passes
    (doctor/); prints the ranked findings and writes doctor.json. Exit status 0 whatever it finds."""
    from datetime import datetime

    import torch

    from .doctor import DEFAULT_STEPS, ScriptFailed, doctor, observe_builtin, observe_script, watch_steps
    from .recipe import resolve_device, validate_for_device

    out = Path(args.out) if args.out else Path("runs") / datetime.now().strftime("doctor-%Y%m%d-%H%M%S")
    steps = args.timing_steps or DEFAULT_STEPS
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        from .envcheck import collect_environment

        # the question the doctor is asked most: say why, not only that
        raise ValueError(f"--device {args.device}: torch sees no GPU: {collect_environment()['no_gpu_reason']}")
    device = resolve_device(args.device)
    validate_for_device(recipe, device)
    if args.user_command is not None:
        if not args.user_command:
            raise ValueError("doctor -- COMMAND: no command after `--` (e.g. `trainfast doctor -- python train.py`)")
        fields = {k: v for k, v in recipe.to_dict().items() if v != getattr(Recipe(), k)}   # the flags given
        try:
            obs = observe_script(args.user_command, out, steps=steps, sync_steps=watch_steps(recipe.log_every),
                                 device=str(device), timeout_s=args.script_timeout, eval_within=args.eval_within,
                                 recipe_fields=fields)
        except ScriptFailed as exc:
            print(f"trainfast doctor: {exc}", file=sys.stderr)
            return 1
    else:
        from .tasks import build_task

        task = build_task(args.task)
        split = task.load_data(args.data, args.image_size)
        obs = observe_builtin(lambda: task.build_model(args.model, split), split, recipe=recipe, device=device,
                              steps=steps)
    doctor(obs, out)
    print(f"doctor.json: {out / 'doctor.json'}")
    return 0


def idle_switches(recipe: Recipe, device, split) -> list[str]:
    """The switches this run turns on that cannot act here (a CUDA-only one on the CPU), each with why: accepted,
    as a recipe moves between machines, but said rather than passed over in silence."""
    import torch

    from .tasks.effects import field_effect

    default = Recipe()
    notes = [f"--{name.replace('_', '-')} has no effect here: {effect.reason}"
             for name in (f.name for f in dataclasses.fields(Recipe))
             if getattr(recipe, name) != getattr(default, name) and isinstance(getattr(recipe, name), bool)
             and not (effect := field_effect(name, device, None, split)).acts]
    if recipe.strategy == "fsdp" and int(os.environ.get("WORLD_SIZE", "1")) < 2:
        notes.append("--strategy fsdp has no effect here: one process has nothing to shard over (start it under "
                     "torchrun --nproc-per-node N)")
    if recipe.strategy == "dp" and torch.cuda.device_count() < 2:
        notes.append("--strategy dp has no effect here: DataParallel replicates over 2 or more GPUs")
    return notes


def _train(args, recipe: Recipe) -> int:
    from datetime import datetime

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .checkpoint import CheckpointError
    from .measure import LossTermsError, NonFiniteLossError
    from .recipe import resolve_device, validate_for_device
    from .tasks import build_task
    from .trainer import train

    resume, folder = resume_checkpoint(args.resume, args.out)
    device = resolve_device(args.device)
    validate_for_device(recipe, device)
    task = build_task(args.task)
    split = task.load_data(args.data, args.image_size)
    out = Path(folder) if folder else Path("runs") / datetime.now().strftime("train-%Y%m%d-%H%M%S")
    check_out_folder(out, fresh=resume is None)
    for note in idle_switches(recipe, device, split):
        print(f"note: {note}", file=sys.stderr)
    # Under torchrun every rank runs this; rank 0 alone prints (the trainer makes it the only writer).
    rank, world = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("WORLD_SIZE", 1)))
    console = Console(quiet=rank != 0)
    steps_per_epoch = len(split.train) // (recipe.batch_size * world)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=console)
    bar = progress.add_task("train", total=steps_per_epoch * recipe.epochs, loss="…")

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

    try:
        train(build_model, split, recipe=recipe, device=device, out=out,
              on_window=on_window, on_epoch=on_epoch, resume=resume, task=args.task)
    except (NonFiniteLossError, LossTermsError, CheckpointError) as exc:
        # Non-zero exit; checkpoints already in out/checkpoints are complete and untouched.
        progress.stop()
        print(f"trainfast train: error: {exc}", file=sys.stderr)
        return 1
    finally:
        progress.stop()
    console.print(f"run folder: {out}/ (metrics.jsonl, recipe.json, model.pt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
