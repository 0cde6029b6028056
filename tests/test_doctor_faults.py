"""trainfast doctor: page faults: blamed only when many and costly, judged once malloc has adapted, and removed by
reuse_memory."""

import pytest

from trainfast.checks import NOT_HERE, Observations
from trainfast.envcheck import collect_environment
from doctor_kit import (DOCTOR_FAULTS, fault_obs)
# the shared fixtures, by name (pytest hands them to the tests that name them; no_load_window is autouse)
from doctor_kit import no_load_window  # noqa: F401


def test_page_faults_blamed_only_when_many_and_costly_and_the_switch_can_act():
    from trainfast.checks import page_faults

    available = {"in_effect": False, "unavailable": None}
    churn = page_faults(fault_obs(130_000, 0.25, reuse_memory=available))
    assert churn.status == "problem" and churn.fix == "--reuse-memory"
    # 0.25 kernel seconds over two threads busy for 1.3 s: 9.6% of the step's CPU, ~0.125 s of its wall time
    assert churn.share == pytest.approx(0.25 / 2.6) and churn.cost_s == pytest.approx(0.125)
    assert "130,000 page faults" in churn.evidence and "of its CPU time" in churn.evidence
    # The same kernel seconds on one thread are twice the share: never more than the whole step.
    assert page_faults(fault_obs(130_000, 0.25, threads=1, reuse_memory=available)).share == pytest.approx(0.25 / 1.3)
    assert page_faults(fault_obs(130_000, 2.0, threads=1, reuse_memory=available)).share == 1.0
    own = page_faults(fault_obs(130_000, 0.25, reuse_memory=available, recipe_flags=False))
    assert own.status == "problem" and "MALLOC_MMAP_MAX_=0" in own.fix and "-- COMMAND`" in own.fix
    script = page_faults(fault_obs(130_000, 0.25, reuse_memory=available, recipe_flags=False,
                                   command=["python", "train.py", "--data", "my photos"]))
    assert "`trainfast ablate --switches reuse_memory -- python train.py --data 'my photos'`" in script.fix
    assert "MALLOC_TRIM_THRESHOLD_=1125899906842624 python train.py --data 'my photos'`" in script.fix
    # A loader batch mapped from shared memory: a few thousand faults, a sliver of the step.
    assert page_faults(fault_obs(6_400, 0.004, reuse_memory=available)).status == "fine"
    # Many faults but a cheap kernel (a long step): below the material share; so are 0.1 s over two busy threads.
    assert page_faults(fault_obs(50_000, 0.02, reuse_memory=available)).status == "fine"
    assert page_faults(fault_obs(50_000, 0.1, reuse_memory=available)).status == "fine"
    on = page_faults(fault_obs(300, 0.01, reuse_memory={"in_effect": True, "unavailable": None}))
    assert on.status == "fine" and "reuse_memory is on" in on.evidence
    musl = page_faults(fault_obs(130_000, 0.25, reuse_memory={"in_effect": False, "unavailable": "needs glibc"}))
    assert musl.status == NOT_HERE and "needs glibc" in musl.evidence
    assert page_faults(fault_obs(130_000, 0.25, device="cuda:0", reuse_memory=available)).status == NOT_HERE
    uncounted = Observations("built-in", "cpu", collect_environment(), step_seconds=[1.0])
    assert page_faults(uncounted).status == NOT_HERE


def test_page_faults_near_their_line_are_measured_not_a_problem():
    """A count or a share just over its line is a number to know, not a verdict a rerun can flip (pytorch/examples'
    mnist once read 10,936 faults a step against the line of 10,000): a problem only from FAULTS_MARGIN x both."""
    from trainfast.checks import page_faults
    from trainfast.checks.findings import FAULTS_MARGIN, FAULTS_PER_STEP

    available = {"in_effect": False, "unavailable": None}
    mnist = page_faults(fault_obs(10_936, 0.26, reuse_memory=available))          # 10% of the step's CPU
    assert mnist.status == "measured" and mnist.fix == "--reuse-memory" and "near the line" in mnist.evidence
    assert mnist.share == pytest.approx(0.1) and mnist.cost_s == pytest.approx(0.13)
    # Many faults, a share just over MATERIAL_SHARE (6%): measured too; just under either line: fine.
    assert page_faults(fault_obs(130_000, 0.156, reuse_memory=available)).status == "measured"
    assert page_faults(fault_obs(FAULTS_PER_STEP - 1, 0.26, reuse_memory=available)).status == "fine"
    assert page_faults(fault_obs(130_000, 0.12, reuse_memory=available)).status == "fine"            # 4.6%
    # Clear of both margins: a problem.
    clear = int(FAULTS_MARGIN * FAULTS_PER_STEP)
    assert page_faults(fault_obs(clear, 0.26, reuse_memory=available)).status == "problem"
    assert page_faults(fault_obs(clear - 1, 0.26, reuse_memory=available)).status == "measured"
    # The verdict is on the last third of the steps: one step over the line among them does not make a problem.
    obs = fault_obs(0, 0.26, reuse_memory=available)
    obs.step_faults = [9_000, 9_500, 11_000, 9_800, 31_000, 9_900]
    assert page_faults(obs).status == "fine"


def test_page_faults_are_judged_on_the_last_watched_steps_once_malloc_has_adapted():
    # timm's train.py on ResNet-18 as the doctor watched it: glibc moved block after block to its heap
    from trainfast.checks import page_faults

    obs = fault_obs(0, 0.0, step_s=1.5, reuse_memory={"in_effect": False, "unavailable": None})
    obs.step_faults = [86301, 77656, 40287, 56647, 62779, 59434, 32876, 32891]
    obs.step_kernel_s = [0.184, 0.140, 0.084, 0.115, 0.124, 0.108, 0.052, 0.060]
    obs.step_cpu_s = [2.74, 2.76, 2.67, 2.70, 2.68, 2.66, 2.46, 2.49]
    found = page_faults(obs)
    assert found.status == "fine", found.evidence            # 0.060 s of 2.49 CPU s: 2.4%
    assert "32,891 page faults" in found.evidence and "falling from 67,152" in found.evidence


# Slow: two fresh interpreters each running the doctor (at once: each counts its own process's faults, and a
# count, not a time, is what is judged; starting them together halves the wait on 2 cores). Fast: the counting
# and the removal are
# test_reuse_memory::test_freed_memory_is_reused_instead_of_faulted_in_again, the doctor's per-step counters
# test_builtin_loop_is_checked_and_fine, the verdict test_page_faults_blamed_only_when_many_and_costly_and_the_switch_
# can_act and test_page_faults_near_their_line_are_measured_not_a_problem.
@pytest.mark.slow
@pytest.mark.skipif(__import__("trainfast.techniques.memory_reuse", fromlist=["x"]).unavailable() is not None,
                    reason="needs glibc's malloc")
def test_doctor_counts_a_steps_page_faults_and_reuse_memory_removes_them():
    from concurrent.futures import ThreadPoolExecutor

    from conftest import fresh_python

    drop = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")
    with ThreadPoolExecutor(2) as pool:
        plain, reused = pool.map(lambda on: fresh_python(DOCTOR_FAULTS.replace("{on}", on), drop=drop),
                                 ("False", "True"))
    faults, status, fix, evidence = plain
    assert faults >= 10_000, evidence          # each 48 MiB activation alone is 12,288 fresh pages
    assert status in ("problem", "measured", "fine") and (status == "fine" or fix == "--reuse-memory"), evidence
    kept, status, _, evidence = reused
    assert kept < faults / 10 and status == "fine" and "reuse_memory is on" in evidence, evidence
