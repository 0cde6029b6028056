"""fast_fp32_matmul: fp32 matmuls with bf16 (a CPU with native bf16) or TF32 (GPU) inputs, a process switch
(techniques/matmul_precision.py): set by a Session, in a rung's process, in a user's command as torch is imported,
and by `trainfast train`; read back in each; not applicable where the CPU has no native bf16."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainfast import Recipe, techniques
from trainfast.launch import run_environment
from trainfast.probe import MeasureSpec
from trainfast.tasks.effects import data_effect
from trainfast.techniques import matmul_precision

ROOT = Path(__file__).resolve().parents[1]
FIELD = matmul_precision.FIELD
native_bf16 = pytest.mark.skipif(not matmul_precision.cpu_has_bf16(), reason="this CPU has no native bf16")


@pytest.fixture(autouse=True)
def restored():
    """Every test leaves this process's matmul precision as it found it (the default)."""
    yield
    matmul_precision.apply(False)
    torch.set_float32_matmul_precision("highest")


def test_it_is_a_process_switch_read_before_torch_loads():
    assert FIELD in techniques.process_wide_fields() and "matmul_precision" in techniques.PROCESS_WIDE_MODULES
    assert FIELD in techniques.own_process_fields() and FIELD in techniques.rung_table(None)
    assert techniques.process_env({FIELD: True}) == {}          # no variable: it is set as torch is imported


def test_not_applicable_on_a_cpu_without_native_bf16(monkeypatch):
    monkeypatch.setattr(matmul_precision, "cpu_has_bf16", lambda: False)
    effect = data_effect(FIELD, torch.device("cpu"), None)
    assert not effect.acts and "no native bf16" in effect.reason


@native_bf16
def test_it_acts_on_a_cpu_with_native_bf16_and_changes_the_products():
    assert data_effect(FIELD, torch.device("cpu"), None).acts
    torch.manual_seed(0)
    a, b = torch.randn(256, 512), torch.randn(512, 256)
    exact = (a.double() @ b.double()).float()
    full = a @ b
    matmul_precision.apply(True)
    reduced = a @ b
    assert matmul_precision.in_effect() and reduced.dtype == torch.float32
    # bf16 inputs, fp32 accumulation: close to the exact product, and not the fp32 kernel's own result
    assert torch.allclose(reduced, exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item())
    assert not torch.equal(reduced, full)


def test_a_session_sets_it_and_a_later_one_without_it_undoes_it():
    from trainfast import Session

    Session(Recipe(fast_fp32_matmul=True), env=False, device="cpu")
    assert matmul_precision.in_effect() and techniques.process_wide_in_effect()[FIELD] is True
    Session(Recipe(), env=False, device="cpu")
    assert not matmul_precision.in_effect()


def test_a_users_own_setting_is_never_undone():
    """Off undoes only what trainfast set: a script that asked for it itself keeps it."""
    from trainfast import Session

    torch.set_float32_matmul_precision("medium")
    Session(Recipe(), env=False, device="cpu")
    assert matmul_precision.in_effect()


@pytest.mark.slow
def test_a_command_gets_it_as_soon_as_it_imports_torch(tmp_path):
    """A script with no Session and no framework (it only imports torch): the ablation's start-up in its process
    (sitecustomize -> probe) sets it; its baseline run does not."""
    code = ("import json, torch; from trainfast.techniques import matmul_precision; "
            "print(json.dumps(matmul_precision.in_effect()))")
    seen = {}
    for on in (True, False):
        spec = MeasureSpec(str(tmp_path / f"result-{on}.json"), "speed")
        env = {**os.environ, **run_environment({FIELD: on, "seed": 0}, spec)}
        env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + str(ROOT / "src")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        seen[on] = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {True: True, False: False}


def test_a_rungs_process_sets_it_and_its_record_says_so(digits16):
    import dataclasses

    from conftest import tiny_resnet

    from trainfast.ablation.rung import Job, run_rung
    from trainfast.data.datasets import TensorImages

    few = dataclasses.replace(digits16, train=TensorImages(digits16.train.images[:256], digits16.train.labels[:256]),
                              val=TensorImages(digits16.val.images[:64], digits16.val.labels[:64]))
    job = Job(tiny_resnet, few, device="cpu")
    rung = run_rung(job, Recipe(batch_size=64, fast_fp32_matmul=True), lambda event: None)
    assert rung[FIELD] is True
    baseline = run_rung(job, Recipe(batch_size=64), lambda event: None)
    assert baseline[FIELD] is False


def test_train_sets_it_through_the_session(tmp_path, capsys):
    from trainfast.cli import main

    code = main(["train", "--image-size", "16", "--epochs", "1", "--fast-fp32-matmul", "--out", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr().err
    assert matmul_precision.in_effect()
    assert json.loads((tmp_path / "r" / "recipe.json").read_text())[FIELD] is True


# Slow: whole ablations, the built-in one and a plain script's (no Session: only the process switches reach it).
@pytest.mark.slow
@native_bf16
def test_the_built_in_ablation_runs_its_rung_with_it_and_the_baseline_without(tmp_path, digits16):
    from conftest import ablate_one_switch

    result = ablate_one_switch(digits16, FIELD, Recipe(batch_size=64), tmp_path)
    by_name = {r.name: r for r in result.rungs}
    assert by_name[FIELD].status == "done" and by_name[FIELD].repeats[0][FIELD] is True
    assert by_name["baseline"].repeats[0][FIELD] is False


@pytest.mark.slow
@native_bf16
def test_a_plain_script_is_measured_with_it(tmp_path):
    """In this process, through the API the command line calls (as test_ablate_command's default ladder on a plain
    loop): millisecond steps timed over 8 steps, not stretched to the command line's 2 s in each run."""
    from test_ablate_command import ablate_in_process, rungs

    from trainfast.ablation import TimingBudget

    plain_loop = [sys.executable, str(ROOT / "examples" / "plain_loop.py"), "--epochs", "100"]   # no Session in it
    results = ablate_in_process(tmp_path / "plain", plain_loop, rungs=[FIELD], repeats=1,
                                budget=TimingBudget(steps=8, min_seconds=0.0))
    by_name = rungs(results)
    assert by_name["baseline"]["runs"][0]["process_switches"][FIELD] is False
    assert by_name[FIELD]["status"] == "done", by_name[FIELD]
    assert by_name[FIELD]["runs"][0]["process_switches"][FIELD] is True
