"""How many times a run's compiled model was compiled, recompiled, and whether it ran past dynamo's recompile limit.

A language model's padded batches change length every step. torch.compile first traces one static graph; the second
new length makes dynamo mark that dimension dynamic and compile again; a later shape may still recompile (a length
of 1 is specialised); and once a frame has been compiled `recompile_limit` times dynamo stops compiling it and runs
it eagerly, with one log warning a run's output easily buries. Each recompile costs seconds inside the timed steps
and the eager fall-back removes what compile bought, so every run records both and the report says so.

How it is counted, and why this way. torch 2.14 has no public recompile count (torch.compiler offers none), so:
  - compiles: dynamo's own counters (`torch._dynamo.utils.counters["frames"]["ok"]`, one per frame compiled,
    first compiles and recompiles alike). They have kept their names since torch 2.0, trainfast's doctor reads
    them already, and torch._dynamo.reset() leaves them alone, so a window's difference is always right.
  - recompiles: the compile ids dynamo hands to its compile-start callbacks (torch._dynamo.callback): "F/N" is
    the N-th compile of frame F, so N > 0 is a recompile by dynamo's own numbering (the one its logs print as
    [F/N]). A frame's first compile cannot be told from a recompile by the counters alone. reset() clears the
    callbacks, so a compile the counters saw and the callback did not (`unseen`) is reported, never guessed.
  - the limit: dynamo counts the graph break it raises when a frame passes the limit under
    counters["unimplemented"] ("Dynamo recompile limit exceeded"; older torch said "cache_size_limit").
Counts are per window (CompileWindow): the difference from when it opened, so one process can hold several runs.
With a step counter (`step_of`: the probe's, the run's optimizer updates so far) each compile is also placed in the
step it happened in (`steps`), so a compile inside the timed steps is left out of the rate as warm-up
(measure/timing.py: compile_left_out).
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from ..measure.compiles import listen_for_compiles, stop_listening

LIMIT_WORDS = ("recompile limit", "recompile_limit", "cache_size_limit", "cache size limit")


def dynamo_counters() -> dict[str, int]:
    """The counters a window differences: frames compiled, graphs, and graph breaks for the recompile limit."""
    from torch._dynamo.utils import counters

    limit = sum(n for reason, n in counters.get("unimplemented", {}).items()
                if any(word in reason.lower() for word in LIMIT_WORDS))
    return {"compiles": counters.get("frames", {}).get("ok", 0),
            "graphs": counters.get("stats", {}).get("unique_graphs", 0),
            "limit_hits": limit}


def is_recompile(compile_id: str) -> bool:
    """Whether dynamo's compile id ("F/N", "!F/N" for compiled autograd, "F/N_1" for a retry) is a frame's N-th
    compile with N > 0."""
    try:
        return int(compile_id.split("/")[1].split("_")[0]) > 0
    except (IndexError, ValueError):
        return False


class CompileWindow:
    """The compiles of one run: open() when the run starts (or as soon as dynamo is imported), read() at its end."""

    def __init__(self, step_of: Callable[[], int | None] | None = None) -> None:
        self.start: dict[str, int] | None = None
        self.ids: list[str] = []
        self.step_of = step_of          # the index of the step now running (None: no step yet), or no counter
        self.steps: list[int] = []      # the step of each compile seen, where step_of knew it

    def open(self) -> "CompileWindow":
        self.start, self.ids, self.steps = dynamo_counters(), [], []
        self.listen()
        return self

    def listen(self) -> None:
        """Register the compile-start callback (again, where torch._dynamo.reset() cleared it)."""
        try:
            from torch._dynamo.callback import CallbackTrigger
        except ImportError:          # a torch without compile callbacks: compiles counted, recompiles unknown
            return
        self.trigger = CallbackTrigger.DYNAMO
        listen_for_compiles(self.on_start)

    def on_start(self, args) -> None:
        # Only dynamo's frame compiles: a deferred backward compile reuses its forward's id.
        if getattr(args, "callback_trigger", None) == self.trigger:
            self.ids.append(str(args.compile_id))
            step = self.step_of() if self.step_of is not None else None
            if step is not None:
                self.steps.append(step)

    def close(self) -> None:
        stop_listening(self.on_start)

    def read(self) -> dict[str, Any] | None:
        """This window's counts; None when it never opened (dynamo never imported: nothing compiled)."""
        if self.start is None or "torch._dynamo" not in sys.modules:
            return None
        now = dynamo_counters()
        counts = {key: now[key] - self.start.get(key, 0) for key in now}
        recompiles = sum(is_recompile(i) for i in self.ids)
        counts["recompiles"] = recompiles
        counts["unseen"] = max(0, counts["compiles"] - len(self.ids))  # compiles the callback missed (a reset)
        counts["recompile_limit"] = recompile_limit()
        self.listen()
        return counts


def recompile_limit() -> int | None:
    """dynamo's per-frame compile limit (recompile_limit; cache_size_limit before torch 2.6)."""
    import torch._dynamo.config as config

    return getattr(config, "recompile_limit", getattr(config, "cache_size_limit", None))


def describe(counts: dict[str, Any] | None) -> str | None:
    """A compiled run's compiles in words for the report; None where nothing was compiled."""
    if not counts or not (counts.get("compiles") or counts.get("limit_hits")):
        return None
    recompiles, hits, unseen = counts.get("recompiles", 0), counts.get("limit_hits", 0), counts.get("unseen", 0)
    text = f"compile: {counts['compiles']} compile(s) in the run, " + (
        f"{recompiles} of them recompiles for new input shapes or guards (each costs compile time inside the run)"
        if recompiles else "no recompiles")
    if unseen:
        text += f"; {unseen} compile(s) not told apart (torch._dynamo.reset() during the run)"
    if hits:
        text += (f"; the recompile limit ({counts.get('recompile_limit')}) was hit {hits} time(s): the shapes "
                 "after it ran eagerly, uncompiled (pad_to_multiple keeps a language model's lengths few)")
    return text
