"""A noisy machine in the report: a planted CPU hog beside the runs is seen, its blocks left out and its runs named
(not folded into the verdicts), and a fixed workload timed before and after the ladder says how much the machine
itself moved."""
import os
import subprocess
import sys

import pytest

from trainfast import Recipe
from trainfast.ablation.scoring import aggregate
from trainfast.measure import DISTURBED_SHARE, StepTime, Timing
from trainfast.measure.timing import EDGE_SHARE
from trainfast.procstate import process_state, reference_check
from trainfast.report.notes import caveats
from trainfast.report.summary import machine_line
from trainfast.results import Rung, Status

# Slow: one real ablation (a script's Session loop; the built-in loop's rungs are timed by the same probe and
# Timing) with a spinning process beside one of its runs. Fast: test_disturbed_blocks_are_left_out_and_their_runs_named
# (the rule on step times as the clock reads them),
# test_the_machine_line_compares_the_reference_workload_before_and_after.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_disturbed_runs_named(result) -> None:
    runs = [run for rung in result.rungs for run in rung.repeats]
    blocks = [b for run in runs for b in run["timing"]["blocks"]]
    assert blocks and all(b["foreign_share"] is not None for b in blocks), blocks     # judged in every run
    assert any(b["disturbed"] for b in blocks), blocks
    for rung in result.rungs:
        notes = " ".join(caveats(rung))
        for run in rung.repeats:
            if any(b["disturbed"] for b in run["timing"]["blocks"]):
                assert f"seed {run['seed']}" in notes, notes


# Spins at 0.4 s on, 0.4 s off for 6 s (about one run), from when the script under test signals the run to load.
PLANTED_HOG = ("import os, sys, time\nmark = os.path.join(sys.argv[1], 'hog-now')\n"
               "while not os.path.exists(mark): time.sleep(0.05)\nend = time.time() + 6\n"
               "while time.time() < end:\n    t = time.time() + 0.4\n    while time.time() < t: pass\n"
               "    time.sleep(0.4)\n")


def planted_ablation(framework: str, out, hog_dir=None):
    from trainfast.ablation import ablate_command

    hog = ["--hog-dir", str(hog_dir)] if hog_dir else []
    return ablate_command([sys.executable, os.path.join(ROOT, "tests", "scripts", "planted_step.py"),
                           "--framework", framework, *hog], device="cpu", out=out, rungs=["amp"], amp_dtype="bf16",
                          repeats=4, noise_seeds=1, show=False, settle_within_s=0)


@pytest.mark.slow
@pytest.mark.alone
def test_a_hog_beside_one_run_is_named_and_the_verdicts_stay(tmp_path, framework="session"):
    """A script whose amp rung is 3x faster by construction (tests/scripts/planted_step.py), a Session loop,
    ablated with a CPU hog spinning beside one run alone, the first run with half precision on, which the hog would
    make look as slow as the baseline. That run's disturbed blocks are named and left out, and every rung's verdict
    is the one the construction fixes (amp faster than the baseline), which a quiet ablation of the same script
    gives: the verdicts stay. Four repeats and a 3x gain: with three repeats or a 2x gain, a 2-core VM whose own
    runs spread 10-30% (quiet blocks included) left the interval wider than the gain. (The same script under
    Lightning's Trainer is timed by the same probe and Timing: planted_step.py --framework lightning, 2.5
    minutes, run by hand.)"""
    hog = subprocess.Popen([sys.executable, "-c", PLANTED_HOG, str(tmp_path)])
    try:
        loaded = planted_ablation(framework, tmp_path / "loaded", hog_dir=tmp_path)
    finally:
        hog.kill()
    assert (tmp_path / "claimed").exists()
    amp = next(r for r in loaded.rungs if r.name != "baseline")
    hit = [run for run in amp.repeats if any(b["disturbed"] for b in run["timing"]["blocks"])]
    assert hit, [run["timing"]["blocks"] for run in amp.repeats]
    assert_disturbed_runs_named(loaded)
    blocks = [b for rung in loaded.rungs for run in rung.repeats for b in run["timing"]["blocks"]]
    assert all(b["foreign_share"] > (EDGE_SHARE if b.get("edge") else DISTURBED_SHARE)
               for b in blocks if b["disturbed"])
    assert all(b["foreign_share"] <= DISTURBED_SHARE for b in blocks if not b["disturbed"])
    assert "The machine itself" in (loaded.out_dir / "report.md").read_text()
    assert [(r.name, r.result.verdict) for r in loaded.rungs] == [("baseline", "reference"), ("amp", "faster")]


def test_the_runs_own_processes_are_its_own_cpu():
    """JobCPU counts a loader worker's CPU with the run's, while it runs and after it ends (its parent's reaped
    children): a run with workers is judged on what other processes took, not on its own workers. A child that
    does a fixed amount of work, then waits to be told to end: no clock in the test."""
    import psutil

    from trainfast.measure.clock import JobCPU

    job = JobCPU()
    before = job()
    child = subprocess.Popen([sys.executable, "-c", "s = sum(i * i for i in range(3_000_000)); print(s, flush=True); "
                                                    "input()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        child.stdout.readline()                   # its work is done
        job.refresh()
        spent = psutil.Process(child.pid).cpu_times()
        live = job()
        assert live - before >= spent.user + spent.system
    finally:
        child.communicate("\n")
    assert job() >= live                          # ended and reaped: its CPU stays in the count
    job.refresh()
    assert job() >= live


CORES = 2
STEP_S, SAMPLES = 0.1, 32           # a steady step: two of them make a timing block (BLOCK_SECONDS)


def steps(busy: list[bool]) -> list[StepTime]:
    """A warm-up step, then two steps per block; in a `busy` block other processes took 60% of the machine's CPU
    (and the step ran slower), elsewhere 2% (the machine's own housekeeping)."""
    out = [StepTime(0.5, SAMPLES, 0.0, own_cpu_s=0.5 * CORES, machine_cpu_s=0.5 * CORES)]
    for hit in busy:
        seconds = 0.14 if hit else STEP_S
        own = seconds * CORES * (0.4 if hit else 0.98)
        foreign = seconds * CORES * (0.6 if hit else 0.02)
        out += [StepTime(seconds, SAMPLES, 0.0, own_cpu_s=own, machine_cpu_s=own + foreign)] * 2
    return out


def test_disturbed_blocks_are_left_out_and_their_runs_named(monkeypatch):
    """The disturbance rule on step times as the clock reads them (StepTime: this process's CPU seconds and the
    whole machine's): a block where other processes used more than DISTURBED_SHARE of the cores is left out of the
    rate, and the rung's notes name each run that had one. Seed 0 is disturbed in some blocks, seed 1 in none,
    seed 2 in every one (its rate then comes from disturbed steps, and the notes say so)."""
    monkeypatch.setattr(os, "cpu_count", lambda: CORES)
    plans = {0: [False, True, False, True, False, False], 1: [False] * 6, 2: [True] * 6}
    runs = []
    for seed, busy in plans.items():
        timing = Timing.from_steps(steps(busy), check_disturbance=True)
        assert timing.warmup_steps == 1 and [b["steps"] for b in timing.blocks] == [2] * len(busy)
        assert [b["disturbed"] for b in timing.blocks] == busy
        runs.append({"seed": seed, "timing": timing.to_dict(), "world_size": 1, "peak_memory_bytes": 1 << 20})
    blocks = [b for run in runs for b in run["timing"]["blocks"]]
    assert all(b["foreign_share"] > DISTURBED_SHARE for b in blocks if b["disturbed"])
    assert all(b["foreign_share"] <= DISTURBED_SHARE for b in blocks if not b["disturbed"])
    # The rate is the clean blocks' alone: the disturbed ones' slower steps do not pull it down.
    assert runs[0]["timing"]["throughput"] == pytest.approx(SAMPLES / STEP_S)
    assert runs[1]["timing"]["throughput"] == pytest.approx(SAMPLES / STEP_S)
    assert runs[0]["timing"]["disturbed_steps"] == 4 and runs[1]["timing"]["disturbed_steps"] == 0
    # Every block disturbed: none left out (a rate from disturbed steps beats none), and the run is flagged.
    assert runs[2]["timing"]["all_disturbed"] and runs[2]["timing"]["disturbed_steps"] == 0
    assert runs[2]["timing"]["throughput"] == pytest.approx(SAMPLES / 0.14)
    rung = Rung("fused", {"optimizer_impl": "fused"}, Recipe(optimizer_impl="fused"), status=Status.DONE, repeats=runs)
    aggregate(rung, None)
    notes = caveats(rung)
    left_out = next(n for n in notes if "left out as disturbed" in n)
    assert "seed 0: 4" in left_out and "seed 1" not in left_out and "seed 2" not in left_out, notes
    busy = next(n for n in notes if "every block of steps was disturbed" in n)
    assert "seed 2" in busy and "seed 0" not in busy, notes
    # A quiet rung: nothing to say about other processes.
    quiet = Rung("fused", {"optimizer_impl": "fused"}, Recipe(optimizer_impl="fused"), status=Status.DONE,
                 repeats=runs[1:2])
    aggregate(quiet, None)
    assert not any("disturbed" in n for n in caveats(quiet))


def test_the_edges_of_a_disturbance_are_left_out_with_it(monkeypatch):
    """A block beside a disturbed one that other processes also reached (12% of the machine: the hog's start or
    end fell inside it) is left out with it; a block beside one at the housekeeping level (2%) is kept, and so is a
    12% block with no disturbed neighbour."""
    monkeypatch.setattr(os, "cpu_count", lambda: CORES)

    def block(share: float) -> list[StepTime]:
        own = STEP_S * CORES * (1 - share)
        return [StepTime(STEP_S, SAMPLES, 0.0, own_cpu_s=own, machine_cpu_s=STEP_S * CORES)] * 2

    shares = [0.02, 0.12, 0.6, 0.02, 0.02, 0.12, 0.02, 0.6, 0.02]
    warm = [StepTime(0.5, SAMPLES, 0.0, own_cpu_s=1.0, machine_cpu_s=1.0)]
    timing = Timing.from_steps(warm + [s for share in shares for s in block(share)], check_disturbance=True)
    assert [b["disturbed"] for b in timing.blocks] == [False, True, True, False, False, False, False, True, False]
    assert [bool(b.get("edge")) for b in timing.blocks] == [False, True] + [False] * 7
    assert timing.to_dict()["disturbed_steps"] == 6


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
