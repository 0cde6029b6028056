"""Third-party notices raised by trainfast's imports are held off the console (quiet.py); trainfast's own warnings
and a user's script's are not."""
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from trainfast import quiet

SRC = Path(__file__).resolve().parents[1] / "src"


def test_holds_a_library_warning_and_a_torch_log_record():
    import torch  # noqa: F401  (its log handler on "torch" is what a library's import speaks through)

    before = len(quiet.HELD)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with quiet.quiet_imports():
            exec(compile("import warnings; warnings.warn('old api', FutureWarning)", "/site-packages/lib.py", "exec"))
            logging.getLogger("torch.utils._pytree").warning("an Enum subclass is natively supported")
    assert not shown
    held = quiet.held_lines()[before:]
    assert any("old api" in line and "FutureWarning" in line for line in held)
    assert any("natively supported" in line for line in held)
    assert all(quiet.Hold is not type(f) for f in logging.getLogger("torch").handlers[0].filters)   # removed after


def test_trainfast_own_warning_is_said():
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with quiet.quiet_imports():
            exec(compile("import warnings; warnings.warn('precision is slow here', RuntimeWarning)",
                         str(SRC / "trainfast" / "techniques" / "precision.py"), "exec"))
    assert [str(w.message) for w in shown] == ["precision is slow here"]


def test_a_run_process_writes_what_it_holds_to_its_log(capsys, monkeypatch):
    """In a run's own process stderr is its log file (procs.child_main): held lines are written there."""
    import torch  # noqa: F401

    monkeypatch.setattr(quiet, "HELD", [])
    monkeypatch.setattr(quiet, "TO_STDERR", [False])
    quiet.hold("held before the log was opened")
    assert capsys.readouterr().err == ""
    quiet.write_held_to_stderr()
    with quiet.quiet_imports():
        logging.getLogger("torch.utils._pytree").warning("held after")
    err = capsys.readouterr().err
    assert "held before the log was opened" in err and "held after" in err


@pytest.mark.slow          # one interpreter importing transformers and torchao: ~8 s on a quiet 2-core machine
def test_cli_import_path_and_language_model_print_no_warning():
    """The default CLI import path and the language model's build (transformers imports torchao as it builds the
    first model) print nothing on stderr, with every warning shown (-W default)."""
    code = ("import trainfast.cli, trainfast.ablation, trainfast.tune, trainfast.doctor, trainfast.report\n"
            "from trainfast.text.models import build_lm\n"
            "from trainfast.techniques.optimizer_state import low_bit_class\n"
            "build_lm('llama-tiny', 64, 16, 0, 1)\n"
            "import importlib.util\n"
            "if importlib.util.find_spec('torchao'): low_bit_class('8bit')\n")
    pytest.importorskip("transformers")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr
