"""A distributed run that failed, said by rank: which rank died (its exit code or signal, where it was last seen, its
last lines), or which rank a collective waited for when the others gave up on it.

Without this a failed `ablate --nproc N` run says "the command exited with status 1" over torchrun's own 40-line
traceback, and the rank whose error is printed is often not the one at fault: a rank killed by the kernel leaves no
traceback, and the ranks that waited for it fail loudest ("Connection reset by peer"); a rank stuck in its loader
makes the others time out in the gradient all-reduce, and it is their timeout that is printed. What is left behind
says more:
  - torchrun's summary of the failure (its ChildFailedError table, or the elastic API's `failures`) names every rank
    that ended, with its exit code or signal, and the first one to end (its root cause);
  - each rank of a measured run writes a heartbeat (`Heartbeat`): its phase in the step (waiting for its next batch,
    forward, backward, optimizer step) and how many steps it has closed, every HEARTBEAT_S from a thread of its own,
    so a rank stuck in C code or asleep in its loader still reports where it is;
  - each rank's own lines in the log, prefixed by torchrun's `--tee` ("[default1]:") or by torch's own handler of
    a rank's uncaught exception ("[rank1]:").
A collective waits for every rank: the one that did not arrive is the rank behind the others, last seen outside the
collective (in its loader or its forward) while they sat in their backward.

No torch here: the parent of a run reads these after the run's processes are gone.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HEARTBEAT_S = 0.5            # how often each rank writes where it is: a file of ~100 bytes, replaced
HEARTBEATS = "ranks"         # the folder in a run's folder where its ranks' heartbeats are written
HEARTBEATS_ENV = "TRAINFAST_HEARTBEATS"     # that folder, for the ranks (set by the ablation for each run)
LAST_LINES = 5               # a failed rank's own last lines quoted in the message

# A step's phases in the order a rank goes through them; "backward" holds DDP's gradient all-reduce, the collective a
# rank that lags keeps the others waiting in.
PHASES = {"start": "before its first step", "data": "waiting for its next batch", "forward": "in its forward",
          "backward": "in its backward (the gradient all-reduce)", "optimizer": "in its optimizer step",
          "done": "after its timed steps"}
IN_STEP = ("data", "forward", "backward", "optimizer")     # phases said with the step they belong to
ORDER = {"start": -1, "data": 0, "forward": 1, "backward": 2, "optimizer": 3, "done": 4}
TIMEOUT_WORDS = ("timed out", "timeout", "monitoredbarrier")

ROOT_CAUSE = re.compile(r"^\s*Root Cause")
# Lines of a rank's log that are the runtime's notices, not what the rank said (a profiler's start and stop, a C++
# warning printed by every rank alike): left out of its last lines.
NOISE = re.compile(r"^(?:(?:USDT|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d |\[W\d{4} )")
RANK_FIELD = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
EXIT_FIELD = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")


class RankFailed(RuntimeError):
    """A distributed run ended because of one of its ranks; the message names it. It explains itself: no traceback
    of trainfast's after the ranks' own output (procs.child_main)."""
    explained = True


@dataclass(frozen=True)
class RankExit:
    """One rank of a failed job, as the launcher saw it end."""
    rank: int
    local_rank: int
    exitcode: int
    pid: int | None = None
    first: bool = False       # the launcher's root cause: the first rank to end


def parse_rank_exits(lines: list[str]) -> list[RankExit]:
    """The ranks torchrun's failure table lists (ChildFailedError: "rank : 1 (local_rank: 1)", "exitcode : -9 (pid:
    N)"), the root cause marked `first`; [] for a log without one."""
    exits, rank, in_root = [], None, False
    for line in lines:
        line = strip_prefix(line)
        if ROOT_CAUSE.match(line):
            in_root = True
        elif (m := RANK_FIELD.match(line)) is not None:
            rank = (int(m.group(1)), int(m.group(2)))
        elif rank is not None and (m := EXIT_FIELD.match(line)) is not None:
            pid = int(m.group(2)) if m.group(2) else None
            exits.append(RankExit(rank[0], rank[1], int(m.group(1)), pid, first=in_root))
            rank = None
    return exits


def strip_prefix(line: str) -> str:
    return re.sub(r"^\[(?:default|rank)\d+\]:", "", line)


def exits_of(failures: dict[int, object], first: int | None) -> list[RankExit]:
    """The elastic API's ChildFailedError.failures (global rank -> ProcessFailure) as RankExits."""
    return [RankExit(rank, int(getattr(f, "local_rank", rank)), int(getattr(f, "exitcode", 1)),
                     getattr(f, "pid", None), first=rank == first) for rank, f in sorted(failures.items())]


def rank_lines(lines: list[str], rank: int, local_rank: int, count: int = LAST_LINES) -> list[str]:
    """A rank's own last lines in the job's log: those torchrun's --tee prefixed with its local rank, else those torch
    prefixed with its rank (its uncaught exception's traceback)."""
    for prefix in (f"[default{local_rank}]:", f"[rank{rank}]:"):
        own = [line[len(prefix):] for line in lines if line.startswith(prefix)]
        own = [strip_prefix(line).strip() for line in own if line.strip()]
        own = [line for line in own if not NOISE.match(line)]
        if own:
            return own[-count:]
    return []


def describe_end(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def seen(beat: dict | None) -> str:
    """Where a heartbeat last placed its rank: "last seen waiting for its next batch in step 5"."""
    if not beat:
        return "never seen (it wrote no heartbeat)"
    phase = beat.get("phase")
    step = f" in step {int(beat.get('step', 0)) + 1}" if phase in IN_STEP else ""
    return f"last seen {PHASES.get(phase, phase)}{step}"


def laggard(beats: dict[int, dict]) -> int | None:
    """The rank the others waited for: the one furthest behind in (steps closed, phase), when it is behind every
    other rank; None when no rank is (or fewer than two wrote)."""
    if len(beats) < 2:
        return None
    where = {rank: (int(b.get("step", 0)), ORDER.get(b.get("phase"), 0)) for rank, b in beats.items()}
    slowest = min(where, key=lambda r: where[r])
    ahead = [r for r in where if r != slowest]
    return slowest if all(where[r] > where[slowest] for r in ahead) else None


def describe_rank_fault(exits: list[RankExit], beats: dict[int, dict], lines: list[str],
                        world: int | None = None) -> str | None:
    """What a failed distributed job's ranks say about why it failed (the module docstring), or None when nothing
    names a rank. A collective that timed out (the first rank to end said so) names the rank it waited for
    (`laggard`); otherwise the launcher's root cause is the rank at fault: how it ended, where it was last seen, its
    last lines."""
    world = world or (max([e.rank for e in exits] + list(beats)) + 1 if exits or beats else 0)
    of = f" of {world}" if world else ""
    root = next((e for e in exits if e.first), exits[0] if exits else None)
    behind = laggard(beats)
    own = rank_lines(lines, root.rank, root.local_rank) if root is not None else []
    timed_out = any(word in line.lower() for line in own for word in TIMEOUT_WORDS)
    # Only a timeout says a rank waited for another: a rank that raised (or was killed) is the fault, wherever the
    # others were.
    if behind is not None and (timed_out or root is None) and not killed(root, behind):
        waited = "; ".join(f"rank {r} was {seen(b)}" for r, b in sorted(beats.items()) if r != behind)
        text = f"rank {behind}{of} did not arrive at a collective: it was {seen(beats[behind])}, while {waited}"
        if root is not None:
            why = next((line.strip() for line in reversed(own) for word in TIMEOUT_WORDS if word in line.lower()),
                       None)
            text += (f"; rank {root.rank} gave up waiting" + (f" ({why})" if why else "")
                     + f" and {describe_end(root.exitcode)}")
        return text
    if root is None:
        return None
    detail = ([f"exit code {root.exitcode}"] if root.exitcode < 0 else []) + ([f"pid {root.pid}"] if root.pid else [])
    text = f"rank {root.rank}{of} {describe_end(root.exitcode)}" + (f" ({', '.join(detail)})" if detail else "")
    if beats:
        text += f", {seen(beats.get(root.rank))}"
    return text + ("; its last lines: " + " | ".join(own) if own else "; it printed nothing before it ended")


def explain_time_limit(result: dict, folder: str | Path) -> dict:
    """A run stopped at its time limit (procs.run_supervised: "timed_out") whose ranks' heartbeats show one behind
    the others: its error says which rank the job was waiting for, and where (a collective whose own timeout is longer
    than the run's limit). Any other result is returned as it is."""
    if not result.get("timed_out"):
        return result
    fault = describe_rank_fault([], read_heartbeats(folder), [])
    return {**result, "error": f"{result['error']}; {fault}"} if fault is not None else result


def killed(root: RankExit | None, behind: int) -> bool:
    """A rank killed by a signal is behind the others because it is dead: it is the root cause, not a laggard."""
    return root is not None and root.exitcode < 0 and root.rank == behind


# --------------------------------------------------------------------------------------------------
# in each rank


class Heartbeat:
    """This rank's phase and step count (`where()` -> (phase, steps)), written to `folder`/rank{R}.json every
    HEARTBEAT_S by a daemon thread: a few microseconds of the step's time, none of it in the step itself."""

    def __init__(self, folder: str | Path, rank: int, where: Callable[[], tuple[str, int]]) -> None:
        self.path = Path(folder) / f"rank{rank}.json"
        self.rank, self.where = rank, where
        self.stopped = threading.Event()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass                                # beat() fails quietly too: the run goes on without its heartbeat
        self.beat()
        threading.Thread(target=self._run, name="trainfast-heartbeat", daemon=True).start()

    def beat(self) -> None:
        phase, step = self.where()
        record = {"rank": self.rank, "pid": os.getpid(), "phase": phase, "step": step, "at": time.time()}
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.path)         # the parent never reads half a heartbeat
        except OSError:
            pass                                # a heartbeat is evidence, never a reason for the run to fail

    def _run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            self.beat()

    def stop(self) -> None:
        self.stopped.set()
        self.beat()


def read_heartbeats(folder: str | Path) -> dict[int, dict]:
    """Every rank's last heartbeat in `folder`, by rank; {} where there is none."""
    beats = {}
    for path in sorted(Path(folder).glob("rank*.json")):
        try:
            record = json.loads(path.read_text())
            beats[int(record["rank"])] = record
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return beats
