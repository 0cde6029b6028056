"""`tune --target`: the last stage (to-target/) judges the candidates on their time to the user's target, side by
side in one ladder: the baseline, the recipe the search picked on rate (its switches leave the math alone or were
kept inside the accuracy band), that recipe with its batch changed, half, twice and four times as large (the
learning rate and warm-up following it: techniques/batch_scale.py), and that recipe with each switch the rate
search left out for its accuracy. The batch is the switch that changes the math most, so only here, where each
candidate's samples to target are measured over seeds, can it be weighed; and a switch whose metric at the planned
step fell outside the baseline's band may still reach the target sooner (a faster rate for a few more samples):
under a target the accuracy at a fixed step is not the judge, the time to the target is.

The recommendation is the candidate that reaches the target soonest among those firmly sooner than the baseline
(ablation/target.py: the bootstrap interval of its time ratio clear of 1); where that is not the rate pick, it
must also be measurably sooner than the rate pick (the interval of their own ratio clear of 1), else the rate pick
stands (the same math the rest of the search measured). Every candidate's time to target, with its factors, is
in tune.md beside the decision.
"""
from __future__ import annotations

from dataclasses import replace

from ..ablation.scoring import fits, recipe_changes
from ..ablation.target import MIN_RUNS, SOONER, TARGET_SEEDS, ratio_interval
from ..recipe import Recipe
from ..results import AblationResult, Rung, Status
from ..target import Target
from ..techniques import apply_recipe_rewrites, target_rung_specs
from ..techniques.batch_scale import lr_factor
from .combine import Decision
from .script import with_script

# The share of --budget kept for this stage: its candidates train to the target (longer runs than a timed one) and
# those that change the math get up to five seeds each.
TARGET_SHARE = 0.5
PICK = "rate_pick"
STAGE = "to-target"


def halved(recipe: Recipe) -> Recipe | None:
    """`recipe` at half its batch, the learning rate scaled down by its rule and the warm-up doubled (the same
    samples); None where the batch cannot halve."""
    concrete = apply_recipe_rewrites(recipe)
    if concrete.batch_size < 2:
        return None
    warmup = concrete.warmup_steps * 2 if concrete.warmup_steps else 0
    return concrete.replace(batch_size=concrete.batch_size // 2, lr=concrete.lr / lr_factor(2, concrete.lr_scaling),
                            warmup_steps=warmup)


def target_candidates(base: Recipe, picked: Recipe, train_samples: int | None,
                      accuracy_dropped: list[Rung] = ()) -> list[Rung]:
    """The stage's rungs (module docstring); the declared to-target rungs (RungSpec.tune_target: the bigger
    batches) only where an epoch still holds four steps of their effective batch. `accuracy_dropped`: the singles
    the rate search left out for their accuracy, each added to the rate pick."""
    rungs = [Rung("baseline", {}, base)]
    if picked != base:
        rungs.append(Rung(PICK, recipe_changes(base, picked), picked))
    half = halved(picked)
    if half is not None:
        rungs.append(Rung("batch_half", recipe_changes(base, half), half))
    for spec in target_rung_specs():
        scaled = picked.replace(**spec.changes)
        concrete = apply_recipe_rewrites(scaled)
        if train_samples is None or concrete.batch_size * concrete.grad_accum_steps * 4 <= train_samples:
            rungs.append(Rung(spec.name, recipe_changes(base, scaled), scaled))
    for single in accuracy_dropped:
        with_it = picked.replace(**single.changes)
        if with_it != picked:
            rungs.append(Rung(single.name.lstrip("+"), recipe_changes(base, with_it), with_it))
    return rungs


def lost_accuracy(singles: list[Rung]) -> list[Rung]:
    """The measured singles whose metric at the planned step fell outside the baseline's band (combine.why_not)."""
    return [r for r in singles[1:] if r.status == Status.DONE and r.result.metric_worse]


def run_target_stage(search, decision: Decision, singles: list[Rung]) -> tuple[AblationResult | None, Decision]:
    """The stage (module docstring) and the decision it leads to; the stage's time budget cuts its repeats or its
    last candidates where they would not fit, counting the seeds each candidate may add (its cut note says so).
    The baseline and each candidate that changes the math are measured over TARGET_SEEDS seeds, or MIN_RUNS (the
    fewest that give an interval) where five would not fit what is left, and said; skipped, and said, where not
    even that many of the baseline's and the rate pick's runs fit (priced by the runs measured so far:
    search.run_price), so no stage starts that could only overrun."""
    repeats = min(search.options.repeats, 2)
    # each priced by its own recipe's runs so far (a run to a target: as one trained to its end until one is measured)
    base_s, pick_s = (search.run_price("full", r, target=True) for r in (search.base, decision.recipe))
    seeds = next((n for n in (TARGET_SEEDS, MIN_RUNS) if search.budget.fits_runs(1, n * base_s + repeats * pick_s)),
                 None)
    if seeds is None:
        least = MIN_RUNS * base_s + repeats * pick_s
        left, fixed = max(0.0, search.budget.left()), search.budget.ladder_fixed_s()
        search.note(f"the to-target stage was skipped: the baseline's {MIN_RUNS} seeds (~{base_s:.0f} s a run) and "
                    f"the rate pick's {repeats} runs (~{pick_s:.0f} s a run), ~{least + fixed:.0f} s with the stage's "
                    f"peak, reference workload and report, would not fit the {left:.0f} s left; the rate pick stands")
        return None, decision
    if seeds < TARGET_SEEDS:
        search.note(f"to-target: the baseline and each candidate that changes the math were measured over {seeds} "
                    f"seeds, not {TARGET_SEEDS}, to fit the budget (~{base_s:.0f} s a run): a wider seed band, wider "
                    "intervals")
    train = getattr(getattr(search.work, "split", None), "train", None)
    rungs = target_candidates(search.base, decision.recipe, len(train) if train is not None else None,
                              lost_accuracy(singles))
    with_script(rungs[1:], decision.script)       # the candidates stand on the pick: its script's flags too
    search.work.mark_effects(rungs)
    stage = search.stage(STAGE, rungs, search.options.repeats, measure="full", last=True,
                         target=search.options.target, target_seeds=seeds)
    search.cut_note(stage)
    return stage, choose(stage, decision, search.options.min_effect, search.options.memory_limit)


def times_of(rung: Rung) -> list[float]:
    return list((rung.result.to_target or {}).get("times") or [])


def choose(stage: AblationResult, decision: Decision, min_effect: float, memory_limit: int | None = None) -> Decision:
    """The stage's recommendation (module docstring), as a Decision whose speed-up is its time-to-target ratio
    against the baseline (the rate pick's own where it stands); a candidate over --memory-limit is measured and
    shown, never chosen."""
    rungs = {r.name: r for r in stage.rungs if r.status == Status.DONE and r.result.to_target
             and fits(r, memory_limit)}
    sooner = [r for r in rungs.values() if r.name != "baseline" and r.result.to_target["verdict"] == SOONER]
    pick = rungs.get(PICK) or rungs.get("baseline")
    notes = stage_lines(stage)
    if not sooner:
        decision.notes += notes + ["no candidate reached the target measurably sooner than the baseline: the rate "
                                   "pick stands"]
        return on_target(decision, pick, stage)
    best = min(sooner, key=lambda r: r.result.to_target["time_s"])
    if best is not pick and pick is not None and pick.name != "baseline":
        ratio, interval = ratio_interval(times_of(pick), times_of(best))
        if interval is None or interval[0] <= 1 or ratio < 1 + min_effect:
            decision.notes += notes + [f"{best.name} reached the target soonest, but not measurably sooner than the "
                                       f"rate pick ({ratio:.2f}x, {fmt(interval)}): the rate pick stands"]
            return on_target(decision, pick, stage)
        notes.append(f"{best.name} reached the target {ratio:.2f}x sooner than the rate pick ({fmt(interval)})")
    name = decision.name if best.name == PICK else f"{decision.name} + {best.name}"
    chosen = Decision(best.recipe, name, decision.gainers, decision.combined, decision.dropped, decision.notes + notes,
                      batch=decision.batch, script=dict(best.script))
    return on_target(chosen, best, stage)


def on_target(decision: Decision, rung: Rung | None, stage: AblationResult) -> Decision:
    """`decision` with the time-to-target ratio of `rung` (the candidate it names) as its speed-up, where it has one
    (the baseline's own is no speed-up: its rate ratio stays)."""
    summary = rung.result.to_target if rung is not None and rung.name != "baseline" else None
    if not summary:
        return decision
    target = Target.from_dict(stage.settings.get("target"))
    return replace(decision, speedup=summary["speedup"], speedup_interval=summary["interval"],
                   target=target.text() if target is not None else "the target")


def fmt(interval: list[float] | None) -> str:
    return f"{interval[0]:.2f}-{interval[1]:.2f}" if interval else "no interval"


def stage_lines(stage: AblationResult) -> list[str]:
    """One line per candidate: its time to target against the baseline's, and its factors."""
    lines = []
    for rung in stage.rungs:
        s = rung.result.to_target
        if not s:
            continue
        lines.append(f"to target: {rung.name} {s['time_s']:.1f} s ({s['speedup']:.2f}x the baseline's, "
                     f"{fmt(s['interval'])}; samples {s['samples_from']}, {s['reached']} of {s['runs']} reached; "
                     f"{s['verdict']})")
    return lines
