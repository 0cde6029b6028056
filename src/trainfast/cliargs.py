"""The CLI's value types and naming rules, shared by every subcommand so one concept reads and parses the same
way everywhere (docs/cli.md has the table). Nothing here imports torch, not even when a flag is added: a bad
flag is refused before torch loads (help words that must come from a module that imports it are made only when
the help is shown: help_when_shown).

- Durations: every flag that takes a time parses it with `parse_duration` (through `Duration`): `90`, `90s`,
  `10m`, `1.5h`. Their names follow one rule: `--<what>-timeout` stops something and reports it failed,
  `--<what>-within` is a window for optional extra work, `--budget` / `--timing-budget` is time a thing may
  spend before it wraps up as it is.
- Aliases: an old or other spelling of a flag is kept as an extra option string (`add_aliased`); the help
  shows the canonical name and says "alias: ..."."""
from __future__ import annotations

import argparse
import copy
import math
from pathlib import Path
from typing import Any, Callable

from .defaults import MIN_EFFECT, TIMING_FLOOR, TIMING_SECONDS, TIMING_STEPS

# --- numbers --------------------------------------------------------------------------------------------


def optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "null", "off") else kind(text)
    parse.__name__ = kind.__name__
    return parse


def int_or_auto(text: str):
    """For `int | str` fields (num_workers: 2 or auto). Anything else is refused by argparse as an int."""
    return text if text == "auto" else int(text)


int_or_auto.__name__ = "int"      # argparse's message: "invalid int value: 'two'"


def int_at_least(minimum: int, meaning: str):
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


def float_in(low: float, high: float | None, meaning: str):
    """The float twin of int_at_least: low < value (< high when given), refused at parse time."""
    def parse(text: str) -> float:
        value = float(text)
        if not (value > low and (high is None or value < high)):
            raise argparse.ArgumentTypeError(f"must be {meaning}, got {value:g}")
        return value
    parse.__name__ = "float"
    return parse


positive_int = int_at_least(1, "a positive integer")
fraction = float_in(-1e-12, 1.0, "a fraction in [0, 1), e.g. 0.05 for 5%")
worker_count = int_at_least(0, "0 or more (or auto)")


def worker_count_or_auto(text: str):
    return text if text == "auto" else worker_count(text)


worker_count_or_auto.__name__ = "int"

# --- durations ------------------------------------------------------------------------------------------

DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
DURATION_SYNTAX = "a duration like 90, 90s, 10m or 1.5h"


def parse_duration(text: str) -> float:
    """'90' or '90s' -> 90.0, '10m' -> 600.0, '1.5h' -> 5400.0: seconds. A bare number is seconds. Raises
    ValueError for anything else (negative, not finite, an unknown unit)."""
    value = str(text).strip().lower()
    scale = DURATION_UNITS.get(value[-1:], None)
    number = value[:-1] if scale is not None else value
    try:
        seconds = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"{text!r} is not {DURATION_SYNTAX}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{text!r} is not {DURATION_SYNTAX} (0 or more)")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest spelling parse_duration reads back: 900 -> '15m', 7200 -> '2h', 150 -> '150s'."""
    for unit in ("h", "m"):
        count = seconds / DURATION_UNITS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds:g}s"


def size_type(text: str) -> int:
    """The argparse type of --memory-limit: parse_size, its error as argparse's."""
    from .defaults import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


size_type.__name__ = "size"


class Duration:
    """The argparse type of every duration flag: parse_duration, then the flag's own range. `zero`: whether 0
    is allowed (it means "none" / "never" for a window). `whole`: rounded up to whole seconds (an int), for
    Recipe fields kept as integer seconds. A bad value exits 2 naming the flag and the value:
    "argument --budget: must be a duration like 90, 90s, 10m or 1.5h (more than 0), got 'soon'"."""

    __name__ = "duration"

    def __init__(self, *, zero: bool = False, whole: bool = False) -> None:
        self.zero, self.whole = zero, whole

    def __call__(self, text: str) -> float | int:
        try:
            seconds = parse_duration(text)
        except ValueError:
            seconds = None
        if seconds is None or (seconds == 0 and not self.zero):
            limit = "0 or more" if self.zero else "more than 0"
            raise argparse.ArgumentTypeError(f"must be {DURATION_SYNTAX} ({limit}), got {text!r}")
        return math.ceil(seconds) if self.whole else seconds

    def __repr__(self) -> str:
        return f"Duration(zero={self.zero}, whole={self.whole})"


# --- aliases in the help ----------------------------------------------------------------------------------


def add_aliased(parser, canonical: str, *aliases: str, help: str = "", **kwargs: Any) -> argparse.Action:
    """A flag with other accepted spellings: they parse to the same dest; the help lists the canonical name
    only (AliasHelpFormatter) and ends with "(alias: --old)"."""
    action = parser.add_argument(canonical, *aliases, help=with_aliases(help, aliases), **kwargs)
    action.aliases = aliases
    return action


def with_aliases(help: str, aliases: tuple[str, ...]) -> str:
    note = f"(alias: {', '.join(aliases)})" if aliases else ""
    return f"{help} {note}".strip()


def help_when_shown(action: argparse.Action, text: Callable[[], str]) -> None:
    """Help whose words come from a module that imports torch (the rungs, which the switches' declarations
    name): `text()` is called only when the help is shown (fill_help_later, from the subcommand's format_help),
    so building the flags to parse a command line, and refusing one, stays torch-free. Until then the flag keeps
    the help it was added with."""
    action.help_later = text


def fill_help_later(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        text = getattr(action, "help_later", None)
        if text is not None:
            action.help, action.help_later = with_aliases(text(), getattr(action, "aliases", ())), None


class AliasHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows a flag by its canonical name only; its aliases are named in its help text. (argparse already
    uses the first option string in the usage line.)"""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        aliases = getattr(action, "aliases", ())
        if aliases:
            action = copy.copy(action)
            action.option_strings = [s for s in action.option_strings if s not in aliases]
        return super()._format_action_invocation(action)


# --- flags that mean the same in several subcommands: one definition each, so names, types and help agree ---

DEVICE_HELP = "auto (default: cuda if available) | cpu | cuda | cuda:N"
RESUME_LATEST = "auto"      # the bare --resume: the latest state in the output folder (--out)


def add_out(parser, command: str, what: str) -> None:
    parser.add_argument("--out", default=None, metavar="DIR",
                        help=f"output folder: {what} (default: runs/{command}-<timestamp>)")


def add_resume(parser, text: str, metavar: str = "DIR") -> None:
    """`--resume [WHAT]` in every subcommand that can continue: bare = `auto` = the latest state in --out."""
    parser.add_argument("--resume", nargs="?", const=RESUME_LATEST, default=None, metavar=metavar,
                        help=f"{text}; bare (or `auto`): the folder given with --out")


def add_switches(parser, names: Callable[[], str], default: str) -> None:
    """--switches NAMES; `names()` lists them in the help (help_when_shown: they come from the switches'
    declarations, whose modules import torch)."""
    action = add_aliased(parser, "--switches", "--rungs", dest="switches", default=None, metavar="NAMES",
                         help=f"comma-separated switches to try, each one rung (default: {default})")
    help_when_shown(action, lambda: f"comma-separated switches to try, each one rung: {names()} (default: {default})")


def add_timing(parser, steps: int | None = TIMING_STEPS, steps_help: str = "", budget: bool = True,
               aliases: tuple[str, ...] = ()) -> None:
    add_aliased(parser, "--timing-steps", *aliases, type=positive_int, default=steps, metavar="N",
                help=steps_help or "steady steps (after warm-up) each run is timed over; short epochs are continued "
                                   "(default %(default)s)")
    if budget:
        add_aliased(parser, "--timing-budget", "--timing-seconds", dest="timing_budget", type=Duration(),
                    default=TIMING_SECONDS, metavar="DURATION",
                    help=f"...or at least {TIMING_FLOOR} steady steps once they take this long (slow models; "
                         f"default {format_duration(TIMING_SECONDS)})")


def add_comparison(parser, what: str) -> None:
    """--repeats, --min-effect, --amp-dtype: how a ladder of runs is compared, the same in ablate and tune."""
    parser.add_argument("--repeats", type=positive_int, default=3, metavar="N",
                        help=f"fresh processes per {what}, run in interleaved order; each speed-up's interval comes "
                             "from them (default %(default)s; more: tighter intervals, proportionally longer)")
    parser.add_argument("--min-effect", type=fraction, default=MIN_EFFECT, metavar="FRACTION",
                        help="smallest speed difference called a gain or a loss, as a fraction (default %(default)g "
                             f"= {MIN_EFFECT * 100:g}%%)")
    parser.add_argument("--paired", action="store_true",
                        help=f"also time each built-in {what}'s run against the baseline in alternating blocks "
                             "inside its own process, and judge two paired rungs on those ratios (off by default: on "
                             "a CPU the two runs share the allocator, whose state moves the ratio; see "
                             "docs/measurement.md)")
    parser.add_argument("--amp-dtype", choices=("auto", "bf16", "fp16"), default="auto",
                        help="dtype of the mixed-precision switches; auto (default) = bf16 where the device has "
                             "fast bf16, else fp16 + GradScaler")


def add_script_flags(group, metric_use: str) -> None:
    group.add_argument("--metric", default=None,
                       help=f"{metric_use}: which tf.report(...) value to compare (default: the first reported); a "
                            "plain loop's is read from its output, NAME then `:`, `=` or spaces and a number")
    group.add_argument("--metric-pattern", default=None, metavar="REGEX",
                       help="read --metric from each output line this matches, its number in the first group (or "
                            r"(?P<value>...)), the last one the run's, e.g. '\* Acc@1 ([0-9.]+)'")
    group.add_argument("--metric-goal", choices=("max", "min"), default=None,
                       help="whether the metric is better high or low (default: min for names with loss/err, else max)")


# --- --resume [WHAT] ------------------------------------------------------------------------------------

def resume_folder(resume: str | None, out: str | None) -> tuple[bool, str | None]:
    """ablate / tune: `--resume [DIR]` -> (whether to resume, the folder). Bare (or `auto`): the folder given
    with --out; `--resume DIR`: that folder (--out may be left out, or must name the same one)."""
    if resume is None:
        return False, out
    if resume == RESUME_LATEST:
        if out is None:
            raise ValueError("--resume needs --out DIR (or --resume DIR): the folder of the run to continue")
        return True, out
    if out is not None and Path(out).resolve() != Path(resume).resolve():
        raise ValueError(f"--resume {resume} and --out {out} name different folders; give one of them")
    return True, resume


def check_out_folder(out: Path, fresh: bool, probe: bool = True) -> None:
    """train's --out, refused before any work: a path that is a file or lies under one, a folder that cannot
    be made there, and (a fresh run, no --resume) a run folder holding an earlier run's checkpoints. The
    folder is made to prove it can be, and what this made is removed again (the run makes it for real).
    `probe=False` (every rank but global rank 0): the folder is not made and removed, since on a folder every
    node sees that removal could take away the folder rank 0 has just made for real."""
    import shutil

    from .checkpoint import list_checkpoints

    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    first_missing = next((p for p in (out, *out.parents) if not p.exists() and p.parent.exists()), None)
    try:
        if probe:
            out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: the folder cannot be made there ({exc.strerror or exc})") from None
    if first_missing is not None and probe:
        shutil.rmtree(first_missing, ignore_errors=True)
    existing = list_checkpoints(out / "checkpoints") if fresh and (out / "checkpoints").is_dir() else []
    if existing:
        raise ValueError(f"--out {out} holds checkpoints of an earlier run ({existing[0].name}); pass --resume "
                         "auto to continue it, or choose another --out")


def resume_checkpoint(resume: str | None, out: str | None) -> tuple[str | None, str | None]:
    """train: `--resume [WHAT]` -> (the trainer's resume: None, "auto" or a checkpoint file, the run folder).
    Bare (or `auto`): the newest good checkpoint in --out DIR; an existing folder: the newest in that run
    folder (as `--out DIR --resume`); anything else: a checkpoint file, with --out naming the run folder."""
    if resume is None:
        return None, out
    if resume != RESUME_LATEST and Path(resume).is_dir():
        _, folder = resume_folder(resume, out)
        return RESUME_LATEST, folder
    if out is None:
        raise ValueError("--resume needs --out DIR: the run folder that holds the checkpoints")
    return resume, out


def target_type(text: str):
    """The argparse type of --target: target.parse_target, its error as argparse's (checked before torch loads)."""
    from .target import TargetError, parse_target

    try:
        return parse_target(text)
    except TargetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


target_type.__name__ = "target"
