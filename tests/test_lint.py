"""The linter's verdict on the code, as a test: ruff with the project's configuration (pyproject.toml: pyflakes and
pycodestyle at 120 columns) finds nothing in src/, tests/, benchmarks/ and examples/."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.fail("ruff is not installed: `pip install -e '.[test]'` (make venv) installs it")


def test_ruff_finds_nothing():
    done = subprocess.run([*ruff(), "check", "--no-cache", "src", "tests", "benchmarks", "examples"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
