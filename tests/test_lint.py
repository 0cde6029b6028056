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


README_MAX_LINES = 400      # a user's first ten minutes; the detail belongs in docs/


def test_the_readme_is_a_users_guide_that_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail into docs/"
    first_block = lines[lines.index("```") + 1:]
    assert first_block[0].startswith("make ablate") and first_block[1].startswith("make test")
    first_screen = "\n".join(lines[:40])
    # both audiences find their way in on the first screen: a transformer script and the language-model task
    assert "trainfast ablate -- python" in first_screen and "--task lm" in first_screen
    assert "imagefolder:" in first_screen
