"""Supervised child processes (trainfast.procs): results and errors come back, a hung child is stopped at
its time limit, and nothing a child started outlives its parent, whether the parent is SIGKILLed or
interrupted."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import procs_targets
import psutil
import pytest

from trainfast.ablation.server import rung_context
from trainfast.procs import read_log_tail, run_supervised

TESTS = Path(__file__).resolve().parent
SPAWN = mp.get_context("spawn")


def running(pid: int) -> bool:
    """Alive and not a zombie: an orphan that has exited stays a zombie until init reaps it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_running_after(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if running(p)]


def test_events_are_relayed_in_order_and_the_result_returned():
    events = []
    result = run_supervised(SPAWN, procs_targets.report_steps_and_return, (5,), on_event=events.append)
    assert events == [{"event": "progress", "step": step} for step in range(5)]
    assert result["answer"] == 42 and result["steps"] == 5 and result["wall_time_s"] > 0
    assert "error" not in result


def test_events_from_the_childs_elastic_workers_reach_the_parent(tmp_path):
    # `ablate --nproc`: the rung hands its Events to torch.distributed.elastic workers; rank 0 reports. The rung
    # forks from the rung server, as an ablation's does (torch and trainfast imported once for the test run).
    events = []
    result = run_supervised(rung_context(), procs_targets.launch_ranks, (2,), on_event=events.append,
                            log_path=tmp_path / "child.log")
    assert result["rank"] == 0, result
    assert events == [{"event": "progress", "rank": 0}]


def test_a_child_that_raises_is_reported_with_its_error_and_log_tail(tmp_path):
    log = tmp_path / "child.log"
    result = run_supervised(SPAWN, procs_targets.fail_with, ("boom",), log_path=log)
    assert result["error"] == f"ValueError: boom (see {log})"
    assert "about to fail" in result["log_tail"] and "Traceback" in result["log_tail"]


TORCHRUN_FAILURE = """epoch 5: train loss 0.2510  val accuracy 0.4083
terminate called without an active exception
W1123 23:20:57.167000 13441 torch/distributed/elastic/multiprocessing/api.py:1028] \
Sending process 13449 closing signal SIGTERM
E1123 23:20:57.286000 13441 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 0
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
""" + "  File \"torch/distributed/run.py\", line 1142, in <module>\n    main()\n" * 12 + """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
examples/adopted_loop.py FAILED
-------------------------------------------------------
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 13449)  (SIGTERM)
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_23:20:57
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 13448)  (SIGABRT)
  traceback : Signal 6 (SIGABRT) received by PID 13448
======================================================="""


def test_a_torchrun_failure_shows_the_ranks_last_words_not_the_launchers_traceback(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(TORCHRUN_FAILURE)
    tail = read_log_tail(log, lines=5).splitlines()
    assert tail[-3:-1] == ["epoch 5: train loss 0.2510  val accuracy 0.4083",
                           "terminate called without an active exception"]
    assert tail[-1] == "torchrun, root cause: rank : 0 (local_rank: 0); exitcode : -6 (pid: 13448) (SIGABRT)"
    assert not any("File" in line or "Sending process" in line for line in tail)
    # any other failure: simply the last lines
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    assert read_log_tail(log, lines=3).splitlines() == ["line 27", "line 28", "line 29"]


@pytest.mark.parametrize("how, said", [("exit", "process exited with code 3 without a result"),
                                       ("sigkill", "process was killed by SIGKILL without a result")])
def test_a_child_that_ends_without_a_result_is_an_error(how, said, tmp_path):
    events = []
    result = run_supervised(SPAWN, procs_targets.exit_without_result, (how,), on_event=events.append,
                            log_path=tmp_path / "child.log")
    assert result["error"].startswith(said) and events == [{"event": "progress", "step": 0}]


@pytest.mark.slow
def test_a_hung_child_is_stopped_at_its_time_limit_with_its_whole_group(tmp_path):
    events = []
    pid_file = tmp_path / "pids.json"
    limit = 6.0       # the child's start-up (spawn, importing trainfast and torch) counts: ~2 s here
    result = run_supervised(SPAWN, procs_targets.start_workers_and_hang, (str(pid_file),),
                            on_event=events.append, log_path=tmp_path / "child.log", time_limit_s=limit, grace_s=2)
    assert result["timed_out"] is True
    assert result["error"].startswith("stopped after its time limit of 6 s")
    assert limit <= result["wall_time_s"] < limit + 4
    pids = json.loads(pid_file.read_text())
    assert events == [{"event": "progress", "pids": pids}]
    survivors = still_running_after(pids.values(), 2)
    kill_survivors(survivors)
    assert survivors == []


def test_an_exception_in_the_parent_stops_the_child_group_and_propagates(tmp_path):
    # What Ctrl-C does while the parent relays an event: KeyboardInterrupt raised in this thread.
    def interrupt(event):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_supervised(SPAWN, procs_targets.start_workers_and_hang, (str(tmp_path / "pids.json"),),
                       on_event=interrupt, log_path=tmp_path / "child.log", grace_s=2)
    pids = json.loads((tmp_path / "pids.json").read_text())
    survivors = still_running_after(pids.values(), 2)
    kill_survivors(survivors)
    assert survivors == []


PARENT = textwrap.dedent("""
    import multiprocessing as mp, signal, sys
    import procs_targets
    from trainfast.procs import run_supervised

    if __name__ == "__main__":
        # A shell's background job inherits SIGINT ignored; Ctrl-C must raise here as it does in a terminal.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            run_supervised(mp.get_context("spawn"), procs_targets.start_workers_and_hang, (sys.argv[1],))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
def test_nothing_outlives_a_parent_that_is_killed_or_interrupted(sig, tmp_path):
    pid_file, output = tmp_path / "pids.json", tmp_path / "parent.out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])}
    # Output to a file, not a pipe: survivors holding a pipe open would turn a failure into a hang.
    with open(output, "w") as out:
        parent = subprocess.Popen([sys.executable, "-c", PARENT, str(pid_file)], env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    pids = {}
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and parent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), output.read_text()
        pids = json.loads(pid_file.read_text())
        assert all(running(p) for p in pids.values())
        os.kill(parent.pid, sig)
        parent.wait(timeout=30)
        assert still_running_after(pids.values(), 10) == []
    finally:
        parent.kill()
        parent.wait()
        kill_survivors(pids.values())
    if sig == signal.SIGKILL:
        assert parent.returncode == -signal.SIGKILL
    else:
        assert parent.returncode == 130 and "interrupted" in output.read_text()


LEAKER = textwrap.dedent("""
    import multiprocessing as mp, sys
    import procs_targets
    from trainfast.procs import run_supervised

    if __name__ == "__main__":
        result = run_supervised(mp.get_context("spawn"), procs_targets.hold_a_semaphore_and_die, (),
                                log_path=sys.argv[1])
        print(result["error"], flush=True)
""")


def test_a_run_killed_with_a_semaphore_held_has_it_cleaned_up_in_its_own_log_not_on_the_console(tmp_path):
    # A run the OOM killer ended held a semaphore: the tracker that cleans it up at the end is the run's own, and says
    # so in the run's log; the supervisor's (whose stderr is the console) has nothing left to warn about at its exit.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])}
    log = tmp_path / "child.log"
    done = subprocess.run([sys.executable, "-c", LEAKER, str(log)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert "killed by SIGKILL" in done.stdout, done.stdout + done.stderr
    assert "leaked semaphore" not in done.stderr, done.stderr
    deadline = time.monotonic() + 10          # the run's tracker reports once the run's last process is gone
    while "leaked semaphore" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "leaked semaphore" in log.read_text()


def kill_survivors(pids) -> None:
    """A failing test must not leave its processes running on the machine."""
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
