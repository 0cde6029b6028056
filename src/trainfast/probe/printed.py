"""A measured run's printed metric (printedmetric.py): the script's stdout and stderr read line by line as they are
written, each line that matches a value reported to the probe, as a framework's evaluation is (a point of the curve
under --target; the run record's `reported`, where the ablation's metric choice, its accuracy verdicts and the
report's metric column read every script's values). The record's section "printed_metric" says what was read.

The streams are wrapped, not redirected: every write goes through to the script's own stream first, unchanged, and
reading a line costs one regular-expression search. Only this process reads (a forked DataLoader worker inherits the
wrapper and passes its writes through). The default pattern is read in a plain loop only: a Session's tf.report or a
framework's evaluation already reports its values, structured, and its printed copies would add nothing but points.
"""
from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from ..printedmetric import PrintedMetric, read_value

SECTION = "printed_metric"
MAX_PARTIAL = 1 << 16          # a "line" this long without an end is dropped, not kept growing


class PrintedSection:
    """The section and its reader: `metrics` is what the record's `reported` takes from it (record.script_said)."""

    def __init__(self, probe: Any, wanted: PrintedMetric) -> None:
        self.probe, self.wanted = probe, wanted
        self.regex = wanted.regex()
        self.metrics: dict[str, float] = {}
        self.matches = 0
        self.skipped = 0                     # matches left to a Session's or a framework's own reports
        self.last_line: str | None = None
        self.pid = os.getpid()

    def to_dict(self) -> dict[str, Any]:
        return {**self.wanted.to_dict(), "value": self.metrics.get(self.wanted.name), "matches": self.matches,
                "left_to_the_script_reports": self.skipped, "last_line": self.last_line}

    def overridden(self) -> dict[str, Any]:
        return {}

    def plain(self) -> bool:
        """Neither a Session nor a framework adapter reports this run's values (probe/inject.py's plain loop)."""
        from .inject import PLAIN

        board = self.probe.sections.get("frameworks")
        return self.probe.session is None and not (set(getattr(board, "frameworks", None) or ()) - {PLAIN})

    def line(self, text: str) -> None:
        if os.getpid() != self.pid:
            return
        value = read_value(self.regex, text)
        if value is None:
            return
        if not self.wanted.explicit and not self.plain():
            self.skipped += 1
            return
        self.matches += 1
        self.metrics[self.wanted.name] = value
        self.last_line = text.strip()[:200]
        self.probe.reported({self.wanted.name: value})      # may end the run past its cap (StopRun), as tf.report


class LineReader:
    """One of the script's streams, passed through, each completed line handed to `section.line`."""

    def __init__(self, stream: TextIO, section: PrintedSection) -> None:
        self._stream, self._section, self._partial = stream, section, ""

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self.feed(text)
        return written

    def writelines(self, lines) -> None:
        for text in lines:
            self.write(text)

    def feed(self, text: str) -> None:
        if not isinstance(text, str):
            return
        self._partial += text
        if "\n" not in text and "\r" not in text:
            if len(self._partial) > MAX_PARTIAL:
                self._partial = ""
            return
        *done, self._partial = self._partial.replace("\r", "\n").split("\n")
        for line in done:
            try:
                self._section.line(line)
            except Exception:            # never the script's print that fails for trainfast's reading
                continue

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def install(probe: Any, wanted: PrintedMetric | None) -> PrintedSection | None:
    """In a measured run asked for a printed metric: its section, and the process's stdout and stderr read."""
    if wanted is None:
        return None
    section = PrintedSection(probe, wanted)
    probe.sections[SECTION] = section
    sys.stdout = LineReader(sys.stdout, section)
    sys.stderr = LineReader(sys.stderr, section)
    return section
