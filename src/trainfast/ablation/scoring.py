"""Scoring: a ladder's runs -> each rung's numbers, its verdicts and the recommendation. Pure functions of
the runs' records (no process, no file, no clock), so a verdict can be recomputed from a results folder.

Every interval here rests on a noise estimate pooled over the measured rungs (ladder_noises): the noise between
fresh processes, and that of the in-process ratios where the rungs were timed against the baseline inside their own
processes (paired.py). Two paired rungs are compared on their ratios, any other pair on their own runs
(stats.Noises); the scores and the recommendation use the same rule.
"""
from __future__ import annotations

import math
import statistics
from typing import Any

from ..measure.memory import limit_peak
from ..measure.ranks import combine_runs
from ..recipe import Recipe
from ..results import Rung, RungResult, Status
from ..stats import (MIN_EFFECT, SAME, Candidate, Comparison, Noise, Noises, Repeat, compare_candidates, split_noise,
                     rate_estimate, recommend, recommendation_odds)
from ..techniques.precision import level_note
from .metric import SCRIPT_CHOICE, TASK_METRIC, choose_metric, metric_goal, task_metric_value


def metric_band(reference: float, n: int | None, seed_values: list[float] | None = None,
                runs: int = 1) -> float | None:
    """Half-width of the band within which a rung's judged metric is indistinguishable from the baseline's
    `reference` (with n held-out samples: an accuracy, or an mAP taken as a proportion of that size).

    Two noise sources: evaluation sampling (n held-out samples: two binomial standard errors of a
    difference, sqrt(2) x one run's) and training itself (another seed, or the numerics of a technique,
    sends SGD down another path: two standard deviations of the baseline over its k seeds, scaled by
    sqrt(1/runs + 1/k) for comparing the mean of a rung's `runs` repeats against the mean of k). The band
    is the larger of the two. A script's own metric (n None: not a proportion of held-out samples that we
    know of) has the training-noise part only, and no band at all (None) from fewer than two seeds."""
    if not n and len(seed_values or []) < 2:
        return None
    band = 0.0
    if n:
        p = min(max(reference, 1.0 / n), 1 - 1.0 / n)
        band = 2 * math.sqrt(2 * p * (1 - p) / n)
    if seed_values and len(seed_values) >= 2:
        k = len(seed_values)
        band = max(band, 2 * statistics.stdev(seed_values) * math.sqrt(1 / max(1, runs) + 1 / k))
    return band


def rung_repeats(rung: Rung) -> list[Repeat]:
    """The rung's timed steps, one Repeat per finished process (samples x world size: the job's rate)."""
    out = []
    for r in rung.repeats:
        kept = [b for b in r["timing"]["blocks"] if not b["disturbed"]] or r["timing"]["blocks"]   # as Timing does
        blocks = tuple((b["samples"] * r["world_size"], b["seconds"]) for b in kept)
        if blocks:
            out.append(Repeat(blocks))
    return out


def paired_repeats(rung: Rung) -> list[Repeat] | None:
    """The rung's in-process ratios against the baseline, one Repeat per finished process (its clean blocks, their
    seconds scaled by the reference's rate in that process: the Repeat's rate is the ratio), or None unless every
    run of the rung was paired."""
    out = []
    for r in rung.repeats:
        pair = r.get("paired") or {}
        if "ratio" not in pair:
            return None
        blocks = pair["blocks"]["rung"]
        kept = [b for b in blocks if not b["disturbed"]] or blocks
        out.append(Repeat(tuple((b["samples"], b["seconds"] * pair["reference_rate"]) for b in kept)))
    return out or None


def candidate(rung: Rung, switches: float = 0.0) -> Candidate:
    return Candidate(rung.name, switches, rung_repeats(rung), paired_repeats(rung))


def ladder_noises(rungs: list[Rung]) -> Noises:
    """The noise pools behind every interval of this ablation (stats.Noises): between processes over the measured
    rungs' own runs, and of the in-process ratios over the rungs that have them; a rung whose repeats disagree far
    more than the others' is judged on its own spread and kept out of the pool (stats.split_noise)."""
    measured = [r for r in rungs if r.measured]
    process, wide = split_noise({r.name: rung_repeats(r) for r in measured})
    ratios = {r.name: p for r in measured if (p := paired_repeats(r)) is not None}
    paired, paired_wide = split_noise(ratios)
    return Noises(process, paired, wide, paired_wide)


def versus(a: Rung, b: Rung, min_effect: float, noises: Noises) -> Comparison:
    """`a` against `b`: on their in-process ratios when both have them, else on their own runs."""
    return compare_candidates(candidate(a), candidate(b), min_effect, noises)


def aggregate(rung: Rung, noise: Noise | None, metric: str | None = "accuracy") -> None:
    """The rung's numbers over its repeats: means for the metric and times, the worst peak memory, and the
    rate with its interval. A user's script has no epoch time, held-out samples or training loss of ours:
    those are None for it."""
    reps = rung.repeats
    if not reps:
        return
    first = reps[0]
    timed = rung_repeats(rung)
    rate = rate_estimate(timed, noise) if timed else None
    values = [run_metric(r, metric) for r in reps]
    known = None not in values

    def mean(key: str) -> float | None:
        vals = [r.get(key) for r in reps]
        return statistics.fmean(vals) if None not in vals else None

    rung.result = RungResult(
        **{k: first.get(k) for k in ("val_samples", "world_size", "num_workers", "precision_state", "train_losses",
                                     "rate_unit", "unit", "session", "compile", "overridden")},
        observed=first.get("observed"),
        repeats=len(reps),
        throughput=rate.value if rate else 0.0,
        throughput_interval=rate.interval if rate else None,
        throughput_spread=rate.half_width if rate else None,
        documents_per_s=mean("documents_per_s"),
        metric=statistics.fmean(values) if known else None,
        metric_values=values if known else [],
        loss=mean("loss"),
        train_loss=mean("train_loss"),
        epoch_time_s=mean("epoch_time_s"),
        wall_s=statistics.fmean(r["wall_time_s"] for r in reps) if all(r.get("wall_time_s") for r in reps) else None,
        peak_memory_bytes=max(r["peak_memory_bytes"] for r in reps),
        data_wait_fraction=mean("data_wait_fraction"),
        copy_fraction=mean("copy_fraction"),
        ranks=combine_runs([r.get("ranks") for r in reps]),
        step_alone=step_alone_rate(reps),
        skipped_files=max(r.get("skipped_files") or 0 for r in reps),      # each run reads the same files
        host_decoded_files=max(r.get("host_decoded_files") or 0 for r in reps),
        host_decoded_named=first.get("host_decoded_named") or [],
        steps=first.get("steps", first.get("steps_run")),
        warmup_steps=[r["timing"]["warmup_steps"] for r in reps],
        disturbed_steps=[r["timing"].get("disturbed_steps", 0) for r in reps],
        timed_steps=[r["timing"]["timed_steps"] for r in reps],
        timed_seconds=[r["timing"]["timed_seconds"] for r in reps],
        wall_time_s=[r.get("wall_time_s") for r in reps],
    )


def step_alone_rate(reps: list[dict[str, Any]]) -> float | None:
    """The step alone's rate over the repeats (their mean), where every repeat timed it."""
    rates = [(r.get("step_alone") or {}).get("throughput") for r in reps]
    return statistics.fmean(rates) if rates and None not in rates and all(rates) else None


def score_rungs(rungs: list[Rung], ceilings: dict[str, float], seed_values: list[float] | None = None,
                flops_per_sample: float | None = None, mode: str = "cumulative",
                min_effect: float = MIN_EFFECT, metric: tuple[str | None, str | None] = ("accuracy", "max")) -> None:
    """Speed-up with its interval and verdict against the baseline (and, cumulative, against the rung
    before: what adding this switch bought), memory ratio, ceiling fraction and the judged metric's flags. The
    metric (the task's, or a script's reported one) is judged against the baseline's mean over its seeds: `metric_flag`
    marks a rung outside the band, `metric_worse` one outside it on the wrong side (below for a metric to maximize)."""
    name, goal = metric
    sign = -1.0 if (goal or metric_goal(name)) == "min" else 1.0
    noises = ladder_noises(rungs)
    for rung in rungs:
        aggregate(rung, noises.own(rung.name), name)
    base = rungs[0] if rungs and rungs[0].status == Status.DONE and rungs[0].result.repeats else None
    reference, seeds = None, []
    if base:
        seeds = [a for a in (seed_values or base.result.metric_values) if a is not None]
        reference = statistics.fmean(seeds) if seeds and base.result.metric is not None else None
    previous = base
    for rung in rungs:
        r = rung.result
        if rung.status != Status.DONE or not r.repeats:
            continue
        ceiling = ceilings.get(rung.recipe.precision)
        r.flops_per_sample = flops_per_sample
        r.flops_per_s = flops_per_sample * r.throughput if flops_per_sample else None
        r.ceiling_flops_per_s = ceiling
        r.ceiling_fraction = r.flops_per_s / ceiling if ceiling and r.flops_per_s else None
        if r.step_alone:
            r.epoch_of_step = r.throughput / r.step_alone
            if base and base.result.step_alone:
                r.step_alone_speedup = r.step_alone / base.result.step_alone
        if base and rung is not base:
            judge_against(rung, base, previous if mode == "cumulative" else None, min_effect, noises)
            if reference is not None and r.metric is not None:
                r.metric_delta = r.metric - reference
                r.metric_band = metric_band(reference, base.result.val_samples, seeds, runs=r.repeats)
                # A metric that is no number (a loss gone NaN: fp16 without a scaler, a diverged learning rate)
                # is outside any band and worse, whatever its goal: abs(nan) > band would say it is inside.
                lost = not math.isfinite(r.metric)
                r.metric_flag = lost or (r.metric_band is not None and abs(r.metric_delta) > r.metric_band)
                r.metric_worse = lost or (r.metric_flag and sign * r.metric_delta < 0)
        elif rung is base:
            r.speedup, r.speedup_interval, r.verdict = 1.0, [1.0, 1.0], "reference"
            if reference is not None:
                r.metric_reference = reference
                r.metric_band = metric_band(reference, r.val_samples, seeds, runs=r.repeats)
        paired, noise = noises.basis(paired_repeats(rung) is not None, base is not None and
                                     paired_repeats(base) is not None)
        r.noise = noise_summary(noises.own(rung.name, paired) if noise is not None else None, r.repeats,
                                min_effect, paired, noises.own(rung.name))
        if r.noise is not None and rung.name in (noises.paired_wide if paired else noises.wide):
            r.noise["own"] = True          # its repeats disagreed far more than the others': judged on their spread
        previous = rung


def judge_against(rung: Rung, base: Rung, previous: Rung | None, min_effect: float, noises: Noises) -> None:
    """The rung's speed-up and verdict against the baseline, and against `previous` (the rung above, in a
    cumulative ladder): what adding its switch bought. Its memory against the baseline's."""
    r = rung.result
    if rung_repeats(rung) and rung_repeats(base):
        against = versus(rung, base, min_effect, noises)
        r.speedup, r.speedup_interval = against.speedup.value, against.speedup.interval
        r.verdict, r.verdict_text = against.verdict, against.text
        r.agreement, r.firm = against.agreement, against.firm
        if previous is not None and rung_repeats(previous):
            step = versus(rung, previous, min_effect, noises)
            r.vs_previous = {"rung": previous.name, **step.to_dict(), "text": step.text}
    r.memory_ratio = r.peak_memory_bytes / base.result.peak_memory_bytes


def noise_summary(noise: Noise | None, pairs: int, min_effect: float, paired: bool = False,
                  process: Noise | None = None) -> dict[str, Any] | None:
    """The noise behind a rung's intervals, and what it means for repeatability: the smallest speed-up its
    comparisons detect in 80% of runs, and the repeats that would detect `min_effect` (or 10%, if larger).
    `paired`: the noise is the in-process ratios' (then `process`, the noise between processes, is given too)."""
    if noise is None or pairs < 1:
        return None
    target = max(min_effect, 0.10)
    return {"sigma_log": math.sqrt(noise.variance), "df": noise.df, "paired": paired,
            "process_sigma_log": math.sqrt(process.variance) if process is not None else None,
            "detectable_effect": noise.detectable(pairs, min_effect),
            "repeats_for": {f"{target:.2f}": noise.repeats_for(target, min_effect)}}


def fits(rung: Rung, memory_limit: int | None) -> bool:
    """Whether a rung's peak (measure.memory.limit_peak) is within `memory_limit` bytes (None: no limit). A rung
    whose peak was not measured does not fit a limit: it is never recommended on an unknown."""
    if memory_limit is None:
        return True
    peak = limit_peak(rung)
    return peak is not None and peak <= memory_limit


def pick_best(rungs: list[Rung], min_effect: float = MIN_EFFECT,
              memory_limit: int | None = None) -> tuple[Rung | None, list[str], dict[str, float]]:
    """The recommendation, its tie (stats.recommend) and how often a rerun would recommend each rung
    (stats.recommendation_odds). Candidates: the baseline and the measured rungs whose accuracy is not below the
    baseline's noise band and that are not risky by construction (O3 `pure` levels: one short run inside the
    band does not show that updates below half precision's spacing were not lost; they are measured and shown,
    never recommended). A rung is recommended over a simpler one only when it is measurably faster; the
    baseline if nothing is. None when the baseline has no finished run: nothing can be judged against it."""
    base = rungs[0]
    if base.status != Status.DONE or not rung_repeats(base):
        return None, [], {}
    candidates = [base] + [r for r in rungs[1:] if r.status == Status.DONE and rung_repeats(r)
                           and level_note(r.recipe) is None and not r.result.metric_worse]
    if not fits(base, memory_limit):
        # The baseline does not fit: of the rungs that do, the fastest (none fits: nothing can be recommended).
        fitting = [r for r in candidates[1:] if fits(r, memory_limit)]
        if not fitting:
            return None, [], {}
        return max(fitting, key=lambda r: r.result.speedup or 0.0), [], {}
    candidates = [r for r in candidates if fits(r, memory_limit)]
    # a rung of the script's own flags counts its flags and variables (Rung.script) as switches
    pool = [candidate(r, switch_count(base.recipe, r.recipe) + r.script.get("switches", 0)) for r in candidates]
    noises = ladder_noises(rungs)
    name, tie = recommend(pool, min_effect, noises)
    return next(r for r in rungs if r.name == name), tie, recommendation_odds(pool, min_effect, noises)


def recipe_changes(base: Recipe, recipe: Recipe) -> dict[str, Any]:
    """The fields of `recipe` that differ from `base`'s, with their values."""
    a, b = base.to_dict(), recipe.to_dict()
    return {k: b[k] for k in b if a[k] != b[k]}


def switch_count(base: Recipe, recipe: Recipe) -> float:
    """How far a rung's recipe is from the baseline's, for the tie-break towards the simplest: one per changed
    Recipe field, and a batch size counted by its doublings (batch 256 from 64 is a larger change to the
    optimization than 128, so of two sizes within the noise of each other the smaller is recommended)."""
    changed = recipe_changes(base, recipe).keys() - {"seed", "batch_size"}
    if recipe.batch_size == base.batch_size:
        return len(changed)
    return len(changed) + abs(math.log2(recipe.batch_size / base.batch_size))


def unresolved(rung: Rung, min_effect: float = MIN_EFFECT) -> bool:
    """A difference this run estimated at min_effect or more (against the baseline or the rung above) that it
    called "no measurable difference": a real gain of that size too small for this run's noise. A quieter
    run of the same command resolves it and calls it faster, so with time left settling spends it here too
    (a noisy run otherwise stops early on firm-looking "no difference" calls a quiet run contradicts)."""
    r = rung.result
    line = math.log1p(min_effect)
    comparisons = [{"verdict": r.verdict, "speedup": r.speedup}, r.vs_previous]
    return any(v and v.get("verdict") == SAME and v.get("speedup") and abs(math.log(v["speedup"])) >= line
               for v in comparisons)


# The run-to-run noise assumed while a ladder has measured none of its own (after its first pass: one run a rung): what
# fresh processes show on a CPU (5-12% on 2 cores); a quieter machine settles its verdicts sooner than this foresees.
PRIOR_NOISE = 0.08


def likely_unsettled(rungs: list[Rung], repeats: int, min_effect: float = MIN_EFFECT, cumulative: bool = False) -> bool:
    """Whether settling is likely to add passes after `repeats` (the time left counts them): a rung whose verdict
    is within the noise or unresolved (what settling itself asks: loop.py), or, before any rung has two runs, a
    difference so far (a rung against the baseline and, in a cumulative ladder, against the rung above it) closer to
    min_effect than `repeats` runs at PRIOR_NOISE can resolve (two standard errors of a ratio of two means)."""
    measured = [r for r in rungs[1:] if r.measured]
    if any(len(r.repeats) >= 2 for r in measured):
        return any(r.result.unsettled or unresolved(r, min_effect) for r in measured)
    line = math.log1p(min_effect) + 2 * PRIOR_NOISE * math.sqrt(2 / max(1, repeats))
    speedups = [r.result.speedup for r in measured]
    ratios = speedups + ([b / a for a, b in zip([1.0, *speedups], speedups) if a and b] if cumulative else [])
    return any(not s or abs(math.log(s)) < line for s in ratios)


def seed_summary(result: dict[str, Any], metric: str | None) -> dict[str, Any]:
    """One baseline run as a noise seed: its seed, loss, rate and judged metric's value (`metric`)."""
    return {**{k: result.get(k) for k in ("seed", "loss", "throughput")}, "metric": run_metric(result, metric)}


def run_metric(result: dict[str, Any], metric: str | None) -> float | None:
    """The number a run is judged on: the built-in run's task metric (TASK_METRIC: accuracy, mAP, a language
    model's validation loss), or what a user's script reported under `metric` (SCRIPT_CHOICE: the script's own
    choice in this run, metric.py); None for no metric (speed mode: its runs stop at different points, so what
    they reported is not comparable)."""
    reported = result.get("reported") or {}
    if metric is None:
        return None
    if metric == TASK_METRIC:
        value = task_metric_value(result)
    else:
        if metric == SCRIPT_CHOICE:
            metric = choose_metric(None, None, result).name
        value = reported.get(metric, result.get(metric)) if metric is not None else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
