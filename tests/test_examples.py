"""examples/: the plain PyTorch loop and its trainfast.Session twin, run as scripts. The adopted one differs
from the plain one in three lines and the import, and in fp32 prints the same result bit for bit."""
from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def start(script: str, *args: str, recipe: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "TRAINFAST_RECIPE"}
    env.update(PYTHONPATH=str(ROOT / "src"), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")   # the same CPU math
    if recipe is not None:
        env["TRAINFAST_RECIPE"] = recipe
    return subprocess.Popen([sys.executable, str(EXAMPLES / script), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def final(proc: subprocess.CompletedProcess) -> tuple[float, float]:
    found = re.search(r"final train_loss=(\S+) val_accuracy=(\S+)", proc.stdout)
    assert found, proc.stdout
    return float(found.group(1)), float(found.group(2))


def test_the_adopted_loop_changes_three_lines_and_the_import():
    """Plus one optional line, tf.report, for the ablation's full mode."""
    plain = (EXAMPLES / "plain_loop.py").read_text().splitlines()
    adopted = (EXAMPLES / "adopted_loop.py").read_text().splitlines()
    diff = [line for line in difflib.unified_diff(plain, adopted, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    added = [line[1:].strip() for line in diff if line.startswith("+") and line[1:].strip()]
    removed = [line[1:].strip() for line in diff if line.startswith("-")]
    assert removed == ["loss.backward()"]
    assert added == ["import trainfast", "tf = trainfast.Session()",
                     "model, optimizer, train_loader, val_loader = "
                     "tf.setup(model, optimizer, train_loader, val_loader)",
                     "tf.backward(loss)",
                     "tf.report(val_accuracy=accuracy)            "
                     "# optional: what `trainfast ablate --measure full` compares"]


@pytest.mark.slow
def test_the_adopted_loop_gives_the_plain_loops_result_in_fp32_and_takes_a_recipe_from_the_environment():
    # The three runs at once, one thread each (OMP_NUM_THREADS=1): each one's numbers are its own.
    procs = [start("plain_loop.py", "--epochs", "1"), start("adopted_loop.py", "--epochs", "1"),
             start("adopted_loop.py", "--epochs", "1", recipe='{"precision": "bf16"}')]
    try:
        plain, adopted, bf16 = (finish(proc) for proc in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    plain, adopted = final(plain), final(adopted)
    assert adopted == plain
    assert plain[1] > 0.2                                  # it learned something (chance is 0.1)
    assert "TRAINFAST_RECIPE overrides the script's recipe: precision 'fp32' -> 'bf16'" in bf16.stderr
    assert final(bf16) != plain                            # autocast was applied
