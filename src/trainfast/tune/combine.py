"""Stage 2 and the recommendation: the switches that gained put together (combine), the rungs that judge the
combination (combine_stage) and what is recommended from them (decide), or, without time for stage 2, from
the stages before it (on_level_decision)."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from ..ablation.scoring import fits, ladder_noises, recipe_changes, versus
from ..measure.memory import limit_peak
from ..recipe import Recipe
from ..report.format import fmt_bytes
from ..results import EffectLabel, Rung, Status
from ..stats import FASTER, MIN_EFFECT, SAME, Comparison, Noises
from ..techniques.precision import not_run_text
from .switches import firm_gain, is_level


@dataclass
class Decision:
    """What the search found; everything the report and tune.json say."""
    recipe: Recipe
    name: str
    gainers: list[str] = field(default_factory=list)        # singles with a firm gain that kept accuracy
    combined: list[str] = field(default_factory=list)       # the switches put together
    dropped: dict[str, str] = field(default_factory=dict)   # switch -> why it is not in the recipe
    notes: list[str] = field(default_factory=list)
    speedup: float = 1.0
    speedup_interval: list[float] | None = None
    batch: dict[str, Any] | None = None      # --batch-size-search: reported apart, not in best.yaml
    target: str | None = None                # --target: the speed-up is the time-to-target ratio, to this target
    # Where the recipe holds the script's own flags (--rung): the command line that runs it (tune/script.py)
    script: dict[str, Any] = field(default_factory=dict)

    def headline(self) -> str:
        """The speed-up in words, with its interval: against the baseline's rate, or its time to the target."""
        interval = self.speedup_interval
        within = f" (95% interval {interval[0]:.2f}–{interval[1]:.2f})" if interval else ""
        if self.target is None:
            return f"{self.speedup:.2f}x the baseline{within}"
        if interval and interval[0] > 1:
            return f"{self.speedup:.2f}x sooner than the baseline{within} to {self.target}"
        return f"{self.speedup:.2f}x the baseline's pace{within} to {self.target}, not measurably sooner"


def break_even_steps(compiled: Rung, eager: Rung) -> float:
    """Steps after which compile has repaid its compilation: the extra warm-up time (warm-up beyond what
    the same steps take once steady, compiled minus eager) over the steady time it saves per step.
    Infinite when it saves nothing."""
    def excess_and_step(rung: Rung) -> tuple[float, float]:
        excess, steps = [], []
        for run in rung.repeats:
            t = run["timing"]
            step = t["timed_seconds"] / t["timed_steps"] if t["timed_steps"] else math.inf
            excess.append(sum(t["warmup_seconds"]) - step * len(t["warmup_seconds"]))
            steps.append(step)
        return statistics.fmean(excess), statistics.fmean(steps)

    extra_c, step_c = excess_and_step(compiled)
    extra_e, step_e = excess_and_step(eager)
    saving = step_e - step_c
    return max(0.0, extra_c - extra_e) / saving if saving > 0 else math.inf


def why_not(rung: Rung) -> str | None:
    """Why a single switch does not join the combination on what it measured alone, or None: it gained."""
    r = rung.result
    if rung.status != Status.DONE:
        if rung.effect == EffectLabel.SLOW_HALF:
            return not_run_text(rung.reason)
        return {Status.NO_EFFECT: "no effect here", Status.FAILED: "failed"}.get(rung.status,
                                                                                 rung.reason or str(rung.status))
    if r.metric_worse:
        return f"lost accuracy ({r.metric_delta:+.3f}, outside the baseline's band)"
    if not firm_gain(rung):
        return f"no firm gain alone ({r.verdict_text if r.verdict_text is not None else r.verdict})"
    return None


def one_level(levels: list[Rung], singles: list[Rung], dropped: dict[str, str]) -> Rung:
    """Of the precision levels that gained, the one the combination keeps: O1 (fp32 weights, the safer
    numerics) unless another is firmly faster than it; why each other one is left out goes into `dropped`."""
    noises = ladder_noises([r for r in singles if r.status == Status.DONE])
    levels = sorted(levels, key=lambda r: r.recipe.precision_level != "autocast")
    level = levels[0]
    for r in levels[1:]:
        against = versus(r, level, MIN_EFFECT, noises)
        if against.verdict == FASTER and against.firm:
            level = r
    for r in levels:
        if r is not level:
            dropped[r.name] = (f"a precision level not firmly faster than {level.name} "
                               f"({versus(r, level, MIN_EFFECT, noises).text})")
    return level


def mib(value: float | None) -> str:
    return "not measured" if value is None else fmt_bytes(value)


def over_limit(rung: Rung, limit: int | None) -> str | None:
    """Why a measured rung cannot join the recipe under --memory-limit, or None."""
    if limit is None or rung.status != Status.DONE or fits(rung, limit):
        return None
    return f"over the memory limit ({mib(limit_peak(rung))} > {mib(limit)})"


def combine(base: Recipe, singles: list[Rung], planned_steps: int | None,
            memory_limit: int | None = None) -> tuple[Recipe, list[str], dict[str, str]]:
    """The combination of the singles that gained: one precision level (O1, or another one firmly faster than
    it), every other gaining switch; compile only when `planned_steps` reaches its break-even. Returns the recipe, the
    switch names in it and why each other single is not."""
    baseline = singles[0]
    dropped: dict[str, str] = {}
    chosen: list[Rung] = []
    for rung in singles[1:]:
        reason = why_not(rung) or over_limit(rung, memory_limit)
        if reason is None:
            chosen.append(rung)
        else:
            dropped[rung.name] = reason
    levels = [r for r in chosen if is_level(r)]
    if len(levels) > 1:
        level = one_level(levels, singles, dropped)
        chosen = [r for r in chosen if r not in levels or r is level]
    compiled = next((r for r in chosen if r.changes.get("compile")), None)
    if compiled is not None:
        steps = break_even_steps(compiled, baseline)
        if planned_steps is not None and planned_steps < steps:
            dropped[compiled.name] = (f"compile repays its compilation after ~{steps:.0f} steps; the planned run "
                                      f"has {planned_steps}")
            chosen.remove(compiled)
    recipe = base
    for rung in chosen:
        recipe = recipe.replace(**rung.changes)
    return recipe, [r.name for r in chosen], dropped


def tied_best(gainers: list[Rung], singles: list[Rung], min_effect: float) -> Rung:
    """The single switch that gained most (the singles' speed-ups: all against the fp32 baseline); of the ones not
    measurably different from it, one whose judged metric stayed inside the baseline's band first, then the one
    whose metric moved least: packing, which keeps a language model's loss to the digit, over length grouping at
    the same speed, which moved it (by +0.018 inside the band, or past it)."""
    fastest = max(gainers, key=lambda r: r.result.speedup)
    noises = ladder_noises([r for r in singles if r.status == Status.DONE])     # the stage's own noise
    tied = [r for r in gainers if r is fastest or versus(r, fastest, min_effect, noises).verdict == SAME]
    return max(tied, key=lambda r: (not r.result.metric_flag, -abs(r.result.metric_delta or 0.0),
                                    r.result.speedup))


def combine_stage(base: Recipe, singles: list[Rung], combined: Recipe, names: list[str],
                  changes: dict[str, dict] | None = None, min_effect: float = MIN_EFFECT) -> list[Rung]:
    """Stage 2's rungs: the baseline, the best single switch (alone against fp32: the simplest recipe to
    beat; tied_best), the combination, and the combination without each of its switches in turn (two switches or
    more). `changes`: each switch's fields, where they come from another stage than `singles`."""
    gained = [r for r in singles[1:] if r.name in names] or [r for r in singles[1:] if firm_gain(r)]
    best = tied_best(gained, singles, min_effect)
    rungs = [Rung("baseline", {}, base), Rung(f"single-{best.name}", dict(best.changes), best.recipe),
             Rung("combined", recipe_changes(base, combined), combined)]
    if len(names) > 1:
        fields = changes or {r.name: r.changes for r in singles}
        for name in names:
            without = base
            for other in names:
                if other != name:
                    without = without.replace(**fields[other])
            rungs.append(Rung(f"without-{name}", recipe_changes(base, without), without))
    return rungs


def on_level_decision(level: Rung, best: Rung, fallback: Decision) -> Decision:
    """The precision level plus the switch that gained most on top of it (stage 1b measured exactly that
    recipe). Its speed-up over the fp32 baseline is the product of the two measured ones, level over baseline
    and switch over level, from two stages; the interval multiplies their bounds (wider than a joint one)."""
    speedup = level.result.speedup * best.result.speedup
    a, b = level.result.speedup_interval, best.result.speedup_interval
    return Decision(best.recipe, f"{level.name} + {best.name}", gainers=fallback.gainers,
                    combined=[level.name, best.name], dropped=fallback.dropped, notes=fallback.notes,
                    speedup=speedup, speedup_interval=[a[0] * b[0], a[1] * b[1]] if a and b else None,
                    script=dict(best.script))


def firmly_faster(a: Rung, b: Rung, min_effect: float, noises: Noises) -> tuple[bool, Comparison | None]:
    """Whether `a` is firmly faster than `b` (both fully measured), and the comparison (None: not both were)."""
    if a.status != Status.DONE or b.status != Status.DONE:
        return False, None
    against = versus(a, b, min_effect, noises)
    return against.verdict == FASTER and against.firm, against


def decide(stage: list[Rung], min_effect: float = MIN_EFFECT) -> Decision:
    """The recommendation from stage 2 (rungs as combine_stage made them, scored)."""
    base, single, combined = stage[0], stage[1], stage[2]
    without = stage[3:]
    noises = ladder_noises([r for r in stage if r.status in (Status.DONE, Status.PARTIAL)])
    decision = Decision(base.recipe, "baseline")
    final = combined
    for rung in without:                 # a switch whose removal makes the combination faster hurts in it
        better, against = firmly_faster(rung, final, min_effect, noises)
        if better:
            name = rung.name.removeprefix("without-")
            decision.dropped[name] = f"hurts in combination: the combination without it is {against.text}"
            final = rung
    if final.status == Status.DONE and final.result.metric_worse:
        decision.dropped[final.name] = (f"loses accuracy ({final.result.metric_delta:+.3f}, outside the "
                                        "baseline's band)")
        final = None
    if final is not None:
        beats, against = firmly_faster(final, single, min_effect, noises)
        if beats:
            decision.recipe, decision.name = final.recipe, final.name
        elif against is not None:
            # A gain a rerun would not repeat at least FIRM of the time is within the noise (the `?` verdicts).
            text = against.text if against.firm else (f"{against.text}, which a rerun would repeat only "
                                                       f"{against.agreement:.0%} of the time")
            decision.notes.append(f"the combination ({final.name}) is not firmly faster than the best single switch "
                                  f"{single.name.removeprefix('single-')}: {text}; the simpler recipe is "
                                  "recommended (more --repeats, or a larger --budget, can settle it)")
    if decision.name == "baseline" and firm_gain(single):
        decision.recipe, decision.name = single.recipe, single.name
    chosen = next(r for r in stage if r.name == decision.name)
    decision.script = dict(chosen.script)          # the script's own flags it holds, if any
    decision.speedup = chosen.result.speedup if chosen.result.speedup is not None else 1.0
    decision.speedup_interval = chosen.result.speedup_interval
    return decision
