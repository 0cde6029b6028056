"""A distributed run that failed, said by rank (rankfaults.py): the rank killed mid-run named with how it ended, where
it was last seen and its last lines; the rank a collective waited for named with the phase it was stuck in. Fast tests
build the messages from faked logs and heartbeats; one slow ablation of two gloo ranks has both faults for real
(rank_ablation.py, shared with test_ranks.py)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from trainfast.rankfaults import (Heartbeat, RankExit, describe_rank_fault, laggard, parse_rank_exits,
                                  rank_lines, read_heartbeats)

# torchrun's end of a job whose rank 1 was killed (its --tee prefixes each rank's lines with its local rank)
KILLED_LOG = """\
[default0]:trainfast: TRAINFAST_RECIPE overrides the script's recipe: set_to_none False -> True
[default1]:USDT:2026-12-01 23:25:53 20632:20632 SyncActivityProfilerHandler.cpp:39] profiler_start
[default1]:[W1201 23:25:53.012642710 CPUAllocator.cpp:245] Memory block of unknown size was allocated
[default1]:loading shard 3
[default1]:rank 1: killing myself
[default0]:[rank0]: Traceback (most recent call last):
[default0]:[rank0]: RuntimeError: [pair.cc:545] Read error [127.0.0.1]:25498: Connection reset by peer.
W1201 23:19:59.451000 15797 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 15912 closing signal
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
rank_loop.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_23:19:59
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 15912)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 15912
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_23:19:59
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 15913)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 15913
=======================================================""".splitlines()

TIMEOUT_LINES = ["[default1]:rank 1: my loader stalls",
                 "[default0]:[rank0]: Traceback (most recent call last):",
                 "[default0]:[rank0]: RuntimeError: [unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation"]


def beat(rank: int, phase: str, step: int) -> dict:
    return {"rank": rank, "pid": 100 + rank, "phase": phase, "step": step, "at": 0.0}


def test_torchruns_failure_table_gives_every_rank_and_the_root_cause():
    assert parse_rank_exits(KILLED_LOG) == [RankExit(0, 0, -15, 15912, first=False),
                                            RankExit(1, 1, -9, 15913, first=True)]
    assert parse_rank_exits(["no table here"]) == []


def test_a_ranks_last_lines_are_its_own_without_the_runtimes_notices():
    assert rank_lines(KILLED_LOG, 1, 1) == ["loading shard 3", "rank 1: killing myself"]
    assert rank_lines(KILLED_LOG, 0, 0, count=2) == [
        "Traceback (most recent call last):",
        "RuntimeError: [pair.cc:545] Read error [127.0.0.1]:25498: Connection reset by peer."]
    # without --tee (the built-in run's workers): torch's own prefix on a rank's uncaught exception
    assert rank_lines(["[rank1]: ValueError: bad batch", "plain line"], 1, 1) == ["ValueError: bad batch"]


def test_a_killed_rank_is_named_with_its_signal_where_it_was_and_its_last_lines():
    beats = {0: beat(0, "backward", 4), 1: beat(1, "forward", 4)}
    text = describe_rank_fault(parse_rank_exits(KILLED_LOG), beats, KILLED_LOG)
    assert text.startswith("rank 1 of 2 was killed by SIGKILL (exit code -9, pid 15913)"), text
    assert "last seen in its forward in step 5" in text and text.endswith("its last lines: loading shard 3 | "
                                                                          "rank 1: killing myself")
    assert "SIGTERM" not in text            # the rank torchrun stopped afterwards is not the one at fault


def test_the_rank_a_collective_waited_for_is_named_with_its_phase():
    exits = [RankExit(0, 0, 1, 20, first=True), RankExit(1, 1, -15, 21)]
    beats = {0: beat(0, "backward", 4), 1: beat(1, "data", 4)}
    text = describe_rank_fault(exits, beats, TIMEOUT_LINES)
    assert text.startswith("rank 1 of 2 did not arrive at a collective: it was last seen waiting for its next batch "
                           "in step 5, while rank 0 was last seen in its backward (the gradient all-reduce) in step 5")
    assert "rank 0 gave up waiting (RuntimeError: [unbound_buffer.cc:78] Timed out waiting 3000ms" in text
    assert text.endswith("and exited with status 1")


def test_a_rank_that_raised_is_the_fault_not_the_ranks_that_waited_for_it():
    lines = ["[rank0]: Traceback (most recent call last):", "[rank0]: ValueError: the batch is empty"]
    exits = [RankExit(0, 0, 1, 20, first=True), RankExit(1, 1, -15, 21)]
    text = describe_rank_fault(exits, {0: beat(0, "forward", 2), 1: beat(1, "backward", 2)}, lines)
    assert text.startswith("rank 0 of 2 exited with status 1") and "ValueError: the batch is empty" in text
    assert describe_rank_fault([], {}, lines) is None      # nothing names a rank: the plain failure stands


def test_a_run_stopped_at_its_time_limit_says_which_rank_the_others_waited_for(tmp_path):
    from trainfast.rankfaults import explain_time_limit

    for rank, phase, step in ((0, "backward", 3), (1, "forward", 3)):
        Heartbeat(tmp_path, rank, lambda phase=phase, step=step: (phase, step)).stop()
    stopped = {"error": "stopped after its time limit of 60 s", "timed_out": True}
    assert explain_time_limit(stopped, tmp_path)["error"] == (
        "stopped after its time limit of 60 s; rank 1 of 2 did not arrive at a collective: it was last seen in its "
        "forward in step 4, while rank 0 was last seen in its backward (the gradient all-reduce) in step 4")
    assert explain_time_limit({"error": "boom"}, tmp_path) == {"error": "boom"}
    assert explain_time_limit(stopped, tmp_path / "none") == stopped       # one process: no heartbeats


def test_the_laggard_is_behind_every_other_rank_or_none():
    assert laggard({0: beat(0, "backward", 7), 1: beat(1, "backward", 6), 2: beat(2, "backward", 7)}) == 1
    assert laggard({0: beat(0, "backward", 7), 1: beat(1, "backward", 7)}) is None
    assert laggard({0: beat(0, "data", 3)}) is None


def test_each_rank_writes_its_phase_and_steps_as_it_trains(tmp_path):
    """The probe's phase clock moves through a step's phases; the heartbeat writes where it is, at once and on stop."""
    from trainfast.probe.ranks import PhaseClock

    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    clock = PhaseClock(model)
    try:
        seen = [clock.where()]
        loss = model(torch.randn(3, 4)).sum()
        seen.append(clock.where())
        loss.backward()
        optimizer.step()
        clock.close_step()
        seen.append(clock.where())
        heart = Heartbeat(tmp_path / "ranks", 1, clock.where)
        heart.stop()
    finally:
        clock.remove()
    assert seen == [("start", 0), ("backward", 0), ("data", 1)]
    record = read_heartbeats(tmp_path / "ranks")[1]
    assert record["phase"] == "data" and record["step"] == 1 and record["pid"] == os.getpid()
    assert clock.where()[0] == "done"


def test_a_failed_rung_of_the_builtin_run_names_its_rank(tmp_path, monkeypatch):
    """`ablate --nproc N` on the built-in run: the elastic launcher's ChildFailedError said as its first failure, with
    the heartbeats its ranks wrote and their lines in the rung's log."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from trainfast.ablation.rung import rank_failure
    from trainfast.rankfaults import HEARTBEATS_ENV, RankFailed

    for rank, phase in ((0, "backward"), (1, "optimizer")):
        Heartbeat(tmp_path / "ranks", rank, lambda phase=phase: (phase, 7)).stop()
    monkeypatch.setenv(HEARTBEATS_ENV, str(tmp_path / "ranks"))
    (tmp_path / "log.txt").write_text("[rank1]: MemoryError: the optimizer's state\n")
    failures = {1: ProcessFailure(local_rank=1, pid=4321, exitcode=1, error_file="<N/A>")}
    error = rank_failure(ChildFailedError("rung_worker", failures), 2, str(tmp_path / "log.txt"))
    assert isinstance(error, RankFailed) and error.explained
    assert str(error) == ("rank 1 of 2 exited with status 1 (pid 4321), last seen in its optimizer step "
                          "in step 8; its last lines: MemoryError: the optimizer's state (the rung's 2 processes "
                          "failed)")


def test_a_collectives_timeout_given_to_the_ablation_reaches_the_scripts_runs():
    from types import SimpleNamespace

    from trainfast import Recipe
    from trainfast.ablation.work import CommandWork

    def fields(base: Recipe) -> dict:
        work = CommandWork(SimpleNamespace(nproc=2), torch.device("cpu"), base, ["seed", "set_to_none"], None, {})
        return work.fields(base.replace(set_to_none=True))

    assert fields(Recipe()) == {"seed": 0, "set_to_none": True}           # the script's own timeout stands
    assert fields(Recipe(dist_timeout_s=3))["dist_timeout_s"] == 3


@pytest.fixture(scope="module")
def faulted(tmp_path_factory) -> Path:
    """The shared ablation of two gloo ranks of one thread (rank_ablation.py, tests/scripts/rank_loop.py with rank 1
    planted): its killed rung's run with rank 1 killed, its stuck rung's with rank 1's loader stuck for 60 s, under a
    3 s collective timeout. Each of the two fails at its fifth step."""
    from rank_ablation import planted_ablation

    out, proc = planted_ablation(tmp_path_factory)
    assert proc.returncode == 1          # a run failed: said by the exit status
    return out


def fault_time(run: Path, words: str) -> float:
    """When the script said it planted its fault (it prints the time)."""
    line = next(line for line in (run / "log.txt").read_text().splitlines() if words in line)
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.slow
def test_a_rank_killed_mid_rung_fails_that_run_by_name_and_the_ablation_goes_on(faulted):
    rungs = {r["name"]: r for r in json.loads((faulted / "results.json").read_text())["rungs"]}
    killed = rungs["killed"]
    assert killed["status"] == "failed"
    error = killed["error"]
    assert "rank 1 of 2 was killed by SIGKILL (exit code -9" in error, error
    assert "last seen waiting for its next batch in step 5" in error and "rank 1: killing myself" in error, error
    run = faulted / "rungs" / "killed-r0"
    assert os.path.getmtime(run / "log.txt") - fault_time(run, "killing myself") < 20     # ended at once, no wait
    assert (faulted / "rungs" / "stuck-r0" / "log.txt").is_file()           # the ladder went on to its next rung
    assert "rank 1 of 2 was killed by SIGKILL" in (faulted / "report.md").read_text()


@pytest.mark.slow
def test_a_rank_stuck_before_a_collective_is_named_within_the_timeout(faulted):
    rungs = {r["name"]: r for r in json.loads((faulted / "results.json").read_text())["rungs"]}
    stuck = rungs["stuck"]
    error = stuck["error"]
    assert ("rank 1 of 2 did not arrive at a collective: it was last seen waiting for its next batch in step 5, "
            "while rank 0 was last seen in its backward (the gradient all-reduce) in step 5") in error, error
    assert "Ranks 1 failed to pass monitoredBarrier" in error     # the Session named it too, in rank 0
    run = faulted / "rungs" / "stuck-r0"
    # its loader sleeps 60 s: the job ended a few seconds after the 3 s timeout instead (the stuck rank beat till then)
    ended = read_heartbeats(run / "ranks")[1]["at"]
    assert ended - fault_time(run, "my loader stalls") < 25
    assert time.time() > ended
    assert "did not arrive at a collective" in (faulted / "report.md").read_text()
