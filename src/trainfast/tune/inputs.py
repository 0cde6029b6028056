"""Stage 3 (input/): the input switches, tried once the recommended recipe is fast enough to be held by its input.

A switch that feeds the step faster (more loader workers, the decode cache, JPEGs decoded on the device) buys
nothing while the step is slower than the input, and everything once the step outruns it: a compiled bf16
ResNet-50 at 224 on one H200 eats ~6,400 images/s, 12 CPU workers decode ~3,450 320x256 JPEGs/s, so its epoch
runs at the loader's rate whatever the step does. Judged alone against the fp32 baseline (stage 1), whose step
the input still keeps up with, such a switch shows no gain and would be dropped. So after the recommendation,
when its own runs waited for their batches INPUT_BOUND_SHARE of each step or more, the input switches are run
on top of it, each against it; the one that gains most (firm, accuracy kept) joins the recipe, and while the
new recipe still waits for its input the rest are tried again on top of it (ROUNDS at most).

The input is the built-in run's loader, whose wait the run measures; a user's script keeps its own loader, so
for a script the stage only says, when its runs were measured input-bound, where the time goes."""
from __future__ import annotations

from typing import Any

from ..checks.findings import INPUT_BOUND_SHARE
from ..defaults import usable_cpus
from ..recipe import Recipe
from ..results import AblationResult, Rung, Status
from ..techniques import input_rung_specs, input_switches
from .combine import Decision
from .switches import firm_gain

INPUT_SWITCHES = input_switches()    # the names --switches takes for this stage (techniques/: RungSpec.tune_inputs)
ROUNDS = 3


def input_rungs(recipe: Recipe, names: list[str], available: int) -> list[Rung]:
    """The input switches not already in `recipe`, each on top of it, after `recipe` itself (the reference): the
    changes each declares for this stage (techniques/: RungSpec.tune_steps), in the stage's order."""
    rungs = [Rung("recommended", {}, recipe)]
    for spec in input_rung_specs():
        if spec.name in names:
            rungs += [Rung(name, changes, recipe.replace(**changes)) for name, changes in
                      spec.tune_steps(recipe, available)]
    return rungs


def wait_share(results: list[AblationResult | None], recipe: Recipe) -> float | None:
    """The share of each step the runs of `recipe` waited for their batches, as the last stage that measured
    `recipe` found it (None: no stage measured that recipe's wait)."""
    for result in results:
        for rung in (result.rungs if result else []):
            if rung.recipe == recipe and rung.status == Status.DONE and rung.result.data_wait_fraction is not None:
                return rung.result.data_wait_fraction
    return None


def held_note(share: float, name: str) -> str:
    return f"{name} waited for its batches {100 * share:.0f}% of each step"


def run_input(search: Any, found: Any, decision: Decision, last: bool) -> Decision:
    """Stage 3: while the recommended recipe is held by its input, the input switches on top of it (input/,
    input-2/, ...); returns the recommendation with what gained added. `search` and `found`: search.py's Search
    and Findings (found.inputs gets each round's result)."""
    share = wait_share([found.second, found.on_level, found.first], decision.recipe)
    if share is None or share < INPUT_BOUND_SHARE:
        return decision
    if search.options.command is not None:
        search.notes.append(f"{held_note(share, decision.name)}: the script's own loader feeds it (its workers, its "
                            "decoding); the input switches act on trainfast's loader only")
        return decision
    names = [n for n in INPUT_SWITCHES if not search.options.switches or n in search.options.switches]
    for round_ in range(1, ROUNDS + 1):
        rungs = input_rungs(decision.recipe, names, usable_cpus())
        search.work.mark_effects(rungs)
        if not any(r.status != Status.NO_EFFECT for r in rungs[1:]):
            search.notes.append(f"{held_note(share, decision.name)}; no input switch is left that acts here")
            break
        repeats = search.repeats_that_fit(sum(r.status != Status.NO_EFFECT for r in rungs),
                                          search.run_price("speed", decision.recipe))
        if repeats is None:
            search.note(f"{held_note(share, decision.name)}; the input switches were not tried on top of it "
                                "(would not fit the budget)")
            break
        stage = "input" if round_ == 1 else f"input-{round_}"
        result = search.stage(stage, rungs, repeats, last=last)
        search.cut_note(result)
        found.inputs.append(result)
        gained = [r for r in result.rungs[1:] if firm_gain(r)]
        if not gained:
            search.notes.append(f"{held_note(share, decision.name)}; no input switch gained firmly on top of it")
            break
        best = max(gained, key=lambda r: r.result.speedup)
        search.notes.append(f"{held_note(share, decision.name)}: {best.name} on top of it was "
                            f"{best.result.speedup:.2f}x faster (stage {stage})")
        decision = with_input(decision, best)
        share = best.result.data_wait_fraction
        if share is None or share < INPUT_BOUND_SHARE:
            break
    return decision


def with_input(decision: Decision, best: Rung) -> Decision:
    """The recommendation plus the input switch that gained most on top of it. Its speed-up over the baseline is
    the product of the two measured ones (the recipe over the baseline, the switch over the recipe), from two
    stages; the interval multiplies their bounds (wider than a joint one)."""
    a, b = decision.speedup_interval, best.result.speedup_interval
    return Decision(best.recipe, f"{decision.name} + {best.name}", gainers=[*decision.gainers, best.name],
                    combined=[*decision.combined, best.name], dropped=decision.dropped, notes=decision.notes,
                    speedup=decision.speedup * best.result.speedup,
                    speedup_interval=[a[0] * b[0], a[1] * b[1]] if a and b else None, batch=decision.batch)
