"""The run record's "observed" section (probe/observe.py): what a script's run was seen doing, read from the running
process (precision inside the training forward, compile, optimizer and its implementation, loader, memory format),
and who turned each on. The plain loop runs in this process, a few steps of a tiny CNN."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from trainfast.probe.observe import Observer

SCRIPT = Path(__file__).parent / "scripts" / "plain_loop.py"


def plain_loop():
    spec = importlib.util.spec_from_file_location("plain_loop", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def observe(argv: list[str]) -> tuple[dict, Observer]:
    observer = Observer().install()
    try:
        plain_loop().main(["--steps", "3", *argv])
    finally:
        observer.close()
    return observer.observed(), observer


def test_a_plain_loop_is_observed_as_it_runs():
    seen, observer = observe([])
    assert seen == {"precision": "fp32", "autocast": False, "compiled": False, "recompiles": 0,
                    "optimizer": "AdamW",
                    "optimizer_implementation": "for-loop" if not torch.cuda.is_available() else "foreach",
                    "loader": {"num_workers": 0, "pin_memory": False, "persistent_workers": False,
                               "prefetch_factor": None},
                    "memory_format": "contiguous", "by": {}}
    assert observer.refusal is None and isinstance(observer.model, torch.nn.Sequential)


def test_the_scripts_own_switches_are_observed_as_the_scripts():
    seen, _ = observe(["--own-autocast", "--fused"])
    assert (seen["precision"], seen["autocast"], seen["optimizer_implementation"]) == ("bf16", True, "fused")
    assert seen["by"] == {"precision": "script", "optimizer_implementation": "script"}
    assert observe([], )[0]["by"] == {}


def test_a_dtype_flag_guarded_by_the_device_is_observed_running_fp32():
    if torch.cuda.is_available():
        pytest.skip("the flag's guard lets it act on a GPU")
    seen, _ = observe(["--dtype", "bf16"])
    assert (seen["precision"], seen["autocast"]) == ("fp32", False)


@pytest.mark.parametrize("argv, words", [(["--two-models"], "two models trained in one loop"),
                                         (["--frozen-first"], "a model called outside any optimizer's parameters")])
def test_an_ambiguous_model_is_named_with_why(argv, words):
    _, observer = observe(argv)
    assert words in observer.refusal


def test_the_observer_leaves_nothing_patched_once_closed():
    init, iterate = torch.optim.Optimizer.__init__, torch.utils.data.DataLoader.__iter__
    observe([])
    assert torch.optim.Optimizer.__init__ is init and torch.utils.data.DataLoader.__iter__ is iterate


def test_every_script_runs_record_carries_the_section():
    from test_run_record import hand_probe

    from trainfast.probe import run_record

    probe = hand_probe()
    assert "observed" not in run_record(probe, "end")          # the built-in run's probe watches nothing
    _, probe.observer = observe(["--fused"])
    record = run_record(probe, "end")
    seen = record["observed"]
    assert seen["optimizer_implementation"] == "fused" and seen["by"] == {"optimizer_implementation": "script"}


def test_the_report_notes_what_each_rung_was_observed_doing():
    from trainfast.recipe import Recipe
    from trainfast.report.observed import observed_note
    from trainfast.results import Rung, RungResult, Status

    base, _ = observe([])
    amp = {**base, "precision": "bf16", "autocast": True, "by": {"precision": "trainfast"}}
    rungs = [Rung("baseline", {}, Recipe(), status=Status.DONE, result=RungResult(observed=base)),
             Rung("amp", {"precision": "bf16"}, Recipe(precision="bf16"), status=Status.DONE,
                  result=RungResult(observed=amp)),
             Rung("set_to_none", {"set_to_none": True}, Recipe(set_to_none=True), status=Status.NO_EFFECT)]
    (note,) = observed_note(rungs)
    assert "fp32, AdamW" in note and "bf16 autocast (trainfast)" in note and "set_to_none" not in note
    assert observed_note(rungs[2:]) == []                     # nothing observed (the built-in run): no note


def test_a_session_loops_precision_is_observed_inside_its_forward():
    from trainfast import Session
    from trainfast.recipe import Recipe

    observer = Observer().install()
    try:
        model = plain_loop().cnn()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tf = Session(Recipe(precision="bf16", channels_last=True), device="cpu")
        model, optimizer = tf.setup(model, optimizer)
        for _ in range(2):
            loss = model(torch.randn(4, 3, 16, 16)).float().sum()
            optimizer.zero_grad()
            tf.backward(loss)
            optimizer.step()
    finally:
        observer.close()
    seen = observer.observed(by_trainfast={"precision", "channels_last"})
    assert (seen["precision"], seen["autocast"], seen["memory_format"]) == ("bf16", True, "channels_last")
    assert seen["loader"] is None and seen["by"] == {"precision": "trainfast", "memory_format": "trainfast"}


def test_a_model_compiled_by_the_script_is_observed_without_asking_its_length():
    """A script's `torch.compile(model)` wrapper refuses len(), so its truth value: the record is still written."""
    observer = Observer()
    observer.model = torch.compile(torch.nn.Sequential(torch.nn.Linear(2, 2)))     # wrapped, never run
    seen = observer.observed()
    assert seen["compiled"] is True and seen["precision"] == "fp32" and seen["memory_format"] is None


def test_each_observed_value_a_switch_turns_on_is_declared_by_that_switch():
    """`by` says who turned each value on through the switch that declares it (Switch.observed): every such key is
    in the section, and its switch's field is a Recipe field."""
    from trainfast import Recipe
    from trainfast.probe.observe import observed_fields

    seen, _ = observe(["--fused"])
    declared = observed_fields()
    assert set(declared) == {"precision", "compiled", "optimizer_implementation", "loader", "memory_format"}
    assert set(declared) <= set(seen) and set(declared.values()) <= set(Recipe().to_dict())
