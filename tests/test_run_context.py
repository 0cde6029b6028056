"""Whether a switch can act in a run is judged from its declaration (Switch.context_effect on a RunContext), looped
over by the ablation: no switch is a special case in the ablation's code."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from trainfast import techniques
from trainfast.ablation.ladders import plan_rungs
from trainfast.ablation.work import mark_effects
from trainfast.recipe import Recipe
from trainfast.results import EffectLabel, Rung, Status
from trainfast.tasks import effects
from trainfast.techniques.base import ACTS, Effect
from trainfast.techniques.switch import RunContext, Switch

CPU = torch.device("cpu")
SRC = Path(__file__).resolve().parents[1] / "src" / "trainfast"


def test_a_declared_context_effect_rules_its_rung_out_through_the_loop(monkeypatch):
    seen = []

    def only_with_saves(run: RunContext) -> Effect:
        seen.append(run)
        return ACTS if run.saves else Effect(False, "this run writes no checkpoint", applies=False)

    fake = Switch(("async_checkpoint",), context_effect=only_with_saves)
    table = {**techniques.owners(), "async_checkpoint": fake}
    monkeypatch.setattr(techniques, "owners", lambda: table)
    monkeypatch.setattr(effects, "owners", lambda: table)
    base = Recipe()

    def plan() -> list[Rung]:
        on = {"async_checkpoint": True}
        return [Rung("baseline", {}, base), Rung("saver", on, base.replace(**on))]

    ruled = plan()
    mark_effects(ruled, RunContext(CPU, saves=False))
    assert ruled[1].status == Status.NO_EFFECT and ruled[1].effect == EffectLabel.NOT_APPLICABLE
    assert ruled[1].reason == "this run writes no checkpoint"
    kept = plan()
    mark_effects(kept, RunContext(CPU, saves=True))
    assert kept[1].status != Status.NO_EFFECT and kept[1].effect == EffectLabel.MEASURED
    assert [run.saves for run in seen] == [False, True]       # the run as the work described it reached the switch


@pytest.mark.parametrize("rung, run, words", [
    ("set_to_none", RunContext(CPU, builtin=True), "already frees the gradients"),
    ("async_checkpoint", RunContext(CPU, builtin=True, saves=False), "--save-every"),
    ("passive_threads", RunContext(CPU, builtin=True, workers=0), "num_workers=0"),
])
def test_the_declared_switches_say_what_the_run_leaves_them_to_change(rung, run, words):
    ruled = plan_rungs(Recipe(), [rung], device=CPU)
    mark_effects(ruled, run)
    assert ruled[1].status == Status.NO_EFFECT and ruled[1].effect == EffectLabel.NOT_APPLICABLE
    assert words in ruled[1].reason
    unknown = plan_rungs(Recipe(), [rung], device=CPU)   # a script's run: its loop, saves and workers not known
    mark_effects(unknown, RunContext(CPU))
    assert unknown[1].status != Status.NO_EFFECT


def test_no_switch_is_named_in_the_ablations_work():
    """Every field a speed switch owns (one with a rung), as a string in ablation/work.py: none (the declarations
    and the loop over them decide)."""
    fields = {name for switch in techniques.switches() if switch.rungs for name in switch.fields}
    tree = ast.parse((SRC / "ablation" / "work.py").read_text(encoding="utf-8"))
    named = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in fields}
    named |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "FIELD"}
    assert named == set()


def test_a_task_declares_the_switches_it_does_not_run():
    """A detector's compile is ruled out by its task's declaration (TaskDeclaration.not_run), with why; another
    task judges compile as the techniques do."""
    from trainfast.tasks import build_task

    effect = build_task("detection").task_effect("compile", CPU, None, None, True)
    assert not effect.acts and effect.label == EffectLabel.NOT_APPLICABLE and "detector" in effect.reason
    assert build_task("classification").task_effect("compile", CPU, None, None, True).acts
