"""Running a script as one measured run of `trainfast ablate -- COMMAND` would (the rung's fields in
TRAINFAST_RECIPE, the probe's spec in TRAINFAST_MEASURE, trainfast's start-up hook first on PYTHONPATH), for
the framework adapters' tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainfast.launch import run_environment
from trainfast.probe import MeasureSpec

ROOT = Path(__file__).resolve().parents[1]


def measured_run(argv: list[str], fields: dict[str, Any], out: Path, mode: str = "full", timeout: float = 600,
                 **env_extra: str) -> dict[str, Any]:
    """Run `argv` (a python script and its arguments) measured with `fields`, in `out`, with `env_extra` added
    to its environment (and no ACCELERATE_* or TRAINFAST_* variable of the test's own); its result.json."""
    out.mkdir(parents=True, exist_ok=True)
    spec = MeasureSpec(str(out / "result.json"), mode, steps=8, seconds=5.0, floor=4, min_seconds=0.5)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "TRAINFAST_"))}
    env.update({"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT / "src"), **env_extra})
    env.update(run_environment(fields, spec))
    env["PYTHONPATH"] += os.pathsep + str(ROOT / "src")
    proc = subprocess.run([sys.executable, *argv], env=env, cwd=out, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


def switches(result: dict[str, Any], framework: str) -> dict[str, dict[str, Any]]:
    return result["frameworks"][framework]["switches"]


def patched_trainer_classes(board):
    """Subclasses of transformers' TrainingArguments and Trainer, patched by the adapter: the real classes stay
    untouched in this process."""
    import transformers

    from trainfast.frameworks import hf

    class Args(transformers.TrainingArguments):
        pass

    class Trainer(transformers.Trainer):
        pass
    hf.patch_arguments(Args, board)
    hf.patch_trainer(Trainer, board)
    return Args, Trainer


def patched_accelerator(board) -> type:
    """A subclass of Accelerator, patched by the adapter: the real class stays untouched in this process."""
    import accelerate

    from trainfast.frameworks import accel

    class Acc(accelerate.Accelerator):
        pass
    accel.patch_accelerator(Acc, board)
    return Acc


def patched_lightning_trainer(monkeypatch, board, package: str = "lightning.pytorch") -> type:
    """A patched subclass of Lightning's Trainer, and Lightning's optimizer and loader parsing patched for this
    test only (restored after it): the real classes stay untouched in this process."""
    import functools
    import importlib

    from trainfast.frameworks import lightning

    core = importlib.import_module(f"{package}.core.optimizer")
    source = importlib.import_module(f"{package}.trainer.connectors.data_connector")._DataLoaderSource
    monkeypatch.setattr(core, "_configure_optimizers", core._configure_optimizers)
    monkeypatch.setattr(source, "dataloader", source.dataloader)
    Trainer = type("Trainer", (importlib.import_module(package).Trainer,), {})
    record, fitting = functools.partial(lightning.record_of, board, package), {}
    lightning.patch_trainer(Trainer, board, package, record, fitting)
    lightning.patch_optimizer_conf(core, board, record)
    lightning.patch_loader_source(source, board, record, fitting)
    return Trainer


@contextmanager
def fresh_accelerate_state(monkeypatch):
    """Accelerate keeps one process-wide state (the first Accelerator's precision and compile settings): inside,
    none, and no ACCELERATE_* settings from the environment; reset again after."""
    from accelerate.state import AcceleratorState, GradientState

    for name in [n for n in os.environ if n.startswith("ACCELERATE_")]:
        monkeypatch.delenv(name)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    try:
        yield
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
