"""A noisy machine in the report: a planted CPU hog beside the runs is seen, its blocks left out and its runs named
(not folded into the verdicts), and a fixed workload timed before and after the ladder says how much the machine
itself moved."""
import subprocess
import sys

from conftest import tiny_resnet
from trainfast import Recipe, ablate
from trainfast.ablation.rung import TimingBudget
from trainfast.procstate import process_state, reference_check
from trainfast.report.notes import caveats
from trainfast.report.summary import machine_line

# Spins on one core for 0.4 s, sleeps 0.4 s, for 60 s: part of every timing window is disturbed, part is not.
HOG = "import time\nend = time.time() + 60\nwhile time.time() < end:\n    t = time.time() + 0.4\n" \
      "    while time.time() < t: pass\n    time.sleep(0.4)\n"


def test_a_cpu_hog_beside_the_runs_is_left_out_and_its_runs_named(tmp_path, digits16):
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        result = ablate(tiny_resnet, digits16.train, digits16.val, recipe=Recipe(batch_size=32), out=tmp_path,
                        rungs=["fused"], repeats=2, noise_seeds=1, show=False, mean=digits16.mean, std=digits16.std,
                        settle_within_s=0, budget=TimingBudget(steps=16, seconds=5.0, min_seconds=2.0))
    finally:
        hog.kill()
    runs = [run for rung in result.rungs for run in rung.repeats]
    blocks = [b for run in runs for b in run["timing"]["blocks"]]
    assert any(b["disturbed"] for b in blocks), blocks
    assert all(b["foreign_share"] > 0.25 for b in blocks if b["disturbed"])
    assert all(b["foreign_share"] <= 0.25 for b in blocks if not b["disturbed"])
    # Every run with disturbed blocks is named in its rung's notes: left out where it had clean ones, and said to
    # rest on disturbed steps where it had none.
    for rung in result.rungs:
        notes = " ".join(caveats(rung))
        for run in rung.repeats:
            if any(b["disturbed"] for b in run["timing"]["blocks"]):
                assert f"seed {run['seed']}" in notes, notes
    assert "The machine itself" in (tmp_path / "report.md").read_text()


def test_the_machine_line_compares_the_reference_workload_before_and_after():
    class Result:
        rungs = []
        settings = {"machine_check": {"start": {"median_s": 0.030, "min_s": 0.029, "max_s": 0.031},
                                      "end": {"median_s": 0.036, "min_s": 0.033, "max_s": 0.040},
                                      "parent_cpu_share": 0.012}}
    line = machine_line(Result())
    assert "20.0% longer at the end" in line and "typical repeat ran 9% behind its best" in line
    assert "used 1.2% of a core while the runs ran" in line
    Result.settings = {"machine_check": {"start": {"median_s": 0.03, "min_s": 0.03, "max_s": 0.03}}}
    assert machine_line(Result()) is None                 # interrupted: no end to compare


def test_the_reference_workload_and_the_process_state_are_read():
    check = reference_check()
    assert 0 < check["min_s"] <= check["median_s"] <= check["max_s"]
    state = process_state()
    assert state["cores"] and state["torch_threads"] >= 1 and state["minor_faults"] > 0
    assert all({"name", "cpu_s", "core", "preempted"} <= set(t) for t in state["busy_threads"])
