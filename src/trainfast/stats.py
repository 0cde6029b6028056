"""Intervals and verdicts: when is a rung faster, slower, or not measurably different?

The data of a rung is its repeats (one fresh process each, run in interleaved order with the other rungs:
repeat i of every rung runs before repeat i + 1 of any), and inside each repeat its steady steps, grouped
in consecutive blocks. A speed-up is the geometric mean over repeats of rate(rung, i) / rate(reference, i):
pairing repeat i with repeat i cancels a slow spell of a shared machine, which hits both alike.

Its interval is a paired, two-level bootstrap (percentile, 95%): draw the repeats with replacement (the
same draw for both rungs, keeping the pairs), then inside each drawn repeat draw its blocks with
replacement, and recompute the speed-up. The first level carries the process-to-process noise, the second
the step-to-step noise; blocks of consecutive steps keep their short-range correlation. The generator is
seeded, so the same measurements always give the same interval.

A verdict needs both: the interval excludes 1.0 *and* the effect is at least `min_effect` (default 5%).
Below that a difference is not called, however tight the interval: a 2% effect would flip between
"faster" and "no difference" from one run to the next, and the same command twice must agree.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

FASTER, SLOWER, SAME = "faster", "slower", "no measurable difference"
MIN_EFFECT = 0.05
CONFIDENCE = 0.95
RESAMPLES = 2000


@dataclass(frozen=True)
class Repeat:
    """One repeat's steady state as blocks of consecutive steps: (samples, seconds) per block, warm-up and
    disturbed blocks already removed (measure.Timing)."""
    blocks: tuple[tuple[float, float], ...]

    @property
    def rate(self) -> float:
        return sum(b[0] for b in self.blocks) / sum(b[1] for b in self.blocks)

    def array(self) -> np.ndarray:
        return np.array(self.blocks, dtype=float)


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def to_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high}

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


@dataclass(frozen=True)
class Comparison:
    """`rung` against `reference`: the speed-up, its interval, and the verdict."""
    rung: str
    reference: str
    speedup: Estimate
    verdict: str

    def to_dict(self) -> dict:
        return {"reference": self.reference, "speedup": self.speedup.value, "low": self.speedup.low,
                "high": self.speedup.high, "verdict": self.verdict}

    @property
    def text(self) -> str:
        s = self.speedup
        if self.verdict == SAME:
            return f"no measurable difference ({s.value:.2f}x, {s.low:.2f}-{s.high:.2f})"
        pct = 100 * (s.value - 1) if self.verdict == FASTER else 100 * (1 - s.value)
        return f"{self.verdict} by {pct:.0f}% ({s.value:.2f}x, {s.low:.2f}-{s.high:.2f})"


def _rng() -> np.random.Generator:
    """A fixed seed: the same measurements always give the same interval."""
    return np.random.default_rng(20261122)


def _resampled_rates(blocks: list[np.ndarray], picks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rates of the picked repeats with their blocks resampled: shape (resamples, repeats)."""
    out = np.empty(picks.shape)
    for j in range(picks.shape[1]):
        for r in np.unique(picks[:, j]):
            rows = np.nonzero(picks[:, j] == r)[0]
            b = blocks[r]
            draw = rng.integers(0, len(b), size=(len(rows), len(b)))
            sums = b[draw].sum(axis=1)              # (rows, 2): samples, seconds
            out[rows, j] = sums[:, 0] / sums[:, 1]
    return out


def rate_estimate(repeats: list[Repeat], confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> Estimate:
    """A rung's rate (samples/s): the mean over its repeats, with the two-level bootstrap interval."""
    rng = _rng()
    blocks = [r.array() for r in repeats]
    picks = rng.integers(0, len(repeats), size=(resamples, len(repeats)))
    rates = _resampled_rates(blocks, picks, rng).mean(axis=1)
    a = (1 - confidence) / 2
    return Estimate(float(np.mean([r.rate for r in repeats])), *map(float, np.quantile(rates, [a, 1 - a])))


def speedup_estimate(rung: list[Repeat], reference: list[Repeat], confidence: float = CONFIDENCE,
                     resamples: int = RESAMPLES) -> Estimate:
    """Geometric mean over paired repeats of rate(rung) / rate(reference), with the paired bootstrap
    interval. Repeats beyond the shorter list are unpaired and left out."""
    k = min(len(rung), len(reference))
    if k == 0:
        raise ValueError("speedup_estimate needs at least one repeat of each rung")
    rung, reference = rung[:k], reference[:k]
    rng = _rng()
    picks = rng.integers(0, k, size=(resamples, k))
    mine = _resampled_rates([r.array() for r in rung], picks, rng)
    theirs = _resampled_rates([r.array() for r in reference], picks, rng)
    ratios = np.exp(np.log(mine / theirs).mean(axis=1))
    point = math.exp(statistics.fmean(math.log(a.rate / b.rate) for a, b in zip(rung, reference)))
    a = (1 - confidence) / 2
    return Estimate(point, *map(float, np.quantile(ratios, [a, 1 - a])))


def verdict(speedup: Estimate, min_effect: float = MIN_EFFECT) -> str:
    """faster / slower only when the interval excludes 1.0 and the effect reaches `min_effect`."""
    if speedup.low > 1.0 and speedup.value >= 1 + min_effect:
        return FASTER
    if speedup.high < 1.0 and speedup.value <= 1 / (1 + min_effect):
        return SLOWER
    return SAME


def compare(name: str, rung: list[Repeat], reference_name: str, reference: list[Repeat],
            min_effect: float = MIN_EFFECT) -> Comparison:
    s = speedup_estimate(rung, reference)
    return Comparison(name, reference_name, s, verdict(s, min_effect))


@dataclass(frozen=True)
class Candidate:
    """A rung that may be recommended: its name, how many switches it turns on, and its repeats."""
    name: str
    switches: int
    repeats: list[Repeat]
    speedup: float          # point estimate against the baseline, for ranking


def recommend(candidates: list[Candidate], min_effect: float = MIN_EFFECT) -> tuple[str, list[str]]:
    """(recommended, tie). The fastest candidate by point estimate is compared with every other one; the
    ones not measurably slower than it form the tie, and the simplest of the tie (fewest switches, then
    the faster) is recommended: a switch whose gain is inside the noise is not worth turning on. The
    baseline is a candidate too, so when nothing beats it, it is the recommendation."""
    if not candidates:
        raise ValueError("recommend needs at least one candidate")
    top = max(candidates, key=lambda c: c.speedup)
    tie = [c for c in candidates
           if c is top or compare(c.name, c.repeats, top.name, top.repeats, min_effect).verdict != SLOWER]
    best = min(tie, key=lambda c: (c.switches, -c.speedup))
    return best.name, [c.name for c in sorted(tie, key=lambda c: -c.speedup)]
