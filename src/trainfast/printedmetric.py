"""A metric a script prints: the number trainfast judges a plain loop on when the script reports nothing it reads
(no tf.report, no framework's evaluation), taken from the script's own output. pytorch/examples' ImageNet script
prints ` * Acc@1 12.500 Acc@5 50.000` after each validation; `--metric Acc@1` reads it there.

`--metric NAME` alone matches NAME followed by `:`, `=` or spaces and a number (`Acc@1 12.5`, `val_acc: 0.91`,
`loss=0.3`), NAME not being the tail of a longer name (`loss` is not `val_loss`'s). `--metric-pattern REGEX` reads
another shape: the number is its group named `value`, else its first group. Every matching line is a value reported
at that point of the run (a point of its curve under --target); the last one is the run's. A name the script also
prints on its training lines (the ImageNet script's per-batch `Acc@1`) is judged by its last line all the same,
but under --target each training line would be a point: give a pattern that only the validation line matches.

No torch here: the CLI checks a pattern before anything loads.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
NAME_EDGE = r"[\w@./\-]"          # a character that would make NAME the tail (or head) of a longer name


class PatternError(ValueError):
    """--metric-pattern does not compile, or has no group for the number; says which."""


def default_pattern(name: str) -> str:
    """NAME, then `:`, `=` or spaces, then a number (the module docstring)."""
    return rf"(?<!{NAME_EDGE}){re.escape(name)}(?!{NAME_EDGE})(?:\s*[:=]\s*|\s+)(?P<value>{NUMBER})"


def compile_pattern(pattern: str) -> re.Pattern:
    """A --metric-pattern as the reader uses it, or PatternError naming the flag and what is wrong."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise PatternError(f"--metric-pattern {pattern!r} is not a regular expression: {exc}") from None
    if not compiled.groups:
        raise PatternError(f"--metric-pattern {pattern!r} has no group around the number: write one, e.g. "
                           r"'\* Acc@1 ([0-9.]+)' (or name it: (?P<value>...))")
    return compiled


def check_metric_flags(metric: str | None, pattern: str | None) -> None:
    """--metric and --metric-pattern as given: a pattern needs the name it reports its number under."""
    if pattern is None:
        return
    if not metric:
        raise PatternError(f"--metric-pattern {pattern!r} needs --metric NAME: the name its number is judged "
                           "and reported under")
    compile_pattern(pattern)


@dataclass(frozen=True)
class PrintedMetric:
    """What a run reads from its output: `name`, by `pattern` (None: default_pattern(name), read in a plain loop
    only, where nothing else reports it; a pattern given is read in any script)."""
    name: str
    pattern: str | None = None

    @property
    def explicit(self) -> bool:
        return self.pattern is not None

    def regex(self) -> re.Pattern:
        return compile_pattern(self.pattern) if self.pattern is not None else re.compile(default_pattern(self.name))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "pattern": self.pattern}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "PrintedMetric | None":
        return cls(data["name"], data.get("pattern")) if data and data.get("name") else None


def read_value(regex: re.Pattern, line: str) -> float | None:
    """The number of `regex`'s last match in `line` (its `value` group, else its first), or None."""
    value = None
    for match in regex.finditer(line):
        text = match.group("value") if "value" in regex.groupindex else match.group(1)
        try:
            value = float(text)
        except (TypeError, ValueError):
            continue
    return value
