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


@pytest.mark.slow
def test_killed_ablation_leaves_no_process_and_resumes(tmp_path, capsys):
    from trainfast.cli import main

    out = tmp_path / "ablation"
    argv = ["ablate", "--image-size", "16", "--batch-size", "32", "--epochs", "3",
            "--rungs", "fused", "--repeats", "1", "--noise-seeds", "1", "--out", str(out),
            "--timing-steps", "150",   # a rung of a few seconds (~20 ms a step): the signal lands while it runs
            "--settle-within", "0"]    # one pass of each rung, however noisy the machine
    cmd = [sys.executable, "-m", "trainfast", *argv]
    parent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (out / "runs" / "baseline-r0.json").exists(), 240, "the baseline run to finish")
        wait_for(lambda: (out / "rungs" / "fused-r0" / "log.txt").exists(), 60, "the second rung to start")
        time.sleep(2.0)                                   # well inside its training (3 epochs)
        tree = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
        assert len(alive(tree)) >= 2, "expected the fork server and a rung process below the ablation"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(tree) == [], [psutil.Process(p).cmdline()[:4] for p in alive(tree)]
    finally:
        if parent.poll() is None:
            parent.kill()
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
def test_ctrl_c_stops_the_rung_and_writes_the_partial_report(tmp_path):
    out = tmp_path / "ablation"
    cmd = [sys.executable, "-m", "trainfast", "ablate", "--image-size", "16", "--batch-size", "32", "--epochs", "3",
           "--rungs", "fused", "--repeats", "1", "--noise-seeds", "1", "--out", str(out),
           "--timing-steps", "150",   # a rung of a few seconds (~20 ms a step): the signal lands while it runs
           "--settle-within", "0"]    # one pass of each rung, however noisy the machine
    # As from a terminal: SIGINT at its default. A test run started in the background by a non-interactive shell
    # (`make test &`) has SIGINT ignored, which every child inherits, and Python then never raises
    # KeyboardInterrupt: the ablation would run to its end.
    parent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: (out / "runs" / "baseline-r0.json").exists(), 240, "the baseline run to finish")
        wait_for(lambda: (out / "rungs" / "fused-r0" / "log.txt").exists(), 60, "the second rung to start")
        time.sleep(1.0)
        tree = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
        parent.send_signal(signal.SIGINT)                 # what Ctrl-C sends the parent
        stdout, stderr = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == 130, stderr[-2000:]
    assert "interrupted" in stdout and "1 run(s) finished" in stdout and "--resume" in stdout
    deadline = time.monotonic() + 10
    while alive(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(tree) == []
    results = json.loads((out / "results.json").read_text())       # the partial report
    assert results["rungs"][0]["status"] == "done" and results["rungs"][1]["status"] != "done"
