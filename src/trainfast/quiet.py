"""The console carries trainfast's own words: what third-party libraries say as trainfast imports them (torchao's
"<enum ...> is an Enum subclass and is now natively supported by torch.compile", a deprecation a library raises
on its own import) is held here instead of printed, and written to the run's log: the ablation writes the parent's
to `imports.log` in its report folder, and a run's own process, whose stderr is its log file
(procs.child_main), writes them there as they come.

Only imports trainfast makes are held (`quiet_imports()` around them): a user's script keeps every warning it
raises, in its run log as before. The cost is one `warnings.catch_warnings` and a filter on torch's log handler
for the length of an import: nothing on the hot path.
"""
from __future__ import annotations

import logging
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator

HELD: list[str] = []          # every line held in this process, oldest first (held_lines)
TO_STDERR = [False]           # this process's stderr is a log file, not a console: held lines are written there

# The loggers a library's import speaks through: torch's own handler (torch._logging puts one on "torch", which does
# not propagate) and the root's (a library that logs without configuring anything).
LOGGERS = ("torch", "")


class Hold(logging.Filter):
    """A handler filter that keeps a record off its handler and in HELD."""

    def filter(self, record: logging.LogRecord) -> bool:
        hold(f"{record.levelname} {record.name}: {record.getMessage()}")
        return False


def hold(line: str) -> None:
    HELD.append(line)
    if TO_STDERR[0]:
        print(line, file=sys.stderr)


def write_held_to_stderr() -> None:
    """From now on (and for what is held already) this process's stderr is its run's log: held lines go there."""
    TO_STDERR[0] = True
    for line in HELD:
        print(line, file=sys.stderr)


@contextmanager
def quiet_imports() -> Iterator[None]:
    """Hold the warnings and log records raised inside (a library's import, a model built by a library that imports
    more of itself lazily) in HELD instead of the console. A warning raised from trainfast's own code is said as
    always."""
    holder = Hold()
    handlers = [h for name in LOGGERS for h in logging.getLogger(name).handlers]
    for handler in handlers:
        handler.addFilter(holder)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")         # every one recorded, so none is lost to "once"
            yield
        for w in caught:
            if not is_trainfast(w.filename):
                hold(f"{w.category.__name__} {w.filename}:{w.lineno}: {w.message}")
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)   # trainfast's own: said
    finally:
        for handler in handlers:
            handler.removeFilter(holder)


def is_trainfast(filename: str) -> bool:
    return "trainfast" in filename.replace("\\", "/").split("/")


def held_lines() -> list[str]:
    """Every line held in this process so far (a copy)."""
    return list(HELD)
