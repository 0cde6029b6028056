"""--memory-limit: the search's first stage (memory/) when the run must fit in a given memory. Side by side, in one
ladder: the baseline at its batch size and at each halving of it (what a user short of memory does first), and the
switches whose purpose is memory (those whose rung declares a memory-stage order, RungSpec.tune_memory: a chunked
loss, activation checkpointing, 8-bit optimizer states), each alone and all together, at the full batch size. What
fits is held to the limit by its measured peak (measure.memory.limit_peak); of the rungs that fit, the fastest is
the recipe the rest of the search starts from, and the reference it is judged against is the baseline at the
largest batch that fits without the switches.

The stages after it hold every rung to the limit too (a speed switch that costs memory, compile's buffers, is not
recommended over it), and the recommendation is checked against it at the end."""
from __future__ import annotations

from typing import Any

from ..ablation.scoring import fits, ladder_noises, recipe_changes, versus
from ..measure.memory import limit_peak
from ..recipe import Recipe, RecipeError
from ..results import AblationResult, Rung, Status
from .combine import Decision, mib, over_limit

HALVINGS = 3          # the baseline at 1/2, 1/4 and 1/8 of its batch: a smaller one is rarely a run worth having
MEMORY_SHARE = 0.4    # of the search's budget: the stages after it search the speed switches on what fits


def memory_rungs(base: Recipe, task: str, batch_search: bool) -> list[Rung]:
    """The baseline, its batch halvings (HALVINGS of them, when the run's batch size is the recipe's to change),
    each memory switch the task can name alone (one the recipe refuses on top of `base`, 8-bit Adam states for
    SGD, is left out), and all of them together."""
    from ..techniques import memory_rung_specs

    rungs = [Rung("baseline", {}, base)]
    sizes = [base.batch_size >> k for k in range(1, HALVINGS + 1)] if batch_search else []
    for size in (s for s in sizes if s >= 1):
        rungs.append(Rung(f"batch-{size}", {"batch_size": size}, base.replace(batch_size=size)))
    usable = {}
    for spec in memory_rung_specs(task):
        try:
            rungs.append(Rung(spec.name, dict(spec.changes), base.replace(**spec.changes)))
        except RecipeError:
            continue
        usable[spec.name] = dict(spec.changes)
    if len(usable) > 1:
        together = {k: v for changes in usable.values() for k, v in changes.items()}
        rungs.append(Rung("+".join(usable), together, base.replace(**together)))
    return rungs


def run_memory(search: Any, task: str) -> AblationResult:
    """The memory stage; `search` (search.py's Search) has its base become the fastest recipe that fits, and its
    notes say what it chose against what (a baseline that fits as it is leaves the base unchanged)."""
    limit = search.options.memory_limit
    rungs = memory_rungs(search.base, task, batch_search=search.options.command is None)
    search.work.mark_effects(rungs)
    result = search.stage("memory", rungs, search.options.repeats, share=MEMORY_SHARE)
    search.cut_note(result)
    done = [r for r in result.rungs if r.status == Status.DONE and r.repeats]
    base = result.rungs[0]
    fitting = [r for r in done if fits(r, limit) and (r is base or not r.result.metric_worse)]
    needs = {r.name: mib(limit_peak(r)) for r in result.rungs}
    if base in fitting:
        search.notes.append(f"memory limit {mib(limit)}: the baseline fits as it is ({needs[base.name]})")
        return result
    if not fitting:
        others = ", ".join(f"{r.name} {needs[r.name]}" for r in done[1:])
        unrun = len(result.rungs) - len(done)
        search.notes.append(f"memory limit {mib(limit)}: nothing measured fits it (the baseline {needs[base.name]}"
                            + (f"; {others}" if others else "")
                            + (f"; {unrun} rung(s) not measured, the stage's time spent" if unrun else "")
                            + "): the search goes on from the baseline and says so")
        return result
    chosen = max(fitting, key=lambda r: r.result.speedup or 0.0)
    smaller = [r for r in fitting if set(r.changes) == {"batch_size"}]
    reference = max(smaller, key=lambda r: r.recipe.batch_size) if smaller else None
    against = "no smaller batch of the baseline fits"
    if reference is not None:
        against = (f"the baseline at the largest batch that fits, {reference.recipe.batch_size} "
                   f"({reference.result.speedup:.2f}x, {needs[reference.name]})")
        if reference is not chosen:
            noises = ladder_noises(done)
            text = versus(chosen, reference, search.options.min_effect, noises).text
            against += f": {chosen.name} against it, {text}"
    search.notes.append(f"memory limit {mib(limit)}: the baseline needs {needs[base.name]}; {chosen.name} fits "
                        f"({needs[chosen.name]}) at {chosen.result.speedup:.2f}x the baseline's rate, the fastest that "
                        f"fits, measured side by side with {against}; the search goes on from it (memory/report.md)")
    search.base = chosen.recipe
    search.memory_choice = chosen
    return result


def named_for_memory(search: Any, decision: Decision) -> Decision:
    """A recommendation on top of the memory stage's choice, named with it: the search's later stages call that
    choice their baseline, which is not the baseline the user ran."""
    chosen = getattr(search, "memory_choice", None)
    if chosen is None:
        return decision
    decision.name = chosen.name if decision.name == "baseline" else f"{chosen.name}+{decision.name}"
    decision.notes.append(f"the speed-up is against {chosen.name}, the recipe the search went on from; "
                          f"{chosen.name} ran at {chosen.result.speedup:.2f}x the baseline's rate (memory stage)")
    return decision


def held_to_limit(search: Any, decision: Decision, measured: list[Rung]) -> Decision:
    """The recommendation, checked against the limit where a stage measured it: over it, the search's base (the
    memory stage's choice; `search`: search.py's Search) is recommended instead, and why is said."""
    limit = search.options.memory_limit
    if limit is None:
        return decision
    rung = next((r for r in reversed(measured) if r.status == Status.DONE and r.repeats
                 and not recipe_changes(r.recipe, decision.recipe)), None)
    if rung is None or fits(rung, limit):
        return decision
    # The search's base: the memory stage's choice where it moved it (named_for_memory names it), else the baseline
    return Decision(search.base, "baseline", gainers=decision.gainers,
                    dropped={**decision.dropped, decision.name: over_limit(rung, limit)}, notes=decision.notes)
