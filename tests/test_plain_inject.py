"""The built-in switches in an unmodified plain loop (probe/inject.py): each applied through the Observer's hooks,
read back from the running loop, and training as the Session's equivalent does; refused, with why, where the trained
model is ambiguous or the switch cannot reach the loop. The loop (tests/scripts/plain_loop.py, a tiny CNN, 4 steps)
runs in this process."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_observed import plain_loop

from trainfast import Session
from trainfast.frameworks import SECTION
from trainfast.frameworks.board import Board
from trainfast.instruments.recompiles import CompileWindow
from trainfast.probe.inject import PLAIN, UNREACHED, PlainLoop
from trainfast.probe.observe import Observer
from trainfast.probe.scaler import CLOSURE, NO_SCALED_BACKWARD, TWO_OPTIMIZERS
from trainfast.recipe import Recipe

STEPS = 4


def injected(fields: dict, argv: list[str] = (), steps: int = STEPS) -> tuple[list[float], dict, dict]:
    """The loop run with `fields` switched in it: its losses, its plain-loop record (read back), its observed."""
    probe = SimpleNamespace(session=None, sections={SECTION: Board(dict(fields))}, compiles=CompileWindow().open(),
                            injected=None)
    observer = Observer().install()
    loop = PlainLoop(probe, observer, fields)
    try:
        losses = plain_loop().main(["--steps", str(steps), *argv])
    finally:
        observer.close()
        if loop.scaling is not None:
            loop.scaling.close()
    record = probe.sections[SECTION].to_dict().get(PLAIN, {})
    return losses, record, observer.observed(probe.compiles.read(), probe.injected or set())


def session_losses(recipe: Recipe, workers: int = 0, steps: int = STEPS) -> list[float]:
    """The same loop written with a Session (three lines), the same seed, data and order."""
    loop = plain_loop()
    torch.manual_seed(0)
    model = loop.cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 8, 3, 16, 16), torch.randint(0, 10, (steps * 8,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=workers)
    tf = Session(recipe, device="cpu")
    model, optimizer, loader = tf.setup(model, optimizer, loader)
    losses = []
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images).float(), labels)
        optimizer.zero_grad()
        tf.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


def switches(record: dict) -> dict[str, dict]:
    return {s["field"]: s for s in record["switches"].values()}


@pytest.fixture(scope="module")
def fp32():
    return injected({"precision": "fp32", "channels_last": False, "optimizer_impl": "default"})


def test_the_baseline_switches_nothing_and_trains_as_the_loop_alone(fp32):
    losses, record, seen = fp32
    assert losses == plain_loop().main(["--steps", str(STEPS)])
    assert record["switches"] == {} and seen["by"] == {} and seen["precision"] == "fp32"


@pytest.mark.parametrize("fields, field, observed, value", [
    ({"precision": "bf16"}, "precision", "precision", "bf16"),
    ({"channels_last": True}, "channels_last", "memory_format", "channels_last"),
    ({"optimizer_impl": "fused"}, "optimizer_impl", "optimizer_implementation", "fused"),
])
def test_each_switch_is_applied_read_back_and_trains_as_the_sessions(fp32, fields, field, observed, value):
    losses, record, seen = injected(fields)
    assert switches(record)[field]["applied"] is True, record
    assert seen[observed] == value and seen["by"][observed] == "trainfast"
    twin = session_losses(Recipe(**fields))
    assert losses == pytest.approx(twin, rel=1e-5)
    if field == "precision":
        assert losses != fp32[0], "no difference from fp32: the precision was not applied"


def test_compile_and_the_loader_settings_are_applied_and_read_back(fp32):
    """One compile (the slowest switch to test): its losses are the eager loop's, which the Session's equal
    bit for bit (tests/test_session.py), within the compiled kernels' rounding."""
    losses, record, seen = injected({"compile": True, "num_workers": 2, "persistent_workers": True})
    by_field = switches(record)
    assert by_field["compile"]["applied"] and by_field["num_workers"]["applied"] and seen["compiled"]
    assert seen["loader"]["num_workers"] == 2 and seen["loader"]["persistent_workers"] is True
    assert seen["by"] == {"compiled": "trainfast", "loader": "trainfast"}
    assert losses == pytest.approx(fp32[0], rel=1e-4)


def test_a_dtype_flag_the_cpu_ignores_runs_fp32_and_trainfasts_amp_runs_bf16():
    if torch.cuda.is_available():
        pytest.skip("the script's guard lets its flag act on a GPU")
    _, _, own = injected({"precision": "fp32"}, ["--dtype", "bf16"])
    _, record, ours = injected({"precision": "bf16"}, ["--dtype", "bf16"])
    assert own["precision"] == "fp32" and ours["precision"] == "bf16" and switches(record)["precision"]["applied"]


def test_the_scripts_own_switches_are_kept_and_named_its_own():
    _, record, seen = injected({"precision": "bf16", "optimizer_impl": "fused"}, ["--own-autocast", "--fused"])
    by_field = switches(record)
    assert by_field["precision"]["script"] == "bf16" and by_field["precision"]["applied"]
    assert by_field["optimizer_impl"]["script"] == "fused"
    assert seen["by"] == {"precision": "script", "optimizer_implementation": "script"}
    _, record, seen = injected({"precision": "fp32", "optimizer_impl": "default"}, ["--own-autocast", "--fused"])
    # the baseline turned nothing off
    assert (seen["precision"], seen["optimizer_implementation"]) == ("bf16", "fused")


@pytest.mark.parametrize("argv, fields, words", [
    (["--two-models"], {"precision": "bf16", "channels_last": True}, "two models trained in one loop"),
    (["--frozen-first"], {"compile": True}, "a model called outside any optimizer's parameters"),
    (["--optimizer", "lbfgs-like"], {"optimizer_impl": "fused"}, "takes no foreach/fused argument"),
    (["--two-optimizers"], {"precision": "fp16"}, TWO_OPTIMIZERS),
    ([], {"set_to_none": True, "prefetch": True}, UNREACHED),
])
def test_what_cannot_reach_the_loop_is_refused_with_why(argv, fields, words):
    _, record, seen = injected(fields, argv)
    for name in fields:
        assert words in record["unsupported"][name], record
    assert "trainfast" not in seen["by"].values()


# --- fp16: the Session's loss scaler around the loop's own backward and step (probe/scaler.py) -----------------

def scaler_of(record: dict) -> dict:
    return record["switches"]["torch.amp.GradScaler"]


def test_fp16_scales_the_loops_backward_steps_through_the_scaler_and_trains_as_the_sessions():
    """Eight steps from a scale of 2**16: the first ones overflow in fp16 and are skipped, counted as the Session
    counts them, and the losses are the Session's fp16 loop's."""
    losses, record, seen = injected({"precision": "fp16"}, steps=8)
    by_field = switches(record)
    assert by_field["precision"]["applied"] and seen["precision"] == "fp16" and seen["by"]["precision"] == "trainfast"
    scaler = scaler_of(record)
    assert scaler["applied"] is True and scaler["read_back"].startswith("8 steps scaled, "), scaler
    twin = session_losses(Recipe(precision="fp16"), steps=8)
    assert losses == pytest.approx(twin, rel=2e-3)
    assert losses != pytest.approx(injected({"precision": "fp32"}, steps=8)[0], rel=1e-6)


def test_fp16_unscales_before_the_loops_clip():
    """A clip_grad_norm_ between backward and step sees true gradients, as a Session's clip does: with a bound no
    true gradient reaches, the run trains as the unclipped one (clipping scaled gradients would shrink every step)."""
    clipped, record, _ = injected({"precision": "fp16"}, ["--clip", "1e4"])
    assert scaler_of(record)["applied"] is True
    assert clipped == pytest.approx(injected({"precision": "fp16"})[0], rel=1e-6)


@pytest.mark.parametrize("argv, why", [(["--autograd-grad"], NO_SCALED_BACKWARD)])
def test_fp16_stands_aside_where_the_step_is_not_its_backwards(argv, why):
    losses, record, _ = injected({"precision": "fp16"}, argv)
    scaler = scaler_of(record)
    assert scaler["applied"] is False and scaler["read_back"].endswith(why)
    assert all(math.isfinite(x) for x in losses)


def test_a_closure_step_is_not_scaled():
    from trainfast.probe.scaler import LossScaling
    from trainfast.techniques.precision import build_precision

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaling = LossScaling().install()
    try:
        scaling.arm(build_precision("fp16", torch.device("cpu")), optimizer)
        optimizer.step(lambda: model(torch.ones(1, 2)).sum())
    finally:
        scaling.close()
    assert scaling.refused == CLOSURE and optimizer.step.__name__ == "step" and "step" not in vars(optimizer)
