"""The console carries trainfast's own words: what third-party libraries say as trainfast imports them (torchao's
"<enum ...> is an Enum subclass and is now natively supported by torch.compile", a deprecation a library raises
on its own import) is held here instead of printed, and written to the run's log folder by whoever owns one
(the ablation's `imports.log`).

Only imports trainfast makes are held (`quiet_imports()` around them): a user's script keeps every warning it
raises, in its run log as before. The cost is one `warnings.catch_warnings` and a filter on torch's log handler
for the length of an import: nothing on the hot path.
"""
from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from typing import Iterator

HELD: list[str] = []          # every line held in this process, oldest first (held_lines)

# The loggers a library's import speaks through: torch's own handler (torch._logging puts one on "torch", which does
# not propagate) and the root's (a library that logs without configuring anything).
LOGGERS = ("torch", "")


class Hold(logging.Filter):
    """A handler filter that keeps a record off its handler and in HELD."""

    def filter(self, record: logging.LogRecord) -> bool:
        HELD.append(f"{record.levelname} {record.name}: {record.getMessage()}")
        return False


@contextmanager
def quiet_imports() -> Iterator[None]:
    """Hold the warnings and log records raised inside (a library's import, a model built by a library that imports
    more of itself lazily) in HELD instead of the console. A warning raised from trainfast's own code is said as
    always."""
    hold = Hold()
    handlers = [h for name in LOGGERS for h in logging.getLogger(name).handlers]
    for handler in handlers:
        handler.addFilter(hold)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")         # every one recorded, so none is lost to "once"
            yield
        for w in caught:
            if not is_trainfast(w.filename):
                HELD.append(f"{w.category.__name__} {w.filename}:{w.lineno}: {w.message}")
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)   # trainfast's own: said
    finally:
        for handler in handlers:
            handler.removeFilter(hold)


def is_trainfast(filename: str) -> bool:
    return "trainfast" in filename.replace("\\", "/").split("/")


def held_lines() -> list[str]:
    """Every line held in this process so far (a copy)."""
    return list(HELD)
