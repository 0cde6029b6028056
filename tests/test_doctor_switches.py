"""The doctor names the built-in switches it could apply to a script's loop as it is (checks/switches.py), from what
the run was seen doing (probe/observe.py's `observed`): each with its saving where the doctor measured one (the
loader's wait) and "not measured" with the ablation that measures it where it did not. Faked observations."""
from __future__ import annotations

import io

from rich.console import Console

from trainfast.checks import NOT_HERE, SWITCH, Observations, rank
from trainfast.checks.switches import SWITCH_CHECKS
from trainfast.doctor.output import print_findings

PLAIN = {"precision": "fp32", "autocast": False, "compiled": False, "recompiles": 0, "optimizer": "SGD",
         "optimizer_implementation": "foreach", "memory_format": "contiguous", "by": {}, "refusal": None,
         "loader": {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None}}
COMMAND = ["python", "main.py", "-a", "resnet18", "data dir"]


def observations(observed: dict | None, waits: list[float] | None = None, **more) -> Observations:
    steps = [0.100] * 8
    return Observations("own loop", "cpu", {}, steps_run=17, step_seconds=steps, data_wait_s=waits,
                        command=COMMAND, observed=observed, recipe_flags=False, **more)


def checked(obs: Observations) -> list:
    """The switch checks' findings, ranked as the doctor ranks them (checks.run_checks runs them among the rest)."""
    return rank([f for f in (check(obs) for check in SWITCH_CHECKS) if f is not None])


def switch_findings(obs: Observations) -> dict[str, object]:
    return {f.name.split("(--switches ")[1].rstrip(")"): f for f in checked(obs)}


def test_a_plain_fp32_loop_is_told_each_switch_with_the_saving_measured_or_the_ablation_that_measures_it():
    found = switch_findings(observations(PLAIN, [0.030] * 8, half_ceiling=("bf16", 600e9), ceiling_flops=200e9))
    assert list(found) == ["workers", "amp", "compile", "fused", "channels_last"]      # the measured saving first
    workers = found["workers"]
    assert workers.status == SWITCH and workers.cost_s == 0.030 and workers.share == 0.3
    assert "waits 30 ms a step (30%)" in workers.evidence
    for name in ("amp", "compile", "fused", "channels_last"):
        f = found[name]
        assert f.status == SWITCH and f.cost_s is None and "not measured here" in f.evidence, f
        assert f"`trainfast ablate --switches {name} -- python main.py -a resnet18 'data dir'`" in f.fix
    assert "3.0x its fp32 one: a roof, not the loop's saving" in found["amp"].evidence
    assert "SGD runs its foreach implementation" in found["fused"].evidence
    out = io.StringIO()
    print_findings(checked(observations(PLAIN, [0.030] * 8)), observations(PLAIN), Console(file=out, width=300))
    text = out.getvalue()
    assert "30 ms (30%)" in text and text.count("not measured") >= 4 and "fix: `trainfast ablate --switches" in text


def test_what_the_loop_has_already_is_not_named_and_an_ambiguous_model_is_said():
    done = {**PLAIN, "precision": "bf16", "autocast": True, "compiled": True, "optimizer_implementation": "fused",
            "memory_format": "channels_last", "loader": {**PLAIN["loader"], "num_workers": 4}}
    assert switch_findings(observations(done)) == {}
    assert switch_findings(observations(None)) == {}                 # a built-in run, or no training forward seen
    two = switch_findings(observations({**PLAIN, "refusal": "two models trained in one loop: ..."}))
    assert two["compile"].status == NOT_HERE and "two models trained in one loop" in two["compile"].evidence
    assert two["workers"].status == SWITCH and two["workers"].cost_s is None      # the loader is not the model's


def test_workers_that_cannot_win_the_wait_back_save_nothing():
    found = switch_findings(observations(PLAIN, [0.002] * 8, handoff_s=0.010, num_workers=0))
    workers = found["workers"]
    assert workers.status == "measured" and workers.cost_s == 0.0 and "workers cannot win it back" in workers.evidence
