"""An ablation that survives what happens to long jobs: the parent killed mid-rung (no rung process or worker
outlives it; the same command with --resume reuses every finished run), and a rung that hangs (stopped at its
time limit, reported failed, the other rungs finish)."""
import json
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from conftest import tiny_resnet

from trainfast import Recipe, ablate


def hangs_under_half_precision(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A loss that never returns in a bf16/fp16 rung (outputs in half precision under autocast), as a
    deadlocked DataLoader worker or a stuck collective would never return."""
    if outputs.dtype != torch.float32:
        time.sleep(10_000)
    return torch.nn.functional.cross_entropy(outputs, targets)


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


# The interrupted ablation: the built-in run, its baseline and the fused rung, one run each.
ARGV = ["ablate", "--image-size", "16", "--batch-size", "32", "--epochs", "3", "--rungs", "fused", "--repeats", "1",
        "--noise-seeds", "1",
        "--timing-steps", "150",   # a rung of a few seconds (~20 ms a step): the signal lands while it runs
        "--settle-within", "0"]    # one pass of each rung, however noisy the machine


def gone(tree: list[int]) -> list[str]:
    """The processes of `tree` still alive 10 s on (their command lines' start), or none."""
    deadline = time.monotonic() + 10
    while alive(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = []
    for pid in alive(tree):
        try:
            left.append(" ".join(psutil.Process(pid).cmdline()[:4]))
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> dict:
    """One ablation interrupted twice, for both tests: Ctrl-C (SIGINT) in its fused rung, then the same command with
    --resume (the baseline read back) killed (SIGKILL) in that rung again. One ablation's start and baseline run
    instead of one each; what each interruption left is read right after it."""
    out = tmp_path_factory.mktemp("interrupted") / "ablation"
    cmd = [sys.executable, "-m", "trainfast", *ARGV, "--out", str(out)]
    fused = out / "rungs" / "fused-r0"
    # As from a terminal: SIGINT at its default. A test run started in the background by a non-interactive shell
    # (`make test &`) has SIGINT ignored, which every child inherits, and Python then never raises
    # KeyboardInterrupt: the ablation would run to its end.
    parent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: (out / "runs" / "baseline-r0.json").exists(), 240, "the baseline run to finish")
        wait_for(lambda: (fused / "log.txt").exists(), 60, "the second rung to start")
        time.sleep(1.0)
        tree = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
        parent.send_signal(signal.SIGINT)                 # what Ctrl-C sends the parent
        stdout, stderr = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
    ctrl_c = {"code": parent.returncode, "stdout": stdout, "stderr": stderr, "left": gone(tree),
              "results": json.loads((out / "results.json").read_text())}       # the partial report

    launched = (fused / "recipe.json").stat().st_mtime_ns      # written as each launch of the rung starts

    def relaunched() -> bool:
        try:
            return (fused / "recipe.json").stat().st_mtime_ns > launched
        except FileNotFoundError:
            return False

    parent = subprocess.Popen(cmd + ["--resume"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(relaunched, 240, "the fused rung to start again")
        time.sleep(2.0)                                   # well inside its training (3 epochs)
        tree = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
        running = alive(tree)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
    finally:
        if parent.poll() is None:
            parent.kill()
    return {"out": out, "cmd": cmd, "ctrl_c": ctrl_c, "killed": {"running": running, "left": gone(tree)}}


@pytest.mark.slow
def test_killed_ablation_leaves_no_process_and_resumes(interrupted, capsys):
    from trainfast.cli import main

    out, cmd, killed = interrupted["out"], interrupted["cmd"], interrupted["killed"]
    argv = cmd[3:]
    assert len(killed["running"]) >= 2, "expected the fork server and a rung process below the ablation"
    assert killed["left"] == [], killed["left"]
    finished = json.loads((out / "runs" / "baseline-r0.json").read_text())

    # The same command again is refused without --resume (in this process: the refusals start no run), and with
    # it reuses the finished baseline.
    assert main(argv) == 2 and "already holds an ablation" in capsys.readouterr().err
    done = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "reused baseline (fp32), run 1" in done.stdout
    results = json.loads((out / "results.json").read_text())
    base, rung = results["rungs"]
    assert base["runs"][0]["timing"] == finished["timing"] and base["metric"] == finished["metric"]
    assert base["runs"][0]["reused"] and rung["status"] == "done" and rung["verdict"] != "failed"

    # A changed plan is refused with the difference named.
    assert main([*argv, "--resume", "--batch-size", "16"]) == 2
    changed = capsys.readouterr().err
    assert "differs from this command in" in changed and "batch_size" in changed


# Slow: a whole ablation waits out a 10 s limit. Fast: the supervisor's limit on a hung child and its whole
# process group, tests/test_procs.py::test_a_hung_child_is_stopped_at_its_time_limit_with_its_whole_group.
@pytest.mark.slow
def test_a_hanging_rung_is_stopped_at_its_limit_and_the_others_finish(tmp_path, digits16):
    from trainfast.ablation.rung import TimingBudget

    t0 = time.monotonic()
    # One pass over a few timed steps: the runs that finish take a few seconds, well inside the limit, and the
    # hanging one is waited for no longer than that limit.
    result = ablate(tiny_resnet, digits16.train, digits16.val, hangs_under_half_precision, mean=digits16.mean,
                    std=digits16.std, recipe=Recipe(batch_size=32), rungs=["amp", "fused"], mode="each",
                    amp_dtype="bf16", repeats=1, noise_seeds=1, out=tmp_path, show=False, rung_timeout=10,
                    settle_within_s=0, budget=TimingBudget(steps=4, seconds=1.0, floor=2, min_seconds=0.0))
    status = {r.name: r.status for r in result.rungs}
    assert status == {"baseline": "done", "amp": "failed", "fused": "done"}, status
    amp = next(r for r in result.rungs if r.name == "amp")
    assert "time limit of 10 s" in amp.result.error
    assert time.monotonic() - t0 < 240
    report = (tmp_path / "report.md").read_text()
    assert "failed — " in report and "time limit" in report


@pytest.mark.slow
def test_ctrl_c_stops_the_rung_and_writes_the_partial_report(interrupted):
    seen = interrupted["ctrl_c"]
    assert seen["code"] == 130, seen["stderr"][-2000:]
    stdout = seen["stdout"]
    assert "interrupted" in stdout and "1 run(s) finished" in stdout and "--resume" in stdout
    assert seen["left"] == [], seen["left"]
    results = seen["results"]                                       # the partial report
    assert results["rungs"][0]["status"] == "done" and results["rungs"][1]["status"] != "done"
