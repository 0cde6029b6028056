"""trainfast doctor: the doctor's false alarms: each mistake planted in loops of three orders and styles is found
where planted and nowhere else, and correct loops written elsewhere get no problem."""
import importlib
import json
import sys

import pytest

from trainfast.checks import run_checks
from trainfast.cli import main
from trainfast.doctor import observe_loop
from doctor_kit import (ALSO, COST_JUDGED, CPU_MEASURED, EVIDENCE, LOOPS, MACHINE, MISTAKE_CHECKS, PLANTS, REPO,
                        STYLES, TIMED_CHECKS, corpus_clock, doctor_script, finding, in_place_status, loop_statuses)
# the shared fixtures, by name (pytest hands them to the tests that name them; no_load_window is autouse)
from doctor_kit import (no_ceiling, no_load_window)  # noqa: F401


@pytest.mark.parametrize("plant", ["clean", *PLANTS])
@pytest.mark.parametrize("style", STYLES)
def test_corpus_mistake_found_where_planted_and_nowhere_else(style, plant, no_ceiling, capsys):
    """Every loop evaluates at the end of its 24-step epoch, after the 1 + 4 + 10 watched steps: the doctor
    keeps it going until then. The planted mistake's check says "problem" (with its evidence), every other
    mistake check says "fine" (checked, not skipped; a timed one may say "measured"), and nothing else is a
    problem."""
    loop = importlib.import_module(style)
    with corpus_clock([plant]):
        obs = observe_loop(lambda: loop.main(["--plant", plant]), steps=10, sync_steps=4)
    findings = run_checks(obs)
    assert obs.eval_wait["outcome"] == "reached" and obs.eval_wait["steps"] > 0
    expected = {PLANTS[plant]} | ALSO.get(plant, set()) if plant not in ("clean", *CPU_MEASURED) else set()
    if plant in COST_JUDGED and in_place_status(finding(findings, PLANTS[plant])) == "measured":
        expected = set()
    problems = {f.name: f.evidence for f in findings if f.status == "problem" and f.name != MACHINE}
    assert set(problems) == expected, problems
    reported = {**problems, **{f.name: f.evidence for f in findings if f.status == "measured"}}
    for name in MISTAKE_CHECKS:
        if name not in expected:
            allowed = (("fine", "measured") if name in TIMED_CHECKS or name == CPU_MEASURED.get(plant)
                       or name == COST_JUDGED.get(plant) else ("fine",))
            assert finding(findings, name).status in allowed, (name, finding(findings, name).evidence)
    if plant in CPU_MEASURED:
        assert finding(findings, PLANTS[plant]).status == "measured"
    if plant != "clean":
        assert EVIDENCE[plant] in reported[PLANTS[plant]], reported[PLANTS[plant]]
    if plant in ("zero_grad_in_place", "item_per_step"):               # the loop's own line is named
        assert f"{style}.py" in reported[PLANTS[plant]]


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.parametrize("script", ["tests/scripts/mnist_main.py", "examples/plain_loop.py",
                                    "examples/adopted_loop.py"])
def test_doctor_on_loops_written_elsewhere_reports_no_false_problem(tmp_path, script):
    """pytorch/examples' mnist (its data read offline) and the repository's examples: clean loops that
    evaluate at the end of each epoch. Every mistake check is checked and fine; nothing is a problem."""
    out = tmp_path / "doc"
    assert main(["doctor", "--out", str(out), "--", sys.executable, str(REPO / script)]) == 0
    data = json.loads((out / "doctor.json").read_text())
    found = loop_statuses(data)
    assert "problem" not in found.values(), [f for f in data["findings"] if f["status"] == "problem"]
    for name in ("zero_grad without set_to_none", "evaluation builds an autograd graph",
                 "evaluation without model.eval()", "dropout active in eval mode", "host-device syncs per step"):
        assert found[name] == "fine", name
    assert data["observations"]["eval_wait"]["outcome"] == "reached"


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.parametrize("script,expect", [
    ("compiled.py", {"compile: graph breaks and recompilations": "fine"}),
    ("vae.py", {"dropout active in eval mode": "measured", "evaluation without model.eval()": "fine"}),
    ("pseudo_labels.py", {"evaluation without model.eval()": "fine", "evaluation builds an autograd graph": "fine"}),
    ("tensor_dataset.py", {"num_workers=0": ("fine", "measured")}),
])
def test_doctor_on_correct_loops_in_the_idioms_people_use(tmp_path, script, expect):
    """A compiled model, a VAE whose forward samples, pseudo-labels computed by the model itself in training mode,
    an MLP on an in-memory TensorDataset: correct loops, each once a false alarm (a graph break the doctor's own
    counter made, "dropout" for sampling, "evaluation" for the pseudo-labels, workers advised for a 0.2 ms wait).
    No problem in the loop's checks; where a loop reads input-bound, the fix offered is not workers."""
    data = doctor_script(tmp_path, LOOPS / "people" / script)
    found = loop_statuses(data)
    assert "problem" not in found.values(), [f for f in data["findings"] if f["status"] == "problem"]
    for name, status in expect.items():
        assert found[name] in ((status,) if isinstance(status, str) else status), (name, found[name])
    wait = next(f for f in data["findings"] if f["name"] == "waiting for the next batch")
    assert not wait["evidence"].startswith("input-bound") or wait["fix"].startswith("not loader workers"), wait


def test_corpus_every_mistake_at_once_in_the_reference_engine_order(no_ceiling, capsys):
    """The loop with planted mistakes that its clean twin mirrors: in-place zero_grad after the forward, a
    per-step .item(), F.dropout without training=, evaluation at the epoch's end without no_grad, a slow
    dataset read in the training process. Each is found, with nothing else."""
    planted = ("zero_grad_in_place", "item_per_step", "functional_dropout", "eval_with_grad", "slow_loader")
    loop = importlib.import_module("engine_loop")
    with corpus_clock(planted):
        obs = observe_loop(lambda: loop.main(["--plant", ",".join(planted)]), steps=10, sync_steps=4)
    findings = run_checks(obs)
    problems = {f.name: f.evidence for f in findings if f.status == "problem" and f.name != MACHINE}
    in_place = finding(findings, PLANTS["zero_grad_in_place"])
    cost_judged = {PLANTS["zero_grad_in_place"]} if in_place_status(in_place) == "measured" else set()
    assert set(problems) == ({PLANTS[p] for p in planted if p not in CPU_MEASURED} - cost_judged
                             | ALSO["slow_loader"]), problems
    assert in_place.status == in_place_status(in_place) and "set_to_none=False" in in_place.evidence
    syncs = finding(findings, "host-device syncs per step")
    assert syncs.status == "measured" and "engine_loop.py" in syncs.evidence
