"""The Accelerate adapter (frameworks/accel.py): the switches Accelerate has a setting for reach the Accelerator's
own arguments, the others the objects handed to prepare() (schedulers rebound to a rebuilt optimizer), and each
is read back from what the Accelerator built; the baseline turns off what the script turned on and says what it
had; transformers' own Accelerator is left to the transformers adapter; without Accelerate nothing happens."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

accelerate = pytest.importorskip("accelerate")

import fwkit  # noqa: E402
from fwkit import ROOT  # noqa: E402

from trainfast.frameworks import accel  # noqa: E402
from trainfast.frameworks.board import UNSET, Board  # noqa: E402

EXAMPLE = str(ROOT / "examples" / "accelerate_loop.py")
sys.path.insert(0, str(ROOT / "examples"))

from accelerate_loop import make_model, quadrant_images  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_accelerate_state(monkeypatch):
    """Each test starts from no Accelerate state and no ACCELERATE_* settings (fwkit.fresh_accelerate_state)."""
    with fwkit.fresh_accelerate_state(monkeypatch):
        yield


patched = fwkit.patched_accelerator      # a patched subclass of Accelerator: the real class stays untouched


def training_objects(batch_size: int = 16):
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train = DataLoader(quadrant_images(64, seed=0), batch_size=batch_size, shuffle=True)
    evaluation = DataLoader(quadrant_images(32, seed=1), batch_size=32)
    return model, optimizer, train, evaluation


def proof(board: Board) -> dict[str, dict[str, Any]]:
    return board.to_dict()["accelerate"]["switches"]


def lambda_lr(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))


def test_prepare_rebuilds_the_optimizer_with_every_scheduler_rebound_and_switches_the_training_loader():
    """A scheduler passed with the optimizer, one prepared in a later call and one never prepared all follow the
    rebuilt optimizer (else the schedule would silently stop acting on the optimizer that steps)."""
    board = Board({"optimizer_impl": "fused", "channels_last": True, "num_workers": 1, "persistent_workers": True})
    model, optimizer, train, evaluation = training_objects()
    same_call, later, unprepared = lambda_lr(optimizer), lambda_lr(optimizer), lambda_lr(optimizer)
    acc = patched(board)()
    model, opt, eval_p, train_p, same_p = acc.prepare(model, optimizer, evaluation, train, same_call)
    later_p = acc.prepare(later)
    inner = opt.optimizer
    assert inner is not optimizer and inner.param_groups[0]["fused"] is True
    assert same_p.scheduler.optimizer is inner and later_p.scheduler.optimizer is inner
    assert unprepared.optimizer is inner
    assert [id(p) for g in inner.param_groups for p in g["params"]] == [id(p) for p in model.parameters()]
    for scheduler in (same_call, later, unprepared):
        scheduler.step()
    assert inner.param_groups[0]["lr"] == pytest.approx(1e-2 / 2)
    # the shuffled loader is the training one, even passed second; the evaluation loader stays as it was
    assert (train_p.num_workers, train_p.persistent_workers) == (1, True)
    assert board.samples_per_step == 16                              # the training loader's batch
    assert (eval_p.num_workers, eval_p.persistent_workers) == (0, False)
    switches = proof(board)
    assert all(s["applied"] for s in switches.values()), switches
    assert switches["optimizer implementation"]["read_back"] == "fused"
    assert switches["optimizer implementation"]["script"] == "default"
    assert switches["memory format"]["read_back"] == "channels_last"
    assert (switches["DataLoader.num_workers"]["script"], switches["DataLoader.num_workers"]["read_back"]) == (0, 1)


def test_the_baseline_turns_off_the_scripts_own_settings_in_process():
    board = Board({"precision": "fp32", "compile": False, "optimizer_impl": "default", "channels_last": False})
    model, _, train, _ = training_objects()
    model = torch.compile(model.to(memory_format=torch.channels_last))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    acc = patched(board)(mixed_precision="bf16", dynamo_backend="inductor")
    model, optimizer, train = acc.prepare(model, optimizer, train)
    assert acc.mixed_precision == "no" and not acc.native_amp
    assert type(model).__name__ != "OptimizedModule" and not optimizer.optimizer.param_groups[0]["fused"]
    switches = proof(board)
    assert all(s["applied"] for s in switches.values()), switches
    assert {k: (s["script"], s["read_back"]) for k, s in switches.items()} == {
        "mixed_precision": ("bf16", "no"), "autocast": (UNSET, False), "dynamo_backend": ("inductor", "no"),
        "compiled model": (True, False), "memory format": ("channels_last", "contiguous"),
        "optimizer implementation": ("fused", "default")}
    assert board.overridden() == {"accelerate.mixed_precision": ["bf16", "no"],
                                  "accelerate.dynamo_backend": ["inductor", "no"],
                                  "accelerate.compiled model": [True, False],
                                  "accelerate.memory format": ["channels_last", "contiguous"],
                                  "accelerate.optimizer implementation": ["fused", "default"]}


def test_set_to_none_switches_only_a_script_that_zeroes_in_place():
    board = Board({"set_to_none": True})
    model, optimizer, train, _ = training_objects()
    acc = patched(board)()
    model, optimizer = acc.prepare(model, optimizer)
    assert board.to_dict()["accelerate"]["unsupported"]["set_to_none"] == accel.NO_ZERO_GRAD
    optimizer.zero_grad()
    assert board.to_dict()["accelerate"]["unsupported"]["set_to_none"] == accel.FREES
    x, y = next(iter(train))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.zero_grad(set_to_none=False)           # forced to free: no zero-filled gradients left
    assert all(p.grad is None for p in model.parameters())
    record = board.to_dict()["accelerate"]
    assert "set_to_none" not in record["unsupported"]
    assert record["switches"]["zero_grad(set_to_none)"] == {
        "field": "set_to_none", "setting": "zero_grad(set_to_none)", "wanted": True, "script": False,
        "read_back": True, "applied": True}


def test_an_accelerator_that_transformers_builds_is_left_to_the_transformers_adapter():
    board = Board({"precision": "bf16", "channels_last": True})
    Acc = patched(board)
    scope = {"__name__": "transformers.trainer", "Acc": Acc, "model": make_model()}
    exec("acc = Acc(mixed_precision='no')\nprepared = acc.prepare(model)", scope)
    assert scope["acc"].mixed_precision == "no" and board.to_dict() == {}
    assert accel.memory_format_of(scope["prepared"]) == "contiguous"


def test_a_read_back_that_differs_is_not_applied():
    """The script's autocast handler turns autocast off: mixed_precision reads back bf16, autocast does not."""
    from accelerate.utils import AutocastKwargs

    board = Board({"precision": "bf16"})
    acc = patched(board)(kwargs_handlers=[AutocastKwargs(enabled=False)])
    acc.prepare(make_model())
    switches = proof(board)
    assert switches["mixed_precision"]["applied"] is True
    assert switches["autocast"]["applied"] is False and switches["autocast"]["read_back"] is False


# --- measured runs of the example (the way `trainfast ablate -- COMMAND` starts them) -------------------------

def measured_run(args: list[str], fields: dict[str, Any], out: Path, script: str = EXAMPLE,
                 **env_extra: str) -> dict[str, Any]:
    """A run of the example (one epoch of 320 samples unless `args` say otherwise), measured as the ablation
    starts it (fwkit.measured_run, full mode)."""
    argv = [script, *(["--epochs", "1", "--train-size", "320"] if script == EXAMPLE else []), *args]
    return fwkit.measured_run(argv, fields, out, **env_extra)


def read_backs(result: dict[str, Any]) -> dict[str, Any]:
    switches = result["frameworks"]["accelerate"]["switches"]
    assert all(s["applied"] is True for s in switches.values()), switches
    return {name: s["read_back"] for name, s in switches.items()}


BASELINE = {"precision": "fp32", "set_to_none": False, "non_blocking": False, "pin_memory": False,
            "prefetch": False, "channels_last": False, "compile": False, "optimizer_impl": "default", "seed": 0}


@pytest.mark.slow
def test_each_rung_of_the_ladder_reaches_the_accelerator_and_is_read_back(tmp_path):
    """The default ladder's rungs on CPU (cumulative, compile left to its own test): every switch applied."""
    rung = {**BASELINE, "precision": "bf16", "set_to_none": True, "prefetch": True, "channels_last": True,
            "optimizer_impl": "fused", "num_workers": 1, "persistent_workers": True}
    result = measured_run([], rung, tmp_path)
    assert read_backs(result) == {
        "mixed_precision": "bf16", "autocast": True, "dynamo_backend": "no", "compiled model": False,
        "non_blocking": False, "memory format": "channels_last", "optimizer implementation": "fused",
        "DataLoader.pin_memory": False, "DataLoader.num_workers": 1, "DataLoader.persistent_workers": True,
        "set_seed": BASELINE["seed"]}                                   # the example's set_seed(0), the run's seed
    unsupported = result["frameworks"]["accelerate"]["unsupported"]
    assert set(unsupported) == {"set_to_none", "prefetch"}          # the example's zero_grad() frees already
    assert result["steps_run"] == 10 and result["rate_unit"] == "samples/s"


@pytest.mark.slow
def test_the_compile_rung_compiles_the_prepared_model(tmp_path):
    result = measured_run([], {**BASELINE, "compile": True}, tmp_path)
    backs = read_backs(result)
    assert backs["dynamo_backend"] == "inductor" and backs["compiled model"] is True
    assert result["compile"]["frames"] > 0


@pytest.mark.slow
def test_the_baseline_turns_off_what_the_script_turned_on_and_reports_it(tmp_path):
    result = measured_run(["--mixed-precision", "bf16", "--fused"], BASELINE, tmp_path)
    switches = result["frameworks"]["accelerate"]["switches"]
    assert read_backs(result)["mixed_precision"] == "no" and switches["autocast"]["read_back"] is False
    assert switches["mixed_precision"]["script"] == "bf16"
    assert (switches["optimizer implementation"]["script"], switches["optimizer implementation"]["read_back"]) \
        == ("fused", "default")
    assert result["overridden"] == {"accelerate.mixed_precision": ["bf16", "no"],
                                    "accelerate.optimizer implementation": ["fused", "default"]}


@pytest.mark.slow
def test_an_explicit_setting_and_accelerates_environment_are_overridden_and_reported(tmp_path):
    """The script's Accelerator(mixed_precision="no") and an ACCELERATE_DYNAMO_BACKEND left by `accelerate
    launch`: the run's explicit arguments win, and what the script would have had is reported."""
    result = measured_run(["--mixed-precision", "no"], {**BASELINE, "precision": "bf16"}, tmp_path,
                          ACCELERATE_DYNAMO_BACKEND="inductor")
    backs = read_backs(result)
    assert backs["mixed_precision"] == "bf16" and backs["autocast"] is True
    assert backs["dynamo_backend"] == "no" and backs["compiled model"] is False
    assert result["overridden"] == {"accelerate.mixed_precision": ["no", "bf16"],
                                    "accelerate.dynamo_backend": ["inductor", "no"]}


@pytest.mark.slow
def test_the_accelerator_of_transformers_trainer_is_switched_once_by_the_transformers_adapter(tmp_path):
    pytest.importorskip("transformers")
    fields = {"precision": "bf16", "optimizer_impl": "fused", "seed": 0}
    result = measured_run(["--train-size", "64", "--epochs", "1", "--output-dir", "out"], fields, tmp_path,
                          script=str(ROOT / "examples" / "hf_trainer.py"))
    assert set(result["frameworks"]) == {"transformers"}
    assert result["frameworks"]["transformers"]["switches"]["bf16"]["read_back"] is True


@pytest.mark.slow
def test_without_accelerate_the_adapters_do_nothing():
    code = ("import sys\nsys.modules['accelerate'] = None\n"
            "from trainfast.frameworks import install\n"
            "class Probe: sections = {}\n"
            "board = install(Probe(), {'precision': 'bf16', 'compile': True, 'optimizer_impl': 'fused'})\n"
            "try:\n    from accelerate import Accelerator\nexcept ImportError:\n    pass\n"
            "else:\n    raise SystemExit('accelerate imported')\n"
            "print(board.to_dict(), Probe.sections['frameworks'] is board)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "{} True" and "Traceback" not in out.stderr
