"""`trainfast ablate|tune|doctor|train|bench-data`. Every Recipe field is one flag (`--set-to-none`,
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

from . import __version__
from .recipe import FIELD_CHOICES, Recipe, RecipeError, field_docs, preset


def _optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "null", "off") else kind(text)
    parse.__name__ = kind.__name__
    return parse


def _int_or_auto(text: str):
    """For `int | str` fields (num_workers: 2 or auto). Anything else is refused by argparse as an int."""
    return text if text == "auto" else int(text)


_int_or_auto.__name__ = "int"      # argparse's message: "invalid int value: 'two'"


def _int_at_least(minimum: int, meaning: str):
    """argparse type for the numeric flags outside the Recipe (the Recipe validates its own fields): a value
    below `minimum` is refused at parse time, before any data or model is built, and argparse names the
    flag: "argument --image-size: must be a positive integer, got 0" (exit code 2)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {meaning}, got {value}")
        return value
    parse.__name__ = "int"
    return parse


_positive_int = _int_at_least(1, "a positive integer")


def _float_in(low: float, high: float | None, meaning: str):
    """The float twin of _int_at_least: low < value (< high when given), refused at parse time."""
    def parse(text: str) -> float:
        value = float(text)
        if not (value > low and (high is None or value < high)):
            raise argparse.ArgumentTypeError(f"must be {meaning}, got {value:g}")
        return value
    parse.__name__ = "float"
    return parse


_positive_float = _float_in(0.0, None, "positive")
_fraction = _float_in(-1e-12, 1.0, "a fraction in [0, 1), e.g. 0.05 for 5%")
_seconds_or_zero = _float_in(-1e-12, None, "0 or more seconds")
_worker_count = _int_at_least(0, "0 or more (or auto)")


def _worker_count_or_auto(text: str):
    return text if text == "auto" else _worker_count(text)


_worker_count_or_auto.__name__ = "int"


def add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("recipe (one flag per Recipe field; default: the field's default)")
    hints = typing.get_type_hints(Recipe)
    docs = field_docs()
    for f in dataclasses.fields(Recipe):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        args = typing.get_args(hint)
        # argparse expands %-formats in help: escape the comments' own % signs
        text = f"{docs.get(f.name, '')} (default: {f.default})".strip().replace("%", "%%")
        if hint is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
        elif type(None) in args:      # Optional[int] / Optional[float]
            inner = next(a for a in args if a is not type(None))
            group.add_argument(flag, dest=f.name, type=_optional(inner), default=None, metavar=inner.__name__.upper(),
                               help=text)
        elif set(args) == {int, str}:  # int | str, e.g. num_workers: 2 or auto
            group.add_argument(flag, dest=f.name, type=_int_or_auto, default=None, metavar="INT|auto", help=text)
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
    parser.add_argument("--image-size", type=_positive_int, default=None,
                        help="input resolution (default: 16 for digits, 32 for synthetic, 224 for an image folder)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available) | cpu | cuda | cuda:N")
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

    add_common(ab)
    ab.add_argument("--mode", choices=LADDER_MODES, default="cumulative",
                    help="cumulative: each rung adds its switches to the rung above; each: one rung's switches at a time on the baseline")
    ab.add_argument("--rungs", default=None, help=f"comma-separated subset of: {','.join(RUNGS)} (fp32 = baseline); "
                                                  f"--task detection: {','.join(DETECTION_LADDER)}, or "
                                                  "non_blocking, fused, autocast-bf16, autocast-fp16")
    ab.add_argument("--amp-dtype", choices=("auto", "bf16", "fp16"), default="auto",
                    help="dtype of the AMP rung; auto = bf16 where the device has fast bf16, else fp16 + GradScaler")
    ab.add_argument("--noise-seeds", type=_positive_int, default=3,
                    help="train the baseline with this many seeds in all to measure accuracy noise (default 3; "
                         "the first --repeats of them are its timed repeats)")
    ab.add_argument("--repeats", type=_positive_int, default=3,
                    help="fresh processes per rung, run in interleaved order; each speed-up's interval comes from "
                         "them (default %(default)s; more repeats: tighter intervals, proportionally longer)")
    ab.add_argument("--settle-within", type=_seconds_or_zero, default=150.0, metavar="SECONDS",
                    help="after the --repeats passes, run every rung once more while a verdict is marked ? (a rerun "
                         "might not repeat it) and the next pass still ends within SECONDS of the ladder's start (at "
                         "most 8 repeats; default %(default)g, which keeps the default ablation under 3 minutes on 2 "
                         "cores; 0: never)")
    ab.add_argument("--timing-steps", type=_positive_int, default=16,
                    help="steady steps (after warm-up) each run is timed over; short epochs are continued "
                         "(default %(default)s)")
    ab.add_argument("--timing-seconds", type=_positive_float, default=60.0,
                    help="...or at least 8 steady steps once they take this long (slow models; default 60)")
    ab.add_argument("--min-effect", type=_fraction, default=0.05,
                    help="smallest speed difference called a gain or a loss, as a fraction (default 0.05 = 5%%)")
    ab.add_argument("--rung-timeout", type=_positive_float, default=None, metavar="SECONDS",
                    help="stop a run that takes longer and report it failed (default: 10x the baseline's first run, "
                         "at least 300 s)")
    ab.add_argument("--resume", action="store_true",
                    help="continue an interrupted ablation in --out DIR: finished runs are reused, the rest run")
    ab.add_argument("--out", default=None, help="report folder (default: runs/ablate-<timestamp>)")
    ab.add_argument("--nproc", type=_positive_int, default=1,
                    help="run every rung as N DDP processes (torch.distributed, gloo on CPU / nccl on CUDA; with a "
                         "COMMAND: under torchrun)")
    cmd = ab.add_argument_group("your own script: trainfast ablate [flags] -- python train.py ARGS")
    cmd.add_argument("--measure", choices=("speed", "full"), default="speed",
                     help="speed (default): stop each run once warm-up and the timing budget are timed; full: run "
                          "the script to its end and compare the metric it reports (tf.report) with the baseline's "
                          "noise band")
    cmd.add_argument("--metric", default=None,
                     help="with --measure full: which tf.report(...) value to compare (default: the first reported)")
    cmd.add_argument("--metric-goal", choices=("max", "min"), default=None,
                     help="whether the metric is better high or low (default: min for names with loss/err, else max)")


def add_tune_flags(tu: argparse.ArgumentParser) -> None:
    add_common(tu)
    tu.add_argument("--budget", default="15m", help="time for the whole search, e.g. 600, 10m, 1h (default 15m); "
                                                    "stages that would not fit are shortened and the report says so")
    tu.add_argument("--repeats", type=_positive_int, default=3, help="fresh processes per candidate (default 3)")
    tu.add_argument("--no-settle", dest="settle", action="store_false",
                    help="run exactly --repeats passes in every stage (default: while a verdict is within the "
                         "noise, more passes, up to 8, with the time the budget leaves)")
    tu.add_argument("--planned-steps", type=_positive_int, default=None,
                    help="optimizer steps of the run the recipe is for (decides compile; default: the recipe's epochs)")
    tu.add_argument("--timing-steps", type=_positive_int, default=16, help="steady steps each run is timed over")
    tu.add_argument("--amp-dtype", choices=("auto", "bf16", "fp16"), default="auto")
    tu.add_argument("--min-effect", type=_fraction, default=0.05)
    tu.add_argument("--switches", default=None, help="comma-separated subset to search (default: every switch that "
                                                      "can act here: O1/O2 levels, set_to_none, prefetch, "
                                                      "channels_last, compile, fused, decode_cache)")
    tu.add_argument("--out", default=None, help="search folder (default: runs/tune-<timestamp>)")
    tu.add_argument("--resume", action="store_true", help="continue an interrupted search in --out DIR")
    tu.add_argument("--batch-size-search", action="store_true",
                    help="then try the recommended recipe at 2x, 4x, 8x its batch size; the largest that is still "
                         "firmly faster and keeps accuracy is reported apart (not written into best.yaml)")
    tcmd = tu.add_argument_group("your own script: trainfast tune [flags] -- python train.py ARGS")
    tcmd.add_argument("--nproc", type=_positive_int, default=1, help="run the command as N processes under torchrun")
    tcmd.add_argument("--metric", default=None,
                      help="the tf.report(...) value the accuracy guard compares (default: the first reported)")
    tcmd.add_argument("--metric-goal", choices=("max", "min"), default=None,
                      help="whether the metric is better high or low (default: min for names with loss/err, else max)")


def add_doctor_flags(dr: argparse.ArgumentParser) -> None:
    add_common(dr)
    dr.add_argument("--steps", type=_positive_int, default=None,
                    help="timed steps after the watched ones (default 10; a script: 10 after 1 + 10 watched)")
    dr.add_argument("--out", default=None, help="folder for doctor.json (default: runs/doctor-<timestamp>)")
    dr.add_argument("--timeout", type=_positive_float, default=600.0,
                    help="with `-- COMMAND`: stop the script after this many seconds (default 600)")
    dr.add_argument("--eval-within", type=_seconds_or_zero, default=120.0, metavar="SECONDS",
                    help="with `-- COMMAND`: most scripts evaluate at the end of an epoch, after the watched steps; "
                         "one that has not evaluated by then is kept running, untimed, until its first evaluation "
                         "or this many seconds, so the evaluation checks see it (default 120: a small epoch; 0: "
                         "stop right after the watched steps)")


def add_train_flags(tr: argparse.ArgumentParser) -> None:
    add_common(tr)
    tr.add_argument("--out", default=None, help="run folder (default: runs/train-<timestamp>)")
    tr.add_argument("--resume", default=None, metavar="auto|FILE",
                    help="auto: continue from the newest good checkpoint in --out DIR/checkpoints (fresh start when "
                         "there is none; use it under torchrun --max-restarts); FILE: resume from that checkpoint")


def add_bench_data_flags(bd: argparse.ArgumentParser) -> None:
    bd.add_argument("--data", required=True, help="imagefolder:PATH")
    bd.add_argument("--batch-size", type=_positive_int, default=64)
    bd.add_argument("--num-workers", type=_worker_count_or_auto, default=2, metavar="INT|auto")
    bd.add_argument("--image-size", type=_positive_int, default=224)
    bd.add_argument("--passes", type=_positive_int, default=5, help="timed passes over the folder per pipeline")
    bd.add_argument("--device", default="auto")


# name -> (the line `trainfast --help` shows, what adds its flags)
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "ablate": ("measure what each technique buys on this model, data and machine", add_ablate_flags),
    "tune": ("find the fastest recipe that keeps accuracy; writes best.yaml", add_tune_flags),
    "doctor": ("what holds this run back, and the mistakes in it (a short run; `-- python train.py ARGS` for your "
               "own script)", add_doctor_flags),
    "train": ("train with a recipe and write a run folder", add_train_flags),
    "bench-data": ("images/s of the input pipeline alone, beside torchvision's default", add_bench_data_flags),
}
# Shown under each subcommand's --help. A script after `--` must create a trainfast.Session for the recipe to
# reach it (three changed lines: README's first screen); without one only its speed is measured.
EXAMPLES = {
    "ablate": """\
  trainfast ablate                                   # the default ladder: resnet9 on the built-in digits
  trainfast ablate --model resnet18 --data imagefolder:PHOTOS --image-size 128
  trainfast ablate --rungs amp,channels_last -- python train.py --epochs 1    # your own script""",
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
  trainfast train --precision bf16 --channels-last --out runs/r9 --resume auto
  torchrun --nproc-per-node 2 -m trainfast train --recipe best.yaml""",
    "bench-data": """\
  trainfast bench-data --data imagefolder:PHOTOS
  trainfast bench-data --data imagefolder:PHOTOS --image-size 128 --num-workers 2 --passes 7""",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainfast", description=__doc__)
    parser.add_argument("--version", action="version", version=f"trainfast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=LazyParser)
    for name, (text, add_flags) in SUBCOMMANDS.items():
        sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".", add_flags=add_flags,
                       epilog="examples:\n" + EXAMPLES[name], formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `trainfast ablate|tune [flags] -- COMMAND ...`: everything after the first `--` is the user's command, as is.
    command = argv[argv.index("--") + 1:] if "--" in argv else None
    argv = argv[:argv.index("--")] if "--" in argv else argv
    args = parser.parse_args(argv)     # unknown flags and bad types exit here, before any work
    args.user_command = command
    if command is not None and args.command not in ("ablate", "tune", "doctor"):
        parser.error(f"`-- COMMAND` is for `trainfast ablate`, `tune` and `doctor`, not `trainfast {args.command}`")
    from .distributed import RankTimeoutError       # these import torch: only once a command runs, never for
    from .measure import LossTermsError, NonFiniteLossError   # --help or --version

    try:
        if args.command == "bench-data":
            from .bench_data import bench_data

            bench_data(args.data, args.batch_size, args.num_workers, args.image_size, args.passes, args.device)
            return 0
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


def prepare_task(args: argparse.Namespace) -> Recipe:
    """Resolve --task, --model and --data (the task's defaults where left out) into `args`, and return the
    recipe: the task's starting point (detection: tasks.detection.DEFAULT_RECIPE) unless --recipe gives one,
    with the explicit flags on top, checked against the task before any data is loaded."""
    from .tasks import build_task, resolve_task

    args.task, args.model, args.data = resolve_task(args.task, args.model, args.data)
    task = build_task(args.task)
    if args.task != "classification" and args.command in ("tune", "doctor") and args.user_command is None:
        raise RecipeError(f"trainfast {args.command} runs the built-in classification run only; measure --task "
                          f"{args.task} with trainfast ablate (or {args.command} -- python your_script.py)")
    recipe = recipe_from_args(args, task.default_recipe if args.recipe is None else None)
    task.validate(recipe)
    task.check_model(args.model)
    return recipe


def _ablate(args, recipe: Recipe) -> int:
    from .ablation import TimingBudget, ablate, ablate_command

    rungs = [r.strip() for r in args.rungs.split(",") if r.strip()] if args.rungs else None
    if args.resume and args.out is None:
        raise ValueError("--resume needs --out DIR: the folder of the ablation to continue")
    options = dict(rungs=rungs, amp_dtype=args.amp_dtype, nproc=args.nproc, out=args.out,    # ablation/api.py
                   mode=args.mode, repeats=args.repeats, noise_seeds=args.noise_seeds,
                   budget=TimingBudget(steps=args.timing_steps, seconds=args.timing_seconds),
                   min_effect=args.min_effect, resume=args.resume, rung_timeout=args.rung_timeout,
                   settle_within_s=args.settle_within)
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
    from .tune import parse_budget, tune

    if args.resume and args.out is None:
        raise ValueError("--resume needs --out DIR: the folder of the search to continue")
    try:
        tune(args.model, data=args.data, image_size=args.image_size, recipe=recipe, device=args.device, out=args.out,
             amp_dtype=args.amp_dtype, repeats=args.repeats, budget_s=parse_budget(args.budget),
             planned_steps=args.planned_steps, timing=TimingBudget(steps=args.timing_steps),
             min_effect=args.min_effect, resume=args.resume, command=args.user_command, nproc=args.nproc,
             metric=args.metric, goal=args.metric_goal, batch_size_search=args.batch_size_search,
             settle=args.settle, switches=[n.strip() for n in args.switches.split(",") if n.strip()] if args.switches else None)
    except KeyboardInterrupt:
        return 130
    return 0


def _doctor(args, recipe: Recipe) -> int:
    """Checks every flag, the device and the model name first, then loads the data and runs the short passes
    (doctor.py); prints the ranked findings and writes doctor.json. Exit status 0 whatever it finds."""
    from datetime import datetime

    import torch

    from .doctor import DEFAULT_STEPS, ScriptFailed, doctor, observe_builtin, observe_script, watch_steps
    from .recipe import resolve_device, validate_for_device

    out = Path(args.out) if args.out else Path("runs") / datetime.now().strftime("doctor-%Y%m%d-%H%M%S")
    steps = args.steps or DEFAULT_STEPS
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
                                 device=str(device), timeout_s=args.timeout, eval_within=args.eval_within,
                                 recipe_fields=fields)
        except ScriptFailed as exc:
            print(f"trainfast doctor: {exc}", file=sys.stderr)
            return 1
    else:
        from .data.loading import load_data
        from .models import build_model, check_model_name

        check_model_name(args.model)
        split = load_data(args.data, args.image_size)
        obs = observe_builtin(lambda: build_model(args.model, split.num_classes, split.image_size), split,
                              recipe=recipe, device=device, steps=steps)
    doctor(obs, out)
    print(f"doctor.json: {out / 'doctor.json'}")
    return 0


def _train(args, recipe: Recipe) -> int:
    from datetime import datetime

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .checkpoint import CheckpointError
    from .measure import LossTermsError, NonFiniteLossError
    from .recipe import resolve_device, validate_for_device
    from .tasks import build_task
    from .trainer import train

    if args.resume is not None and args.out is None:
        raise ValueError("--resume needs --out DIR: the run folder that holds the checkpoints")
    device = resolve_device(args.device)
    validate_for_device(recipe, device)
    task = build_task(args.task)
    split = task.load_data(args.data, args.image_size)
    out = Path(args.out) if args.out else Path("runs") / datetime.now().strftime("train-%Y%m%d-%H%M%S")
    # Under torchrun every rank runs this; rank 0 alone prints (the trainer makes it the only writer).
    rank, world = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("WORLD_SIZE", 1)))
    console = Console(quiet=rank != 0)
    steps_per_epoch = len(split.train) // (recipe.batch_size * world)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("train", total=steps_per_epoch * recipe.epochs, loss="…")

        def on_window(step, stats):
            progress.update(bar, completed=step, loss=f"{stats.losses[-1]:.3f}")

        def on_epoch(record):
            progress.console.print(f"epoch {record['epoch']}: train loss {record['train_loss']:.4f}  "
                                   f"{task.summary(record)}  {record['epoch_time_s']:.1f}s")

        try:
            train(lambda: task.build_model(args.model, split), split, recipe=recipe, device=device, out=out,
                  on_window=on_window, on_epoch=on_epoch, resume=args.resume, task=args.task)
        except (NonFiniteLossError, LossTermsError, CheckpointError) as exc:
            # Non-zero exit; checkpoints already in out/checkpoints are complete and untouched.
            progress.stop()
            print(f"trainfast train: error: {exc}", file=sys.stderr)
            return 1
    console.print(f"run folder: {out}/ (metrics.jsonl, recipe.json, model.pt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
