"""passive_threads: the OpenMP wait policy a process starts with (techniques/threads.py), carried to every
process trainfast starts and read back there, never claimed where it came too late."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from trainfast import Recipe
from trainfast.launch import run_environment
from trainfast.probe import MeasureSpec
from trainfast.tasks.effects import data_effect
from trainfast.techniques import process_env, starting_with, threads

ROOT = Path(__file__).resolve().parents[1]


def fresh_python(code: str, **env: str) -> dict:
    """conftest.fresh_python without the OpenMP wait policy of this process (a fresh OpenMP start)."""
    from conftest import fresh_python as run

    return run(code, drop=(threads.ENV,), **env)


def test_a_recipe_asks_for_the_variable_only_when_switched_on():
    assert process_env(Recipe()) == {}
    assert process_env(Recipe(passive_threads=True)) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert process_env({"passive_threads": True, "seed": 0}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert process_env({"seed": 0}) == {}


def test_a_command_run_starts_with_it_and_its_baseline_without():
    spec = MeasureSpec("/tmp/result.json", "speed")
    assert run_environment({"passive_threads": True}, spec)["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in run_environment({"passive_threads": False}, spec)


def test_starting_with_sets_the_variable_for_children_only_while_they_start(monkeypatch):
    monkeypatch.delenv(threads.ENV, raising=False)
    with starting_with(Recipe(passive_threads=True)):
        assert os.environ[threads.ENV] == "PASSIVE"
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OMP_WAIT_POLICY'))"],
                               capture_output=True, text=True).stdout.strip()
    assert child == "PASSIVE"
    assert threads.ENV not in os.environ                     # restored
    monkeypatch.setenv(threads.ENV, "ACTIVE")
    with starting_with(Recipe(passive_threads=True)):
        pass
    assert os.environ[threads.ENV] == "ACTIVE"                # a value that was there comes back


def test_the_read_back_is_the_environment_the_process_started_with():
    started = fresh_python("import json, os; os.environ['OMP_WAIT_POLICY'] = 'ACTIVE'; "
                           "from trainfast.techniques import threads; "
                           "print(json.dumps([threads.in_effect(), threads.started_env().get('OMP_WAIT_POLICY')]))",
                           OMP_WAIT_POLICY="passive")
    assert started == [True, "passive"]          # any case; a later change to os.environ does not count
    late = fresh_python("import json, os, torch; os.environ['OMP_WAIT_POLICY'] = 'PASSIVE'; "
                        "from trainfast.techniques import threads; print(json.dumps(threads.in_effect()))")
    assert late is False                          # set after torch loaded: OpenMP never saw it


def test_train_sets_it_before_torch_loads_and_only_when_asked():
    code = ("import json, sys; from trainfast import cli; "
            "cli.start_process_wide_switches({argv}); import os; loaded = 'torch' in sys.modules; "
            "from trainfast.techniques import threads; "
            "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), threads.in_effect(), loaded]))")
    on = fresh_python(code.format(argv=["train", "--passive-threads"]))
    assert on == ["PASSIVE", True, False]        # set while torch was not loaded yet
    off = fresh_python(code.format(argv=["train"]))
    assert off == [None, False, False]
    kept = fresh_python(code.format(argv=["train", "--passive-threads"]), OMP_WAIT_POLICY="ACTIVE")
    assert kept == ["ACTIVE", False, False]      # the user's own value stands, and is not called passive


def test_a_session_in_a_process_started_without_it_says_so(monkeypatch):
    from trainfast import Session

    if threads.in_effect():
        pytest.skip("this test process started with OMP_WAIT_POLICY=PASSIVE")
    with pytest.warns(RuntimeWarning, match="OMP_WAIT_POLICY is read once"):
        Session(Recipe(passive_threads=True), env=False, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Session(Recipe(), env=False, device="cpu")


@pytest.mark.slow
def test_training_is_bit_identical_with_it(tmp_path):
    """Same kernels, same results: `trainfast train` with the policy in effect (set before torch loaded) ends
    with exactly the weights of the run without it. The digits at their own 8 px: identity shows at any size."""
    env = {**{k: v for k, v in os.environ.items() if k != threads.ENV}, "PYTHONPATH": str(ROOT / "src")}
    runs = {flag: subprocess.Popen([sys.executable, "-m", "trainfast", "train", "--epochs", "1", "--batch-size", "64",
                                    "--image-size", "8", "--out", str(tmp_path / flag.strip("-")), flag],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for flag in ("--no-passive-threads", "--passive-threads")}       # both at once: their results are their own
    weights = []
    try:
        for flag, run in runs.items():
            _, stderr = run.communicate(timeout=300)
            assert run.returncode == 0, stderr
            assert "OMP_WAIT_POLICY is read once" not in stderr        # in effect: no warning
            weights.append(torch.load(tmp_path / flag.strip("-") / "model.pt", weights_only=True))
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.wait()
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


# Slow: a built-in ablation of the switch. Fast: test_a_plan_with_the_switch_starts_every_run_fresh (no effect
# without loader workers, through the marking the ablation itself does; with them every run spawned),
# test_starting_with_sets_the_variable_for_children_only_while_they_start (the spawned rung starts with it),
# test_the_read_back_is_the_environment_the_process_started_with (what its record reads).
@pytest.mark.slow
def test_the_switch_acts_where_workers_share_the_cores_and_is_read_back_in_the_rung(tmp_path, digits16):
    from conftest import ablate_one_switch

    assert data_effect("passive_threads", torch.device("cpu"), None).acts      # an OpenMP build (the wheels)
    shared = ablate_one_switch(digits16, "passive_threads", Recipe(batch_size=64, num_workers=1), tmp_path / "b")
    by_name = {r.name: r for r in shared.rungs}
    assert shared.settings["rungs"]["passive_threads"]["passive_threads"] is True
    assert by_name["passive_threads"].status == "done"
    assert by_name["passive_threads"].repeats[0]["passive_threads"] is True      # its process started with it
    assert by_name["baseline"].repeats[0]["passive_threads"] is threads.in_effect()


def test_a_plan_with_the_switch_starts_every_run_fresh(digits16):
    """The baseline of a plan that runs passive_threads is spawned too: forked from the warm server it would
    differ from the rung by more than the switch. Without loader workers the switch has nothing to act on."""
    from conftest import tiny_resnet

    from trainfast.ablation import plan_rungs
    from trainfast.ablation.work import BuiltinSpec, prepare_builtin
    from trainfast.results import Status

    spec = BuiltinSpec(tiny_resnet, digits16.train, digits16.val, mean=digits16.mean, std=digits16.std)
    assert data_effect("passive_threads", torch.device("cpu"), None).acts      # an OpenMP build (the wheels)
    work = prepare_builtin(spec, Recipe(batch_size=64, num_workers=1))
    plan = plan_rungs(work.base, ["passive_threads"], device=work.dev)
    work.mark_effects(plan)
    assert work.fresh
    rung = next(r for r in plan if r.name == "passive_threads")
    assert rung.status != Status.NO_EFFECT and rung.recipe.passive_threads
    work.mark_effects(plan_rungs(work.base, ["amp"], device=work.dev))
    assert not work.fresh
    # Without loader workers there is nothing for spinning threads to take cores from: not run, and said why.
    alone = prepare_builtin(spec, Recipe(batch_size=64))
    plan = plan_rungs(alone.base, ["passive_threads"], device=alone.dev)
    alone.mark_effects(plan)
    rung = next(r for r in plan if r.name == "passive_threads")
    assert rung.status == Status.NO_EFFECT and "num_workers=0" in rung.reason and not alone.fresh


LOADER_SCRIPT = """
import sys
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=int(sys.argv[1]))
model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_script_without_a_session_reports_the_loader_workers_beside_its_steps(tmp_path, workers):
    """What explains the switch's effect on a script: its DataLoader's worker processes, seen at its steps."""
    from fwkit import measured_run

    script = tmp_path / "loop.py"
    script.write_text(LOADER_SCRIPT)
    result = measured_run([str(script), str(workers)], {}, tmp_path / "run")
    assert result["session"] is False and result["steps_run"] == 32
    assert result["num_workers"] == workers


def test_the_report_says_why_it_was_slower():
    from trainfast.report.notes import caveats
    from trainfast.results import Rung, RungResult
    from trainfast.stats import FASTER, SAME, SLOWER

    def rung(workers, verdict, vs_previous=None):
        return Rung("passive_threads", {"passive_threads": True}, Recipe(passive_threads=True), status="done",
                    result=RungResult(num_workers=workers, verdict=verdict, vs_previous=vs_previous))

    assert any("no loader worker process ran beside the step" in c for c in caveats(rung(0, SLOWER)))
    assert any("slower with 2 loader worker process(es)" in c for c in caveats(rung(2, SLOWER)))
    # cumulative: the switch's own verdict is against the rung above, not the baseline
    assert any("no loader worker" in c for c in caveats(rung(0, FASTER, {"verdict": SLOWER})))
    assert not any("loader worker" in c for c in caveats(rung(0, SLOWER, {"verdict": SAME})))
    assert not any("loader worker" in c for c in caveats(rung(0, SAME)))
    assert not any("loader worker" in c for c in caveats(rung(None, SLOWER)))      # unknown: nothing said
    other = Rung("reuse_memory", {"reuse_memory": True}, Recipe(reuse_memory=True, passive_threads=True),
                 status="done", result=RungResult(num_workers=0, verdict=SLOWER))
    assert not any("loader worker" in c for c in caveats(other))                   # another switch's rung
