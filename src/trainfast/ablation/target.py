"""Time to target: each rung judged by how soon its runs reach the user's target (target.py), in two measured
factors, time to target = samples to target / rate.

- The baseline's seed band: at each point where the baseline evaluated, the spread of its seeds' metric (their
  lowest to highest, widened by half that spread on each side: three to five seeds see less than the whole spread).
- A rung whose curve over samples (the median of its runs' at each of those points) stays inside the band is
  "same math": it needs the baseline's samples to target (the median of the baseline's seeds), and its time to
  target is its own training time to see that many samples (read off its curve), so the rate decides.
- A rung whose curve leaves the band changes what a sample is worth: its samples and its time to target are its
  own runs' (the first evaluation that reaches the target), measured over at least TARGET_SEEDS seeds where the
  budget allows (the loop adds seeds), and not reaching it is counted (an infinite time, never a dropped run).
- Every ratio against the baseline carries a bootstrap interval over seeds (the runs of each side resampled,
  2,000 times, a fixed generator: the same runs give the same interval), and the verdict on time to target
  (sooner, later, no measurable difference, did not reach) stands beside the verdict on rate.

Pure functions of the runs' records: recomputed from a results folder.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

import numpy as np

from ..results import Rung, Status
from ..stats import CONFIDENCE, MIN_EFFECT, RESAMPLES
from ..target import Target, first_reach, point_value, time_at, value_at
from ..techniques.precision import level_note
from .scoring import fits

TARGET_SEEDS = 5        # seeds a rung that changes the math is measured over, where the budget allows
MIN_RUNS = 3            # runs a side for a bootstrap interval (and so a verdict on time to target)
WIDEN = 0.5             # the seed band's margin on each side, as a share of the seeds' own spread
SOONER, LATER, SAME, MISSED = "sooner", "later", "no measurable difference", "did not reach the target"


def runs_with_curves(rung: Rung) -> list[dict[str, Any]]:
    return [r for r in rung.repeats + rung.seed_runs if r.get("curve")]


def final_value(run: dict[str, Any], name: str) -> float | None:
    """The metric at the end of a run's planned run: its evaluation at that step (a built-in baseline trains on past
    it, curves.AUTO_EXTEND), else its last one (a script's run ends where the script ends it)."""
    curve = run.get("curve") or []
    planned = run.get("curve_planned_step")
    at_end = [p for p in curve if p["step"] == planned]
    return point_value((at_end or curve[-1:] or [{}])[0], name) if curve else None


def auto_level(base: Rung, name: str) -> float | None:
    """--target auto: the baseline's level at the end of its run, the median over its seeds."""
    finals = [v for v in (final_value(r, name) for r in runs_with_curves(base)) if v is not None]
    return statistics.median(finals) if finals else None


def seed_band(base_runs: list[dict[str, Any]], name: str) -> list[tuple[float, float, float]]:
    """(samples, low, high) at each of the first baseline run's evaluations that every baseline run spans."""
    if len(base_runs) < 2:
        return []
    grid = [float(p["seen"]) for p in base_runs[0]["curve"]]
    band = []
    for seen in grid:
        values = [value_at(r["curve"], seen, name) for r in base_runs]
        if any(v is None for v in values):
            continue
        low, high = min(values), max(values)
        margin = WIDEN * (high - low)
        band.append((seen, low - margin, high + margin))
    return band


def inside_band(runs: list[dict[str, Any]], band: list[tuple[float, float, float]], name: str) -> bool | None:
    """Whether the median of `runs`' curves stays inside the band at every band point they span (at least two);
    None when fewer than two points can be compared (no verdict: treated as outside)."""
    compared = 0
    for seen, low, high in band:
        values = [v for v in (value_at(r["curve"], seen, name) for r in runs) if v is not None]
        if len(values) < max(1, len(runs) // 2 + 1):     # most of its runs have stopped before here
            continue
        compared += 1
        if not low <= statistics.median(values) <= high:
            return False
    return True if compared >= 2 else None


def reach(run: dict[str, Any], target: Target) -> tuple[float, float]:
    """(samples, training seconds) at a run's first evaluation reaching the target; (inf, inf) if none did."""
    point = first_reach(run.get("curve") or [], target)
    return (float(point["seen"]), float(point["train_s"])) if point is not None else (math.inf, math.inf)


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else math.nan


def ratio_interval(reference: Sequence[float], values: Sequence[float],
                   confidence: float = CONFIDENCE) -> tuple[float, list[float] | None]:
    """median(reference) / median(values) and its bootstrap interval over both sides' runs (None from fewer than
    MIN_RUNS on either side: two values have three possible medians, too few to spread like the runs would).
    Infinite values (runs that never reached) stay in: a side whose median is infinite gives 0 or infinity, both
    sides infinite count as 1 (neither reached)."""
    point = safe_ratio(median(reference), median(values))
    if len(reference) < MIN_RUNS or len(values) < MIN_RUNS:
        return point, None
    rng = np.random.default_rng(0)
    ref, val = np.asarray(reference, dtype=float), np.asarray(values, dtype=float)
    ratios = [safe_ratio(float(np.median(rng.choice(ref, ref.size))), float(np.median(rng.choice(val, val.size))))
              for _ in range(RESAMPLES)]
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(ratios, [tail, 100 - tail], method="inverted_cdf")   # no interpolation: inf stays inf
    return point, [float(low), float(high)]


def safe_ratio(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b):
        return 1.0
    if b == 0:
        return math.inf
    return a / b


def time_verdict(speedup: float, interval: list[float] | None, reached: int, runs: int,
                 min_effect: float = MIN_EFFECT) -> str:
    """Sooner / later than the baseline (the interval clear of 1 and the ratio past min_effect), no measurable
    difference, or did not reach the target (most of its runs did not)."""
    if runs and reached * 2 <= runs and reached < runs:
        return MISSED
    if interval is None:
        return SAME
    if interval[0] > 1 and speedup >= 1 + min_effect:
        return SOONER
    if interval[1] < 1 and speedup <= 1 - min_effect:
        return LATER
    return SAME


def to_target(rung: Rung, base: Rung, target: Target, band: list[tuple[float, float, float]],
              min_effect: float = MIN_EFFECT) -> dict[str, Any] | None:
    """The rung's time to target and its two factors, against the baseline (module docstring); None when it has
    no run with a curve yet."""
    runs, base_runs = runs_with_curves(rung), runs_with_curves(base)
    if not runs or not base_runs or not target.known:
        return None
    base_reach = [reach(r, target) for r in base_runs]
    base_samples = median([s for s, _ in base_reach])
    own = [reach(r, target) for r in runs]
    same = rung is base or bool(inside_band(runs, band, target.name))
    if same and math.isfinite(base_samples):
        # Same math: the baseline's samples, at this rung's own pace (its training time to see them).
        times = [time_at(r["curve"], base_samples) or math.inf for r in runs]
        base_times = [time_at(r["curve"], base_samples) or math.inf for r in base_runs]
        samples, samples_ratio, samples_interval = base_samples, 1.0, None
    else:
        times, base_times = [t for _, t in own], [t for _, t in base_reach]
        samples = median([s for s, _ in own])
        samples_ratio, samples_interval = ratio_interval([s for s, _ in own], [s for s, _ in base_reach])
    speedup, interval = ratio_interval(base_times, times) if rung is not base else (1.0, None)
    reached = sum(1 for s, _ in own if math.isfinite(s))
    time = median(times)
    verdict = ("reference" if rung is base
               else time_verdict(speedup, interval, reached if not same else len(runs), len(runs), min_effect))
    return {
        "time_s": time, "samples": samples,
        "rate": samples / time if math.isfinite(samples) and time and math.isfinite(time) else None,
        # rung's samples to target over the baseline's (>1: it needs more), with its interval
        "samples_ratio": samples_ratio, "samples_interval": samples_interval,
        "samples_from": "baseline" if same else "measured",
        "inside_band": same if rung is not base else None,
        "speedup": speedup, "interval": interval,            # the baseline's time over this rung's
        "verdict": verdict,
        "reached": reached, "runs": len(runs), "times": times,
        "seeds": sorted({r.get("seed") for r in runs if r.get("seed") is not None}),
    }


def score_targets(rungs: list[Rung], target: Target | None, min_effect: float = MIN_EFFECT) -> None:
    """Every measured rung's `to_target` (RungResult), the baseline's included; nothing without a known target."""
    if target is None or not target.known or not rungs:
        return
    base = rungs[0]
    band = seed_band(runs_with_curves(base), target.name)
    for rung in rungs:
        if rung.status in (Status.DONE, Status.PARTIAL):
            rung.result.to_target = to_target(rung, base, target, band, min_effect)


def pick_soonest(rungs: list[Rung], memory_limit: int | None = None) -> Rung | None:
    """With a target, the recommendation: of the rungs firmly sooner than the baseline (SOONER) that fit the memory
    limit and are not risky by construction, the soonest; the baseline when none is; None without a baseline
    judged. A rung that reaches the target sooner is recommended whatever its metric at a fixed step."""
    base = rungs[0]
    if base.status != Status.DONE or not base.result.to_target:
        return None
    sooner = [r for r in rungs[1:] if r.status == Status.DONE and (r.result.to_target or {}).get("verdict") == SOONER
              and fits(r, memory_limit) and level_note(r.recipe) is None]
    return max(sooner, key=lambda r: r.result.to_target["speedup"]) if sooner else base
