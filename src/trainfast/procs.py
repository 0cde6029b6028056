"""Supervised child processes: a function run in a spawned process that cannot outlive its parent, is
stopped at a time limit, and always ends in a result or an error, never in silence.

Made for ablation rungs: each rung is seconds to hours of training in a process of its own, with
DataLoader workers (and, under `ablate --nproc`, torch.distributed elastic workers) below it. It guards
against three failures:
- the parent dies (SIGKILL, a lost SSH session, a preempted node): the rung and its workers must not go
  on training unseen, holding a GPU for hours;
- Ctrl-C in the parent: the rung stops at once and the KeyboardInterrupt reaches the caller, which can
  still write a partial report;
- a rung that hangs (deadlocked workers, a stuck collective): stopped at its time limit and reported as
  failed with the tail of its log, so the caller can go on.

How:
- The child leads a session of its own, hence a process group of its own: everything it starts (unless
  that leaves the group on purpose) is stopped by one `killpg`. A Ctrl-C at the terminal then reaches the
  parent alone, which stops the child's group itself.
- Parent death is seen in three ways, each covering what the others cannot:
  1. `prctl(PR_SET_PDEATHSIG, SIGKILL)` (Linux): the kernel kills the child the moment its direct parent
     dies, even when the child's interpreter is stuck inside C code;
  2. a watcher thread in the child waits for the supervisor's exit (its pid passed explicitly: from a fork
     server the direct parent is the server, not the supervisor) on a pidfd, or by polling where there is
     none, and kills the child's group: the whole mechanism where prctl does not exist (macOS);
  3. a group reaper, a tiny process in the child's group that watches its own parent (the child) the same
     way and kills the group once the child is gone, however it went (1., the OOM killer, a segfault):
     otherwise the child's own children that watch nothing (a `subprocess`) would be left running.
- The parent's side stops the group on every way out that is not a clean exit (time limit, a child that
  reported but does not exit, any exception while waiting, KeyboardInterrupt included): SIGTERM to the
  group, SIGKILL after a grace period.
- Events travel over a one-way Pipe, written synchronously by the child: an event sent just before the
  child dies is not lost in a queue's feeder thread, and the parent reads end-of-file once no writer is left.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

GRACE_S = 5.0           # SIGTERM -> SIGKILL: time for the child's group to exit on its own
EXIT_WAIT_S = 60.0      # a child that reported must exit within this long, or its group is stopped
WATCH_S = 0.25          # how often the child (and its reaper) look at their parent: death seen within this
LOG_TAIL_LINES = 20
LAUNCHER_RECORD = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d")   # torchrun's own log lines (glog style)

PR_SET_PDEATHSIG = 1    # <linux/prctl.h>

# The reaper: a separate interpreter (python -I -S: no site, no environment, starts in ~20 ms) so it holds
# nothing of the child's (no pipe ends, no torch). Once its parent (the child) is gone: SIGTERM to the group,
# a moment for processes that clean up on exit (multiprocessing's resource tracker unlinks leaked shared
# memory then), SIGKILL. It ignores the polite signals itself, so a SIGTERM to the group cannot end it
# before it has done that.
REAPER = """
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
child, interval, grace = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
while os.getppid() == child:
    time.sleep(interval)
os.killpg(0, signal.SIGTERM)
time.sleep(grace)
os.killpg(0, signal.SIGKILL)
"""
REAPER_GRACE_S = 1.0


class Events:
    """The child's end of the event pipe, with a Queue's `put(event)` so targets written for a Queue work
    unchanged. It pickles into processes the child spawns itself (torch.distributed elastic workers); only
    one process may write at a time (under --nproc, rank 0 alone reports)."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.lock = threading.Lock()      # progress events may come from another thread than the result

    def put(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.conn.send(event)

    def __getstate__(self) -> dict[str, Any]:
        return {"conn": self.conn}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["conn"])


def run_supervised(ctx: Any, target: Callable[..., Any], args: tuple = (), *,
                   on_event: Callable[[dict[str, Any]], None] | None = None, log_path: str | Path | None = None,
                   time_limit_s: float | None = None, grace_s: float = GRACE_S, poll_s: float = 0.5) -> dict[str, Any]:
    """Run `target(*args, events)` in a child process started from `ctx` (a multiprocessing context; None
    means spawn) and wait for it. `target` must be importable (spawn pickles it by reference), may call
    `events.put(dict)` any number of times, and returns the result, a picklable dict.

    Events the child puts are passed to `on_event` in order, in this thread, except the two that end the
    wait: {"event": "result", "result": ...} and {"event": "error", "error": str} (child_main sends them
    from the target's return value or exception; a target may also send them itself and return None).

    Returns the result dict, plus "wall_time_s". Never raises for the child's failures: a child that
    raised, exited without a result, was killed, or passed `time_limit_s` (seconds from its start; then
    its whole process group is stopped) gives {"error": what happened, "log_tail": the last lines of
    `log_path` ("" without one), "wall_time_s": ...}, with "timed_out": True for the time limit. The child's
    stderr goes to `log_path` when given (else it shares the parent's).

    Exceptions in this thread (KeyboardInterrupt on Ctrl-C, or one raised by `on_event`) stop the child's
    process group first, then propagate. Call it from a thread that lives until it returns: on Linux the
    child is killed when the thread that started it ends."""
    ctx = ctx or mp.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    log = str(log_path) if log_path is not None else None
    # Not a daemon: daemonic processes may not have children, and a rung's DataLoader workers are its children.
    proc = ctx.Process(target=child_main, args=(target, tuple(args), writer, os.getpid(), log), daemon=False)
    started = time.monotonic()
    proc.start()
    writer.close()          # the child holds the only write end now: end-of-file once it and its children are gone
    deadline = started + time_limit_s if time_limit_s is not None else None
    try:
        kind, value = await_outcome(proc, reader, on_event, deadline, poll_s)
        if kind == "timed out":
            stop_process_tree(proc, grace_s)
        else:
            proc.join(EXIT_WAIT_S)
            if proc.exitcode is None:       # reported, then stuck in shutdown (workers that do not exit)
                stop_process_tree(proc, grace_s)
    except BaseException:
        stop_process_tree(proc, grace_s)
        raise
    finally:
        reader.close()
    wall_time_s = time.monotonic() - started
    if kind == "result":
        return {**value, "wall_time_s": wall_time_s}
    if kind == "error":
        what = value
    elif kind == "exited":
        what = f"process {describe_exit(proc.exitcode)} without a result"
    else:
        what = f"stopped after its time limit of {time_limit_s:g} s"
    failure = {"error": what + (f" (see {log})" if log else ""), "log_tail": read_log_tail(log) if log else "",
               "wall_time_s": wall_time_s}
    if kind == "timed out":
        failure["timed_out"] = True
    return failure


def await_outcome(proc, reader, on_event, deadline: float | None, poll_s: float) -> tuple[str, Any]:
    """Relay events until the child's result or error arrives: ("result", dict) or ("error", str);
    ("exited", None) if it ends without either, ("timed out", None) once `deadline` (time.monotonic())
    has passed."""
    while True:
        wait = poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
        if reader.poll(wait):
            try:
                event = reader.recv()
            except (EOFError, OSError):     # no writer left (or one died mid-message): the child is gone
                return "exited", None
            if event.get("event") == "result":
                return "result", dict(event["result"])
            if event.get("event") == "error":
                return "error", str(event["error"])
            if on_event is not None:
                on_event(event)
        elif not proc.is_alive() and not reader.poll(0):    # exited, and nothing it sent is left unread
            return "exited", None
        if deadline is not None and time.monotonic() >= deadline:
            return "timed out", None


def describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def stop_process_tree(proc, grace_s: float = GRACE_S) -> None:
    """Stop a child started by run_supervised and everything in its process group: SIGTERM, then SIGKILL
    after `grace_s` (also if this is interrupted). Returns once the child itself has been reaped."""
    if proc.pid is None:
        return
    try:    # while the child is unreaped its pid cannot be reused, so this says whether it leads its group
        leads_group = os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        leads_group = False

    def send(sig: int) -> None:
        if leads_group:
            try:
                # Safe after the leader was reaped too: a group id is not reused while any member lives.
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        elif proc.exitcode is None:         # still in start-up, before child_main made the group
            os.kill(proc.pid, sig)

    try:
        send(signal.SIGTERM)
        proc.join(grace_s)
    finally:
        send(signal.SIGKILL)
        proc.join()


def read_log_tail(path: str | Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 8192) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(failure_lines(data.decode(errors="replace").splitlines(), lines))


def failure_lines(log: list[str], lines: int) -> list[str]:
    """The last `lines` lines of a failed run's log that say why it failed. Under torchrun the log ends with
    the launcher's own traceback (ChildFailedError, ~40 lines that only say a rank died) after its own log
    records; the ranks' last words come before them, so those are kept, then the launcher's root cause."""
    launcher = next((i for i, line in enumerate(log) if "ChildFailedError" in line), None)
    if launcher is None:
        return log[-lines:]
    start = max((i for i in range(launcher) if log[i].startswith("Traceback")), default=launcher)
    ranks = [line for line in log[:start] if not LAUNCHER_RECORD.match(line)]
    cause = next((i for i in range(launcher, len(log)) if log[i].startswith("Root Cause")), len(log))
    summary = [line.strip() for line in log[cause:] if line.strip().startswith(("rank ", "exitcode "))]
    if not summary:
        return ranks[-lines:]
    return ranks[-(lines - 1):] + ["torchrun, root cause: " + "; ".join(" ".join(s.split()) for s in summary)]


# --------------------------------------------------------------------------------------------------
# in the child


def child_main(target: Callable[..., Any], args: tuple, conn, parent_pid: int, log_path: str | None = None) -> None:
    """What the spawned process runs: stderr to `log_path`, a process group of its own, the three parent
    death watches, then `target(*args, events)`; its return value is sent as the result and an exception
    as the error (with its traceback in the log)."""
    if log_path is not None:
        # The child's warnings and tracebacks go to its log file, not over the parent's live display.
        with open(log_path, "w") as log:
            os.dup2(log.fileno(), 2)
        from .quiet import write_held_to_stderr

        write_held_to_stderr()      # stderr is the run's log here: libraries' import notices belong in it
    own_resource_tracker()
    own_group = lead_own_group()
    watch_parent(parent_pid, own_group)
    events = Events(conn)
    try:
        result = target(*args, events)
    except BaseException as exc:  # every failure reaches the parent, which goes on with its next child
        if not getattr(exc, "explained", False):     # a failure that explains itself leaves the log's tail alone
            traceback.print_exc()
        events.put({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        return
    if result is not None:
        events.put({"event": "result", "result": result})


def own_resource_tracker() -> None:
    """The semaphores and shared memory this process (and the workers it starts) creates are tracked by a
    multiprocessing resource tracker of its own, started when first needed with this process's stderr (its run's
    log), instead of the supervisor's it inherited. A run killed before it released them (the OOM killer, its time
    limit) then has them unlinked, and the leak said, in its own log as it ends; the supervisor's tracker reported
    them only when the supervisor exited, on the console and naming no run."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    lock, fd = getattr(tracker, "_lock", None), getattr(tracker, "_fd", None)
    if lock is None or fd is None:
        return
    with lock:
        tracker._fd, tracker._pid = None, None
    try:
        os.close(fd)
    except OSError:
        pass


def lead_own_group() -> bool:
    """Make this process the leader of a new session and process group; False where it cannot (it already
    leads one), and then nothing may kill "its" group, which would be someone else's."""
    try:
        os.setsid()
    except OSError:
        return False
    return True


def watch_parent(parent_pid: int, own_group: bool) -> None:
    """Die, with everything this process started, as soon as process `parent_pid` (the supervisor) ends.
    The supervisor need not be the direct parent: from a fork server (ablate's rungs) the direct parent is
    the server, which itself ends with the supervisor."""
    set_parent_death_signal(signal.SIGKILL)          # the direct parent: the supervisor, or its fork server
    if own_group:
        start_group_reaper()
    threading.Thread(target=await_exit, args=(parent_pid, own_group), name="trainfast-parent-watch",
                     daemon=True).start()
def set_parent_death_signal(sig: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig) through libc; False off Linux or where libc refuses it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def start_group_reaper() -> None:
    subprocess.Popen([sys.executable, "-I", "-S", "-c", REAPER, str(os.getpid()), str(WATCH_S), str(REAPER_GRACE_S)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def await_exit(parent_pid: int, own_group: bool) -> None:
    """Block until `parent_pid` has ended, then kill this process's tree. A pidfd (Linux 5.3+) cannot be
    fooled by a reused pid and wakes at once; elsewhere poll: getppid() while the supervisor is the direct
    parent, else whether the pid still exists."""
    import select

    try:
        fd = os.pidfd_open(parent_pid)
    except ProcessLookupError:                 # it ended before the watch began
        kill_own_tree(own_group)
    except (AttributeError, OSError):
        direct = os.getppid() == parent_pid
        while (os.getppid() == parent_pid) if direct else pid_exists(parent_pid):
            time.sleep(WATCH_S)
    else:
        select.select([fd], [], [])            # readable once the process has exited
    kill_own_tree(own_group)


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_own_tree(own_group: bool) -> None:
    if own_group:
        os.killpg(0, signal.SIGKILL)        # this process and everything in its group
    os.kill(os.getpid(), signal.SIGKILL)
