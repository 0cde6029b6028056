"""trainfast doctor: `trainfast doctor` as a command: doctor.json, refusals before work, a script observed in a
subprocess and kept going until its evaluation (or its limit)."""
import json
import sys
import time

import pytest
import torch
from torch import nn

from trainfast.checks import NOT_HERE, run_checks
from trainfast.cli import main
from trainfast.doctor import observe_loop
from doctor_kit import (LONG_EPOCH, LOOPS, MISTAKE_CHECKS, Net, SCRIPT, STYLES, TIMED_CHECKS, Tick, doctor_script,
                        finding, loop_statuses, run_loop, statuses, virtual_clock)
# the shared fixtures, by name (pytest hands them to the tests that name them; no_load_window is autouse)
from doctor_kit import no_load_window  # noqa: F401


def test_doctor_command_writes_doctor_json(tmp_path, capsys):
    out = tmp_path / "doc"
    assert main(["doctor", "--image-size", "8", "--batch-size", "8", "--log-every", "4", "--steps", "3",
                 "--out", str(out)]) == 0
    data = json.loads((out / "doctor.json").read_text())
    names = [f["name"] for f in data["findings"]]
    assert "environment" in names and "zero_grad without set_to_none" in names
    statuses = [f["status"] for f in data["findings"]]
    assert statuses == sorted(statuses, key=["problem", "measured", "fine", NOT_HERE].index)   # ranked
    assert "problem(s)" in capsys.readouterr().out


def test_doctor_refuses_bad_flags_before_work(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["doctor", "--steps", "0"])
    assert exc.value.code == 2
    assert main(["doctor", "--model", "no_such_model_xyz"]) == 2
    if not torch.cuda.is_available():                      # refused with the reason, not a stack trace
        assert main(["doctor", "--device", "cuda"]) == 2
        assert "torch sees no GPU: " in capsys.readouterr().err


def test_doctor_on_a_script(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "doc"
    assert main(["doctor", "--steps", "4", "--log-every", "4", "--out", str(out),
                 "--", sys.executable, str(script)]) == 0
    data = json.loads((out / "doctor.json").read_text())
    syncs = next(f for f in data["findings"] if f["name"] == "host-device syncs per step")
    assert syncs["status"] == "measured" and "loss.item()" in syncs["evidence"]    # a problem on a GPU only
    assert data["observations"]["steps_run"] == 1 + 4 + 4          # stopped after its steps (4 watched: --log-every)
    wait = data["observations"]["eval_wait"]                      # then kept going for an evaluation, to its end
    assert wait["outcome"] == "ended" and wait["steps"] == 30 - 9, wait
    # a plain loop: the switches trainfast could apply to it, none of their savings measured by the doctor
    switches = {f["name"].split("(--switches ")[1]: f for f in data["findings"] if f["group"] == "switch"}
    assert set(switches) == {"amp)", "compile)", "fused)"}, switches
    assert data["observations"]["observed"]["optimizer"] == "SGD"
    for f in switches.values():
        assert f["status"] == "switch" and f["cost_s"] is None and f"-- {sys.executable} {script}`" in f["fix"]
    # what it did, off a terminal: plain lines, its steps read from the file the script's process wrote
    said = capsys.readouterr().out
    assert "running the script: its start-up and first step … (1 of 9 steps, time left after the first" in said, said
    assert "running the script's steps, watched (syncs, shapes, gradients), then timed … (2 of 9 steps" in said, said
    assert json.loads((out / "progress.json").read_text())["steps"] >= 1


@pytest.mark.slow
def test_doctor_script_kept_going_until_its_epoch_end_evaluation(tmp_path):
    """`doctor -- python engine_loop.py`: the evaluation at the end of the epoch (24 steps) comes after the
    1 + 4 + 4 watched steps; the script is kept going until it, then stopped."""
    planted = doctor_script(tmp_path, LOOPS / "engine_loop.py", "--plant", "eval_with_grad")
    graph = next(f for f in planted["findings"] if f["name"] == "evaluation builds an autograd graph")
    assert graph["status"] == "problem" and "the loop's first evaluation" in graph["evidence"]
    assert planted["observations"]["eval_wait"]["outcome"] == "reached"
    assert planted["observations"]["steps_run"] == 9
    assert [name for name, status in loop_statuses(planted).items() if status == "problem"] == [graph["name"]]


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.parametrize("style", STYLES)
def test_doctor_script_clean_twins_have_no_problem(tmp_path, style):
    clean = doctor_script(tmp_path, LOOPS / f"{style}.py")
    assert clean["observations"]["eval_wait"]["outcome"] == "reached"
    assert "problem" not in loop_statuses(clean).values()
    for name in MISTAKE_CHECKS:             # a timed check may read "measured" on a loaded machine, never "problem"
        assert statuses(clean)[name] in (("fine", "measured") if name in TIMED_CHECKS else ("fine",)), name


def test_eval_within_waits_for_the_evaluation_up_to_its_limit():
    """A loop that does not evaluate within its watched steps is kept going, untimed, until `eval_within` seconds
    have passed (here on the virtual clock: each step takes 0.25 s of it), then its evaluation checks say why they
    were not checked; with the wait off it is stopped after its watched steps. The script's side (stopped at the
    limit, not at the epoch's end) is test_eval_within_limit_then_not_checked_with_the_reason (slow)."""
    with virtual_clock() as clock:
        model = nn.Sequential(Tick(clock, 0.25), Net())
        obs = observe_loop(lambda: run_loop(model, steps=1000), steps=4, sync_steps=2, eval_within=2.0)
        off = observe_loop(lambda: run_loop(model, steps=1000), steps=4, sync_steps=2, eval_within=0)
    wait = obs.eval_wait
    assert wait["outcome"] == "limit" and wait["waited_s"] >= 2 and wait["steps"] == 8, wait    # 8 x 0.25 s
    assert obs.steps_run == 1 + 2 + 4
    for name in ("evaluation builds an autograd graph", "evaluation without model.eval()"):
        found = finding(run_checks(obs), name)
        assert found.status == NOT_HERE and "--eval-within" in found.evidence and "2 s" in found.evidence
    assert off.eval_wait["outcome"] == "off" and off.eval_wait["steps"] == 0 and off.steps_run == 7


# Slow: waits 2 s of a script's real steps. Fast: test_eval_within_waits_for_the_evaluation_up_to_its_limit (and
# the wait off: stopped after the watched steps)
@pytest.mark.slow
def test_eval_within_limit_then_not_checked_with_the_reason(tmp_path):
    script = tmp_path / "long_epoch.py"
    script.write_text(LONG_EPOCH)
    t0 = time.monotonic()
    data = doctor_script(tmp_path, script, flags=("--eval-within", "2"))
    assert time.monotonic() - t0 < 120                      # stopped at the limit, not at the epoch's end
    wait = data["observations"]["eval_wait"]
    assert wait["outcome"] == "limit" and wait["waited_s"] >= 2 and wait["steps"] > 0
    for name in ("evaluation builds an autograd graph", "evaluation without model.eval()"):
        found = next(f for f in data["findings"] if f["name"] == name)
        assert found["status"] == NOT_HERE and "--eval-within" in found["evidence"] and "2 s" in found["evidence"]


@pytest.mark.slow
def test_a_script_that_stalls_while_waiting_is_stopped_from_outside(tmp_path, monkeypatch):
    import trainfast.doctor.script

    monkeypatch.setattr(trainfast.doctor.script, "EVAL_GRACE_S", 1.0)
    script = tmp_path / "stall.py"
    script.write_text(LONG_EPOCH)
    t0 = time.monotonic()
    obs = trainfast.doctor.observe_script([sys.executable, str(script), "--stall"], tmp_path / "doc", steps=4,
                                          sync_steps=4, eval_within=1.0)
    assert time.monotonic() - t0 < 60
    assert obs.eval_wait["outcome"] == "limit" and any("stopped from outside" in n for n in obs.notes)
    assert obs.steps_run == 9 and finding(run_checks(obs), "evaluation builds an autograd graph").status == NOT_HERE
