"""A script's own flags as rungs: `ablate --rung NAME='ARGS or ENV=VALUE ...' -- COMMAND` (and --ladder FILE), the
words of each rung parsed, checked and merged into the command, with no torch (the command line is refused before
torch loads).

A command-change rung is the baseline command with some arguments added or replaced and some environment variables
set, measured like a switch's rung (interleaved repeats, noise, verdicts, time to target, memory). The rung's text is
split with shlex, never given to a shell: the leading `NAME=VALUE` words are variables (as a shell reads them before
a command), the rest are flags, each followed by its values. A flag the command already has is replaced where it
stands (`--flag value`, `--flag=value` or a bare `--flag`; a short flag as written), so argparse never sees it twice;
a new one is appended. In the baseline, a flag's values are the words after it that are not flags, as many as the
rung gives it: a positional argument after a bare flag is left where it is.

The ladder's part (where the rungs join a plan, what their runs start with, what they were observed doing) is
ablation/script_rungs.py.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

RUNG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,39}\Z")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
NUMBER = re.compile(r"-\.?\d")          # `-1`, `-0.5`, `-.5`: a value, not a short flag
# What trainfast sets in every run (launch.run_environment): a rung setting one would unmeasure its runs.
RESERVED_ENV = ("TRAINFAST_", "PYTHONPATH")
OWN_PREFIX = "own_"        # a script rung named as a switch's rung is measured as own_NAME beside it
UNCHANGED = "the flag changed nothing trainfast could see"


class RungError(ValueError):
    """A --rung or --ladder entry that cannot work; the message names it."""


@dataclass(frozen=True)
class CommandChange:
    """One rung of the user's own command: `args` added to (or replacing) the baseline's, `env` set in its runs."""
    name: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def then(self, other: "CommandChange") -> "CommandChange":
        """`other` on top of this one (a cumulative ladder): its flags replace these, its variables too."""
        return CommandChange(other.name, tuple(merge_args(list(self.args), other.args, start=0)),
                             {**self.env, **other.env})

    def to_dict(self) -> dict[str, Any]:
        return {"args": list(self.args), "env": dict(self.env)}


def is_flag(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not NUMBER.match(word)


def parse_rung(text: str, where: str = "--rung") -> CommandChange:
    """`NAME=ARGS or ENV=VALUE ...` (a --rung value) as a CommandChange, or a RungError naming it."""
    name, eq, body = text.partition("=")
    if not eq:
        raise RungError(f"{where} {text!r}: give NAME='ARGS or ENV=VALUE ...', e.g. --rung compile='--compile'")
    return build_change(name.strip(), body, {}, f"{where} {text!r}")


def build_change(name: str, args: str | Sequence[str], env: dict[str, Any], where: str) -> CommandChange:
    """A rung from its name, its words (a string split as a shell would, or a list) and its variables, checked."""
    if not RUNG_NAME.match(name):
        raise RungError(f"{where}: the rung name {name!r} must start with a letter and hold only letters, digits, "
                        "_ . - (at most 40 characters)")
    if isinstance(args, str):
        try:
            words = shlex.split(args)
        except ValueError as exc:
            raise RungError(f"{where}: {exc}") from None
    else:
        words = [str(w) for w in args]
    variables = {str(k): str(v) for k, v in env.items()}
    while words and not is_flag(words[0]) and "=" in words[0]:     # leading NAME=VALUE words: variables
        key, _, value = words.pop(0).partition("=")
        variables[key] = value
    for key in variables:
        if not ENV_NAME.match(key):
            raise RungError(f"{where}: {key!r} is not an environment variable name (letters, digits and _, not "
                            "starting with a digit)")
        if key.startswith(RESERVED_ENV):
            raise RungError(f"{where}: {key} is set by trainfast in every run to measure it; a rung cannot set it")
    if words and not is_flag(words[0]):
        raise RungError(f"{where}: {words[0]!r} is neither a flag nor ENV=VALUE (variables come first, then flags, "
                        "each followed by its values)")
    if not words and not variables:
        raise RungError(f"{where}: the rung changes nothing: give the arguments or ENV=VALUE it adds")
    return CommandChange(name, tuple(words), variables)


def check_rungs(changes: Sequence[CommandChange], taken: Sequence[str]) -> list[CommandChange]:
    """The rungs with names that can sit in one ladder: a rung named as a switch's rung (`taken`: `--rung
    compile='--torchcompile'` beside trainfast's own compile) is called own_NAME, so the script's flag and the switch
    are measured side by side; two rungs of one name (after that) are refused with the name."""
    named: list[CommandChange] = []
    for change in changes:
        if change.name in taken:
            change = CommandChange(OWN_PREFIX + change.name, change.args, change.env)
        if change.name in taken or any(c.name == change.name for c in named):
            raise RungError(f"--rung {change.name}: two rungs have this name")
        named.append(change)
    return named


def read_ladder(path: str) -> list[CommandChange]:
    """--ladder FILE: a YAML list of {name, args, env} (args a string split as a shell would, or a list)."""
    import yaml

    where = f"--ladder {path}"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise RungError(f"{where}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise RungError(f"{where}: not YAML: {exc}") from None
    if not isinstance(data, list) or not data:
        raise RungError(f"{where}: must be a list of rungs, each {{name, args, env}}")
    rungs = []
    for i, entry in enumerate(data, 1):
        at = f"{where}, rung {i}"
        if not isinstance(entry, dict):
            raise RungError(f"{at}: must be a mapping with name, args and/or env")
        unknown = sorted(set(entry) - {"name", "args", "env"})
        if unknown:
            raise RungError(f"{at}: unknown key(s) {', '.join(map(str, unknown))}; a rung has name, args, env")
        args, env = entry.get("args") or "", entry.get("env") or {}
        if not isinstance(args, (str, list)) or not isinstance(env, dict):
            raise RungError(f"{at}: args must be a string or a list, env a mapping of NAME: VALUE")
        rungs.append(build_change(str(entry.get("name", "")), args, env, at))
    return rungs


def script_start(argv: Sequence[str]) -> int:
    """Where the script's own arguments begin in `argv`: after `python [options] script.py` or `python -m module`,
    or after the first `*.py` word of another launcher (torchrun ... train.py), else after the program."""
    if argv and Path(argv[0]).name.startswith("python"):
        i = 1
        while i < len(argv):
            word = argv[i]
            if word in ("-m", "-c"):
                return i + 2
            if word in ("-X", "-W"):          # the interpreter options that take a value
                i += 2
                continue
            if not word.startswith("-"):
                return i + 1
            i += 1
        return len(argv)
    return next((i + 1 for i, word in enumerate(argv) if word.endswith(".py")), min(1, len(argv)))


def flag_groups(words: Sequence[str]) -> list[tuple[str, list[str], int]]:
    """A rung's words as (flag, its words, how many values it takes): `--a=1` -> ("--a", ["--a=1"], 1)."""
    groups: list[tuple[str, list[str], int]] = []
    for word in words:
        if is_flag(word):
            name, eq, _ = word.partition("=") if word.startswith("--") else (word, "", "")
            groups.append((name, [word], 1 if eq else 0))
        elif groups:
            name, group, count = groups[-1]
            groups[-1] = (name, [*group, word], count + 1)
    return groups


def merge_args(argv: list[str], args: Sequence[str], start: int | None = None) -> list[str]:
    """`argv` with the rung's `args`: each flag it already has replaced in place (its first occurrence; any
    other removed), each new one appended (before a `--` that ends the script's flags)."""
    begin = script_start(argv) if start is None else start
    head, tail = argv[:begin], list(argv[begin:])
    end = tail.index("--") if "--" in tail else len(tail)
    own, rest = tail[:end], tail[end:]
    appended: list[str] = []
    for name, group, count in flag_groups(args):
        out, placed, i = [], False, 0
        while i < len(own):
            word = own[i]
            if word == name or (name.startswith("--") and word.startswith(name + "=")):
                i += 1
                if word == name:           # its values: the non-flag words after it, as many as the rung gives
                    taken = 0
                    while taken < count and i < len(own) and not is_flag(own[i]) and own[i] != "--":
                        i, taken = i + 1, taken + 1
                if not placed:
                    out += group
                    placed = True
                continue
            out.append(word)
            i += 1
        own = out
        if not placed:
            appended += group
    return head + own + appended + rest


def as_changes(rungs: Sequence[CommandChange | str]) -> list[CommandChange]:
    """The Python API's `script_rungs`: CommandChange objects, or --rung's own text ("bf16=--amp")."""
    return [parse_rung(r, "script_rungs") if isinstance(r, str) else r for r in rungs]
