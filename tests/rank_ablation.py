"""One ablation of a script's two gloo ranks, shared by the tests that read it (test_ranks.py, test_rankfaults.py):
tests/scripts/rank_loop.py under `trainfast ablate --nproc 2 --mode each` with a baseline that plants nothing and
one rung per planted rank 1 (a straggler, a rank killed at its fifth batch, a rank stuck there), under a 3 s
collective timeout. Four runs in one ablation: the ablation's own start and close are paid once, not once a
module."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "rank_loop.py"
RUNGS = {"straggler": "PLANT=straggler", "killed": "PLANT=kill", "stuck": "PLANT=stuck"}

_done: dict[str, tuple[Path, subprocess.CompletedProcess]] = {}


def planted_ablation(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The ablation's folder and its process, run once per test session (the first module to ask runs it)."""
    if "planted" not in _done:
        out = tmp_path_factory.mktemp("planted") / "ablation"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": "", "PLANT_RANK": "1"}
        env.pop("TRAINFAST_RECIPE", None)
        rungs = [word for name, change in RUNGS.items() for word in ("--rung", f"{name}={change}")]
        proc = subprocess.run([sys.executable, "-m", "trainfast", "ablate", "--out", str(out), *rungs, "--mode", "each",
                               "--repeats", "1", "--nproc", "2", "--settle-within", "0", "--dist-timeout", "3s", "--",
                               sys.executable, str(SCRIPT)],
                              env=env, capture_output=True, text=True, timeout=900)
        assert (out / "results.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
        _done["planted"] = out, proc
    return _done["planted"]
