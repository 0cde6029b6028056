"""The CLI's subcommands and their flags (cli.py runs them), and every check of a command line that needs no
torch: argparse's own (an unknown flag, a bad type or choice, a Recipe field's range), then check_before_torch
(a --recipe that cannot be read, the recipe the flags make and what the task refuses in it, a --data folder that
does not exist, a detection or language-model name the task does not have, a flag the task has no use for, all read
from the task's declaration, tasks/declarations.py). Nothing here imports torch, so a command line that cannot work
is refused in a fraction of a second, not after the seconds torch takes to load; what needs torch to be judged (a
timm model name, the device) is checked by cli.prepare_task, before any data is loaded."""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any, Callable

from . import __version__, selfcheck
from .cliargs import (DEVICE_HELP, AliasHelpFormatter, Duration, add_aliased, add_comparison, add_out, add_resume,
                      add_script_flags, add_switches, add_timing, fill_help_later, format_duration, int_or_auto,
                      optional, positive_int, resume_folder, size_type, target_type, worker_count_or_auto)
from .defaults import (DOCTOR_EVAL_WITHIN, DOCTOR_STEPS, LADDER_MODES, MAX_REPEATS, SETTLE_WITHIN_S, TUNE_BUDGET_S,
                       parse_world_sizes)
from .modelnames import DEFAULT_DETECTION_MODEL, DETECTION_MODELS
from .nodes import nodes_from
from .printedmetric import check_metric_flags
from .scriptargs import CommandChange, check_rungs, parse_rung, read_ladder
from .recipe import FIELD_CHOICES, Recipe, field_docs, field_problem, field_sections, preset
from .tasks import TASKS, TaskDeclaration, declared, infer_task
from .techniques.static import rung_names, unknown_rungs


def field_value(name: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """The argparse type of a Recipe field's flag: `parse`, then the field's own range (recipe.field_problem),
    so argparse names the flag and the value: "argument --batch-size: must be a positive integer, got 0". The
    checks between fields wait for the whole recipe (check_before_torch)."""
    def check(text: str):
        value = parse(text)
        problem = field_problem(name, value)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{problem}, got {text}")
        return value
    check.__name__ = parse.__name__          # argparse's message for what `parse` refuses: "invalid int value"
    return check


def add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per Recipe field, in one help group per section of the Recipe (recipe.field_sections)."""
    hints = typing.get_type_hints(Recipe)
    docs = field_docs()
    section_of = {name: title for title, names in field_sections().items() for name in names}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(Recipe):
        title = section_of.get(f.name, "other fields")
        if title not in groups:
            groups[title] = parser.add_argument_group(f"recipe: {title}")
        group = groups[title]
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
            group.add_argument(flag, dest=f.name, type=field_value(f.name, optional(inner)), default=None,
                               metavar=inner.__name__.upper(), help=text)
        elif set(args) == {int, str}:  # int | str, e.g. num_workers: 2 or auto
            group.add_argument(flag, dest=f.name, type=field_value(f.name, int_or_auto), default=None,
                               metavar="INT|auto", help=text)
        elif f.name in FIELD_CHOICES:
            group.add_argument(flag, dest=f.name, choices=FIELD_CHOICES[f.name], default=None, help=text)
        else:
            group.add_argument(flag, dest=f.name, type=field_value(f.name, hint), default=None,
                               metavar=hint.__name__.upper(), help=text)


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
    parser.add_argument("--task", choices=TASKS, default=None,
                        help="classification (default), detection or lm; inferred from --model (a detection or "
                             "language model's name); for a script (-- COMMAND) the ladder of its task, which is "
                             "otherwise read from its batches")
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
    `trainfast --help` and `trainfast --version` build only the subcommands' names. Building the flags imports no
    torch either (their choices and defaults come from light modules: modelnames, defaults, recipe), so a bad
    flag is refused in a fraction of a second; the help words that name the rungs, which the switches'
    declarations define in modules that import torch, are made only when the help is shown
    (cliargs.help_when_shown)."""

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
        fill_help_later(self)
        return super().format_help()


def add_ablate_flags(ab: argparse.ArgumentParser) -> None:
    add_common(ab)
    ab.add_argument("--mode", choices=LADDER_MODES, default="cumulative",
                    help="cumulative (default): each rung adds its switches to the rung above; each: one rung's "
                         "switches at a time on the baseline")
    add_switches(ab, ablate_rung_names, "the task's ladder")
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
    add_memory_limit(ab, "a rung over it is measured and shown, never recommended")
    add_target(ab, "every run evaluates on its way and stops there (or past 6x the baseline's samples to it), and "
                   "each rung is judged on its time to target (its samples to target over its rate) beside its rate")
    ab.add_argument("--rung-timeout", type=Duration(), default=None, metavar="DURATION",
                    help="stop a run that takes longer and report it failed (default: 10x the baseline's first run, "
                         "at least 5m)")
    add_out(ab, "ablate", "the report")
    add_track(ab, "one run per ablation and one per rung (its switches, rate, speed-up, verdict, memory, metric)")
    add_resume(ab, "continue an interrupted ablation in DIR: finished runs are reused, the rest run")
    ab.add_argument("--nproc", type=world_sizes, default=1, metavar="N",
                    help="run every rung as N processes (built-in run: DDP, gloo on CPU / nccl on CUDA; a COMMAND: "
                         "under torchrun; default %(default)s); a list (1,2): the built-in ladder at each size, side "
                         "by side, with the scaling efficiency (and time to target with --target)")
    add_node_flags(ab)
    cmd = ab.add_argument_group("your own script: trainfast ablate [flags] -- python train.py ARGS")
    cmd.add_argument("--measure", choices=("speed", "full"), default="speed",
                     help="speed (default): stop each run once warm-up and the timing budget are timed; full: run "
                          "the script to its end and compare the metric it reports (tf.report) with the baseline's "
                          "noise band")
    add_script_flags(cmd, "with --measure full")
    add_script_rungs(cmd)


def world_sizes(text: str) -> int | tuple[int, ...]:
    """The argparse type of ablate's --nproc: one count as every count flag takes it, or a list (defaults.py)."""
    if "," not in text:
        return positive_int(text)
    try:
        return parse_world_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_node_flags(parser: argparse.ArgumentParser) -> None:
    """Several nodes (nodes.py): the same command on every node, as torchrun is started; from torchrun's PET_* or a
    SLURM step's variables where a flag is not given."""
    nodes = parser.add_argument_group("several nodes: the same command on every node, each with its --node-rank")
    nodes.add_argument("--nnodes", type=positive_int, default=None, metavar="N",
                       help="nodes in every run (default 1; PET_NNODES or SLURM_STEP_NUM_NODES)")
    nodes.add_argument("--node-rank", type=int, default=None, metavar="K",
                       help="this node's rank, 0 on the node that leads and writes the results (PET_NODE_RANK or "
                            "SLURM_NODEID)")
    nodes.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                       help="node 0's address and a free port; each run meets on one of the 32 ports above it "
                            "(PET_RDZV_ENDPOINT, or MASTER_ADDR:MASTER_PORT in a SLURM step)")
    nodes.add_argument("--rdzv-timeout", type=Duration(), default=None, metavar="DURATION",
                       help="how long the nodes wait for each other before refusing (default 5m)")


def add_script_rungs(group) -> None:
    """--rung NAME='ARGS or ENV=VALUE ...' (repeatable) and --ladder FILE: the script's own flags as rungs."""
    group.add_argument("--rung", action="append", default=[], metavar="NAME='ARGS'",
                       help="a rung of the script's own flags or variables, e.g. --rung bf16='--amp --dtype bf16' or "
                            "--rung tf32='NVIDIA_TF32_OVERRIDE=1': the command with those flags added (or replacing "
                            "its own) and those variables set; repeatable, after the switches' rungs in the ladder")
    group.add_argument("--ladder", default=None, metavar="FILE",
                       help="a YAML list of such rungs, each {name, args, env}, after those of --rung")


def track_type(text: str) -> tuple[str, ...]:
    """The argparse type of --track: track.parse_track, its error as argparse's."""
    from .track.names import parse_track

    try:
        return parse_track(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_track(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--track", type=track_type, action="append", default=None, metavar="NAME[,NAME]",
                        help=f"log to mlflow, wandb and/or tensorboard ({what}; a comma list, or repeated); "
                             "default: the tracker MLFLOW_TRACKING_URI or WANDB_PROJECT / WANDB_MODE already point "
                             "at; none: no tracker")


def add_target(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--target", type=target_type, default=None, metavar="TARGET",
                        help="the level a run must reach: val_loss<=3.2, val_acc>=0.95, or auto (the baseline's "
                             f"median level at the end of its run); {what}")


def add_memory_limit(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--memory-limit", type=size_type, default=None, metavar="SIZE",
                        help=f"the memory a run may use, like 2GiB or 512MiB: {what} (a GPU: the allocator's peak; "
                             "a CPU: the profiled step's tensors, the runtime and libraries left out)")


def ablate_rung_names() -> str:
    """--switches' names in ablate's help. The ladders are derived from the switches' declarations, in modules
    that import torch: called only when the help is shown."""
    from .ablation import DETECTION_LADDER, RUNGS

    return (f"{','.join(RUNGS)} (fp32 = baseline); --task detection: {','.join(DETECTION_LADDER)}, or non_blocking, "
            "fused, autocast-bf16, autocast-fp16")


def tune_switch_names() -> str:
    """--switches' names in tune's help (its priorities, from the switches' declarations): as ablate_rung_names."""
    from .tune import PRIORITY

    return f"the O1/O2 precision levels (autocast-bf16, master-bf16, ...), {','.join(PRIORITY)}"


def add_tune_flags(tu: argparse.ArgumentParser) -> None:
    add_common(tu)
    tu.add_argument("--budget", type=Duration(), default=TUNE_BUDGET_S, metavar="DURATION",
                    help=f"time for the whole search (default {format_duration(TUNE_BUDGET_S)}), kept to within one "
                         "run: every stage and run is priced by the runs measured before it, and what would not fit "
                         "is cut or skipped and said")
    add_switches(tu, tune_switch_names, "every one that can act here")
    add_comparison(tu, "candidate")
    tu.add_argument("--no-settle", dest="settle", action="store_false",
                    help="run exactly --repeats passes in every stage (default: while a verdict is within the "
                         f"noise, more passes, up to {MAX_REPEATS}, with the time the budget leaves)")
    tu.add_argument("--planned-steps", type=positive_int, default=None, metavar="N",
                    help="optimizer steps of the run the recipe is for (decides compile; default: the recipe's epochs)")
    add_timing(tu)
    add_target(tu, "a last stage runs the baseline, the recipe picked on rate and that recipe at half, twice and four "
                   "times its batch side by side, and recommends the one that reaches it soonest")
    add_memory_limit(tu, "the search starts from the fastest of the baseline at smaller batches and the memory "
                         "switches that fits, and recommends nothing over it")
    add_out(tu, "tune", "the search, best.yaml")
    add_track(tu, "one run per search and one per candidate of each stage")
    add_resume(tu, "continue an interrupted search in DIR")
    tu.add_argument("--batch-size-search", action="store_true",
                    help="then try the recommended recipe at 2x, 4x, 8x its batch size; the largest that is still "
                         "firmly faster and keeps accuracy is reported apart (not written into best.yaml)")
    tcmd = tu.add_argument_group("your own script: trainfast tune [flags] -- python train.py ARGS")
    tcmd.add_argument("--nproc", type=positive_int, default=1, metavar="N",
                      help="run the command as N processes under torchrun (default %(default)s; the built-in run is "
                           "one process)")
    add_script_flags(tcmd, "the accuracy guard")
    add_script_rungs(tcmd)


def add_doctor_flags(dr: argparse.ArgumentParser) -> None:
    timeout = 600.0                  # the CLI passes it on (observe_script's timeout_s)

    add_common(dr)
    add_timing(dr, steps=None, budget=False, aliases=("--steps",),   # --steps: tune has --planned-steps
               steps_help=f"steps timed after the watched ones (default {DOCTOR_STEPS}; a script: {DOCTOR_STEPS} "
                          f"after 1 + {DOCTOR_STEPS} watched)")
    add_out(dr, "doctor", "doctor.json")
    script = dr.add_argument_group("your own script: trainfast doctor [flags] -- python train.py ARGS")
    add_aliased(script, "--script-timeout", "--timeout", dest="script_timeout", type=Duration(), default=timeout,
                metavar="DURATION", help=f"stop the script after this long and report it failed (default "
                                         f"{format_duration(timeout)})")
    script.add_argument("--nproc", type=positive_int, default=1, metavar="N",
                        help="run the command as N processes under torchrun: each rank's own figures, the slowest "
                             "named (default %(default)s)")
    script.add_argument("--eval-within", type=Duration(zero=True), default=DOCTOR_EVAL_WITHIN, metavar="DURATION",
                        help="most scripts evaluate at the end of an epoch, after the watched steps; one that has not "
                             "evaluated by then is kept running, untimed, until its first evaluation or this long, so "
                             f"the evaluation checks see it (default {format_duration(DOCTOR_EVAL_WITHIN)}: a small "
                             "epoch; 0: stop right after the watched steps)")


def add_train_flags(tr: argparse.ArgumentParser) -> None:
    add_common(tr)
    add_target(tr, "the run evaluates on its way, stops there and says its time to target")
    add_out(tr, "train", "the run (metrics, recipe, weights, checkpoints/)")
    add_track(tr, "the run: the recipe as params, each epoch's metrics")
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


def add_switches_flags(sw: argparse.ArgumentParser) -> None:
    sw.add_argument("--all", action="store_true", help="also the run's settings (epochs, lr, ...) and every field's "
                                                       "description")


# name -> (the line `trainfast --help` shows, what adds its flags)
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


# --- what is refused after argparse, still before torch loads ------------------------------------------------

def check_data_folder(spec: str | None, task: TaskDeclaration) -> None:
    """A --data folder that does not exist, refused with the loader's own message (data/imagefolder.py,
    data/datasets.py, detection/coco.py, text/corpus.py say these same words after torch has loaded); every other
    spec (a built-in dataset, a folder that exists, a spec the task does not read) is left to the loader to judge."""
    kind, _, path = (spec or "").partition(":")
    if not path or kind not in task.folders or Path(path).is_dir():
        return
    if kind == "text":
        raise ValueError(f"--data {spec}: {path} is not a folder")
    raise ValueError(f"--data {kind}:{Path(path)}: folder does not exist")


def check_before_torch(args: argparse.Namespace) -> None:
    """What can be refused once the flags have parsed, without torch: a --resume and --out that cannot work, --nproc
    for the built-in search, a doctor with no command after `--`, a --switches name no rung has (read from the
    switches' declarations' source, techniques/static.py, with the closest names), and from the task's declaration
    (tasks/declarations.py): a subcommand with no built-in work for the task, a model name the task does not have, a
    --data none of its loaders reads or whose folder does not exist, an --image-size the task has no use for, a
    --recipe that cannot be read, and the recipe the flags make on the task's own starting point (a switch on data
    the task does not offer, one it cannot train with, a field that contradicts another). What needs torch to be
    judged (a timm model name, the device) is left to cli.prepare_task. Raises ValueError (RecipeError, ModelError)
    with the same message the later check would give."""
    if args.command == "bench-data":
        check_data_folder(args.data, declared("classification"))
    if args.command not in ("ablate", "tune", "doctor", "train"):
        return
    if args.command == "ablate":
        args.nodes = nodes_from(args.nnodes, args.node_rank, args.rdzv_endpoint, args.rdzv_timeout)
    if args.command in ("ablate", "tune"):
        resume_folder(args.resume, args.out)
        args.script_rungs = script_rungs_from_args(args)
        check_metric_flags(args.metric, args.metric_pattern)
    if args.command == "tune" and args.nproc > 1 and args.user_command is None:
        raise ValueError("--nproc runs a `-- COMMAND` under torchrun; the built-in search runs one process")
    if args.command == "ablate" and isinstance(args.nproc, tuple) and args.user_command is not None:
        raise ValueError(f"--nproc {','.join(map(str, args.nproc))}: a list of process counts measures the built-in "
                         "run; a `-- COMMAND` takes one count (run the ablation once per size)")
    if args.command == "ablate" and isinstance(args.nproc, tuple) and (getattr(args, "nnodes", None) or 1) > 1:
        raise ValueError(f"--nproc {','.join(map(str, args.nproc))}: a list of process counts is measured on one "
                         "node; with --nnodes give one count")
    if args.command == "doctor" and args.nproc > 1 and args.user_command is None:
        raise ValueError("doctor --nproc runs a `-- COMMAND` under torchrun; the built-in run is watched in one "
                         "process (trainfast ablate --nproc N measures it rank by rank)")
    if args.command == "doctor" and args.user_command == []:
        raise ValueError("doctor -- COMMAND: no command after `--` (e.g. `trainfast doctor -- python train.py`)")
    if args.command == "train" and args.target is not None and not args.target.known:
        raise ValueError("--target auto is the level a baseline's runs reach, which a single run has not: give the "
                         "level (val_loss<=3.2, val_acc>=0.95), or find it with trainfast ablate --target auto")
    task = declared(infer_task(args.task, args.model))
    if args.command in ("ablate", "tune") and args.switches:    # a misspelt rung, said with the closest names
        names = [n.strip() for n in args.switches.split(",") if n.strip()]
        unknown = unknown_rungs(names, rung_names(task.name if args.user_command is None else None))
        if unknown:
            raise ValueError(unknown)
    if args.user_command is None:              # a script's data, model and images are its own
        task.check_command(args.command)
        task.check_image_size(args.image_size)
    if args.model is not None and task.check_name is not None:
        task.check_name(args.model)
    if args.user_command is None:
        task.check_data(args.data)
    check_data_folder(args.data, task)
    task.validate(recipe_from_args(args, task.default_recipe if args.recipe is None else None))


def script_rungs_from_args(args: argparse.Namespace) -> list[CommandChange]:
    """--rung and --ladder read and checked (scriptargs.py): a bad name, an empty rung, a variable that cannot be one,
    two rungs of one name, or either without `-- COMMAND`, refused naming the rung; one named as a switch's rung is
    measured as own_NAME beside it, and said."""
    rungs = [parse_rung(text) for text in args.rung] + (read_ladder(args.ladder) if args.ladder else [])
    if rungs and args.user_command is None:
        given = f"--rung {args.rung[0]}" if args.rung else f"--ladder {args.ladder}"
        raise ValueError(f"{given}: a rung of a script's own flags needs the script after `--`: "
                         f"trainfast {args.command} --rung NAME='ARGS' -- python train.py ...")
    named = check_rungs(rungs, rung_names(None))    # every rung a script's ladder can name
    for given, rung in zip(rungs, named):
        if given.name != rung.name:
            print(f"--rung {given.name}: measured as {rung.name}, beside trainfast's own {given.name} rung",
                  file=sys.stderr)
    return named
