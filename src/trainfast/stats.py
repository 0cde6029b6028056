"""Intervals and verdicts: when is a rung faster, slower, or not measurably different?

The data of a rung is its repeats: one fresh process each, run in passes (every rung once, then every rung
again), so repeat i of every rung ran close in time. A speed-up is the geometric mean over passes of
rate(rung, i) / rate(reference, i): pairing within a pass cancels a slow spell of a shared machine.

Its interval is a paired t-interval on the log scale, with the process-to-process noise *pooled over every
rung of the ablation*: log rate = rung effect + pass effect + noise (a two-way additive model), the noise
variance estimated from the residuals with (rungs - 1) x (passes - 1) degrees of freedom. With 2 repeats a
rung alone would give one degree of freedom (t = 12.7: useless) or, bootstrapped, an interval too narrow
by half; the seven rungs of a ladder together give six, and the interval is honest about the spread between
processes, which on a shared VM is far larger than the spread between steps of one process. With a single
repeat there is no such noise estimate: then the interval is a block bootstrap over the steady steps of the
one process (seeded: the same measurements always give the same interval), and is narrower than the truth;
with fewer than MIN_BLOCKS blocks in a process there is no interval at all, and no verdict but "no
measurable difference".

A verdict must be one the same command, run again, would repeat. With the pooled noise a difference is
called faster or slower only when its log speed-up clears `Noise.call_threshold`: the interval must exclude
1.0 (t x its standard error), the effect must reach `min_effect` (default 5%: a 2% effect would flip from
run to run however tight its interval), and on top of that the estimate must sit far enough past that line
that a rerun, whose estimate scatters around this one with twice its variance, lands past it too at least
FIRM (80%) of the time. Without that margin a 95% interval per comparison is not enough: an ablation makes
about a dozen comparisons (every rung against the baseline and against the rung before it), so with no true
difference anywhere about one run in three would still call one of them (tests/test_verdicts.py). With it
(10 df, the default ladder), a null difference is called in about 1 comparison in 150, a spurious call
somewhere in a ladder in at most 1 run in 16. The price is power, and the report says it: the smallest
difference found in 80% of runs, and the repeats that would find a smaller one.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from .defaults import MIN_EFFECT  # the smallest speed difference called a gain or a loss (--min-effect)

FASTER, SLOWER, SAME = "faster", "slower", "no measurable difference"
CONFIDENCE = 0.95
RESAMPLES = 2000
POWER = 0.8             # "detectable": found in 80% of runs (Noise.detectable)
FIRM = 0.8              # a verdict a rerun repeats at least this often is firm; below, the report marks it
MIN_BLOCKS = 4          # a bootstrap over fewer blocks than this has no spread to speak of: no interval at all
UNKNOWN = (0.0, math.inf)


@functools.cache
def scipy_stats():
    """scipy.stats, imported where a verdict is first computed: about a second and a half of imports on 2 cores,
    which the processes that only record steps (a rung's, a measured script's, the doctor's script) never pay."""
    from scipy import stats

    return stats


@functools.cache
def _z_firm() -> float:
    return float(scipy_stats().norm.ppf(FIRM))


@functools.lru_cache(maxsize=256)
def _t_quantile(q: float, df: int) -> float:
    """Student's t quantile, cached: recommendation_odds asks for the same few thousands of times."""
    return float(scipy_stats().t.ppf(q, df))


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

    @property
    def known(self) -> bool:
        return math.isfinite(self.high)

    @property
    def half_width(self) -> float | None:
        return (self.high - self.low) / 2 if self.known else None

    @property
    def interval(self) -> list[float] | None:
        """[low, high], or None when there is no interval (JSON has no infinity)."""
        return [self.low, self.high] if self.known else None


@dataclass(frozen=True)
class Noise:
    """Process-to-process noise of log rates, pooled over the rungs of one ablation."""
    variance: float
    df: int

    def t(self, confidence: float = CONFIDENCE) -> float:
        return _t_quantile(0.5 + confidence / 2, self.df)

    def standard_error(self, pairs: int) -> float:
        """Of a log speed-up over `pairs` paired repeats: the difference of two rungs' noises."""
        return math.sqrt(2 * self.variance / pairs)

    def call_threshold(self, pairs: int, min_effect: float = MIN_EFFECT, confidence: float = CONFIDENCE) -> float:
        """The |log speed-up| a difference must reach to be called: past the interval's edge (t x se) and
        min_effect, plus the margin that makes a rerun call it too FIRM of the time (z_FIRM x the spread of a
        rerun's estimate around this one, sqrt(2) se)."""
        se = self.standard_error(pairs)
        margin = _z_firm() * math.sqrt(2) * se
        return max(self.t(confidence) * se, math.log1p(min_effect)) + margin

    def detectable(self, pairs: int, min_effect: float = MIN_EFFECT, power: float = POWER) -> float:
        """The smallest speed-up (as a fraction, 0.2 = 20%) that a paired comparison over `pairs` repeats calls
        with probability `power`: the call threshold plus t_power standard errors. A true difference smaller
        than this is called in few runs; the verdict it gets is "no measurable difference"."""
        t_power = float(scipy_stats().t.ppf(power, self.df))
        return math.exp(self.call_threshold(pairs, min_effect) + t_power * self.standard_error(pairs)) - 1

    def repeats_for(self, effect: float, min_effect: float = MIN_EFFECT, power: float = POWER,
                    most: int = 1000) -> int:
        """Repeats per rung for `effect` (a fraction) to be detectable at this noise and df (at most `most`)."""
        return next((n for n in range(2, most) if self.detectable(n, min_effect, power) <= effect), most)


def pooled_noise(table: list[list[Repeat]]) -> Noise | None:
    """`table[k]`: rung k's repeats in pass order. The residual variance of the two-way additive model
    (rung + pass) on log rates, over the rungs that have every pass; None with fewer than 2 such rungs or
    fewer than 2 passes (no degrees of freedom)."""
    passes = max((len(row) for row in table), default=0)
    rows = [row for row in table if len(row) == passes]
    if passes < 2 or len(rows) < 2:
        return None
    y = np.log([[r.rate for r in row] for row in rows])
    residual = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    df = (len(rows) - 1) * (passes - 1)
    return Noise(float((residual ** 2).sum() / df), df)


WIDE_P = 0.01           # a rung's spread this unlikely under the others' noise (Bonferroni over the rungs) is its own


def split_noise(table: dict[str, list[Repeat]]) -> tuple[Noise | None, dict[str, Noise]]:
    """The pooled noise over the rungs whose repeats scatter alike, and the rungs whose repeats disagree far more
    than the others' (heteroscedastic noise: a rung whose timed window depends on which batches it held, a rung
    that is the only one to stall), each with its own noise. Pooling such a rung would widen every other rung's
    interval by its spread: one rung's 20% would turn the others' firm 3% verdicts into "within the noise".

    One rung at a time, the one least likely under the others: its own residuals around its mean and the others'
    pass effects (passes - 1 df) against the others' two-way residual variance, an F test at WIDE_P divided by the
    rungs tested; the pool is refitted without it and the test repeated, while at least two rungs remain to pool.
    A rung set apart gets Noise(its variance, passes - 1)."""
    passes = max((len(row) for row in table.values()), default=0)
    rows = {name: row for name, row in table.items() if len(row) == passes}
    wide: dict[str, Noise] = {}
    while passes >= 2 and len(rows) >= 3:
        y = {name: np.log([r.rate for r in row]) for name, row in rows.items()}
        worst, worst_p, worst_noise = None, 1.0, None
        for name in rows:
            others = np.array([v for k, v in y.items() if k != name])
            pool = pooled_noise([row for k, row in rows.items() if k != name])
            if pool is None or pool.variance <= 0:
                continue
            effects = others.mean(axis=0) - others.mean()
            own = y[name] - y[name].mean() - effects
            variance = float((own ** 2).sum() / (passes - 1))
            p = float(scipy_stats().f.sf(variance / pool.variance, passes - 1, pool.df))
            if p < worst_p:
                worst, worst_p, worst_noise = name, p, Noise(variance, passes - 1)
        if worst is None or worst_p >= WIDE_P / len(rows):
            break
        wide[worst] = worst_noise
        del rows[worst]
    return pooled_noise(list(rows.values())), wide


def combined(a: Noise, b: Noise) -> Noise:
    """The noise of a comparison between two rungs with noises `a` and `b`: Noise.standard_error takes twice its
    variance, so the mean of the two, with Welch-Satterthwaite's degrees of freedom."""
    if a == b:
        return a
    total = a.variance + b.variance
    parts = a.variance ** 2 / a.df + b.variance ** 2 / b.df
    return Noise(total / 2, max(1, int(total ** 2 / parts)) if parts > 0 else min(a.df, b.df))


@dataclass(frozen=True)
class Comparison:
    """`rung` against `reference`: the speed-up, its interval, and the verdict."""
    rung: str
    reference: str
    speedup: Estimate
    verdict: str
    agreement: float | None = None      # the chance a rerun gives the same verdict (rerun_agreement)

    @property
    def firm(self) -> bool:
        """A verdict a rerun of the same command repeats at least FIRM of the time."""
        return self.agreement is None or self.agreement >= FIRM

    def to_dict(self) -> dict:
        s = self.speedup
        return {"reference": self.reference, "speedup": s.value, "low": s.low if s.known else None,
                "high": s.high if s.known else None, "verdict": self.verdict, "agreement": self.agreement,
                "firm": self.firm}

    @property
    def text(self) -> str:
        s = self.speedup
        if not s.known:
            return f"no measurable difference ({s.value:.2f}x; no interval: too few timed blocks in one repeat)"
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


def rate_estimate(repeats: list[Repeat], noise: Noise | None = None, confidence: float = CONFIDENCE,
                  resamples: int = RESAMPLES) -> Estimate:
    """A rung's rate (samples/s): the mean over its repeats, with a t-interval from the pooled noise (on the
    log scale), or the two-level bootstrap interval without one."""
    if noise is not None:
        value = float(np.mean([r.rate for r in repeats]))
        half = noise.t(confidence) * math.sqrt(noise.variance / len(repeats))
        return Estimate(value, value * math.exp(-half), value * math.exp(half))
    if any(len(r.blocks) < MIN_BLOCKS for r in repeats):
        return Estimate(float(np.mean([r.rate for r in repeats])), *UNKNOWN)
    rng = _rng()
    blocks = [r.array() for r in repeats]
    picks = rng.integers(0, len(repeats), size=(resamples, len(repeats)))
    rates = _resampled_rates(blocks, picks, rng).mean(axis=1)
    a = (1 - confidence) / 2
    return Estimate(float(np.mean([r.rate for r in repeats])), *map(float, np.quantile(rates, [a, 1 - a])))


def speedup_estimate(rung: list[Repeat], reference: list[Repeat], noise: Noise | None = None,
                     confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> Estimate:
    """Geometric mean over paired repeats of rate(rung) / rate(reference), with the paired t-interval from
    the pooled noise (the difference of two rungs' noises: variance 2 sigma^2 / pairs), or the paired
    bootstrap interval without one. Repeats beyond the shorter list are unpaired and left out."""
    k = min(len(rung), len(reference))
    if k == 0:
        raise ValueError("speedup_estimate needs at least one repeat of each rung")
    rung, reference = rung[:k], reference[:k]
    log_ratio = statistics.fmean(math.log(a.rate / b.rate) for a, b in zip(rung, reference))
    if noise is not None:
        half = noise.t(confidence) * math.sqrt(2 * noise.variance / k)
        return Estimate(math.exp(log_ratio), math.exp(log_ratio - half), math.exp(log_ratio + half))
    if any(len(r.blocks) < MIN_BLOCKS for r in rung + reference):
        return Estimate(math.exp(log_ratio), *UNKNOWN)
    rng = _rng()
    picks = rng.integers(0, k, size=(resamples, k))
    mine = _resampled_rates([r.array() for r in rung], picks, rng)
    theirs = _resampled_rates([r.array() for r in reference], picks, rng)
    ratios = np.exp(np.log(mine / theirs).mean(axis=1))
    a = (1 - confidence) / 2
    return Estimate(math.exp(log_ratio), *map(float, np.quantile(ratios, [a, 1 - a])))


def verdict(speedup: Estimate, min_effect: float = MIN_EFFECT, noise: Noise | None = None, pairs: int = 0) -> str:
    """faster / slower: with the pooled noise, when the log speed-up clears `Noise.call_threshold` (a verdict a
    rerun repeats); without it (one repeat, a bootstrap interval), when the interval excludes 1.0 and the
    effect reaches `min_effect`."""
    if noise is not None and pairs > 0 and speedup.known:
        m, threshold = math.log(speedup.value), noise.call_threshold(pairs, min_effect)
        return FASTER if m >= threshold else SLOWER if m <= -threshold else SAME
    if speedup.low > 1.0 and speedup.value >= 1 + min_effect:
        return FASTER
    if speedup.high < 1.0 and speedup.value <= 1 / (1 + min_effect):
        return SLOWER
    return SAME


def compare(name: str, rung: list[Repeat], reference_name: str, reference: list[Repeat],
            min_effect: float = MIN_EFFECT, noise: Noise | None = None) -> Comparison:
    s = speedup_estimate(rung, reference, noise)
    pairs = min(len(rung), len(reference))
    v = verdict(s, min_effect, noise, pairs)
    agreement = rerun_agreement(s, v, min_effect, noise, pairs) if noise is not None and s.known else None
    return Comparison(name, reference_name, s, v, agreement)


def rerun_agreement(speedup: Estimate, current: str, min_effect: float, noise: Noise, pairs: int) -> float:
    """The chance that the same command, run again, gives this comparison the same verdict. The rerun's log
    speed-up is predicted as normal around this one's, with twice its variance (this estimate's error and
    the rerun's own: 2 x 2 sigma^2 / pairs), and judged by `verdict`'s threshold. By construction a called
    difference clears that threshold by a margin, so most reruns call it too; a difference that lands just
    past it, or a "no measurable difference" just short of it, may go the other way next time: the report
    marks those (?), since both answers are within the noise."""
    threshold = noise.call_threshold(pairs, min_effect)
    spread = noise.standard_error(pairs) * math.sqrt(2)
    m = math.log(speedup.value)
    if spread == 0:             # repeats that agree exactly (replayed or reused results): a rerun agrees too
        p_faster, p_slower = float(m > threshold), float(m < -threshold)
    else:
        p_faster = float(scipy_stats().norm.sf((threshold - m) / spread))
        p_slower = float(scipy_stats().norm.cdf((-threshold - m) / spread))
    return {FASTER: p_faster, SLOWER: p_slower}.get(current, 1.0 - p_faster - p_slower)


@dataclass(frozen=True)
class Noises:
    """The two noise pools of one ablation. `process`: between fresh processes, over every rung's own runs (the
    two-way model above). `paired`: of the in-process ratios, over the rungs timed against the baseline inside
    their own processes (ablation/paired.py), where process-level state cancels. A comparison of two paired rungs
    uses their ratios and the paired pool; any other, their own runs and the process pool. `wide` and
    `paired_wide`: the rungs split_noise set apart from each pool, with their own noise; a comparison that
    involves one uses both rungs' noises (combined)."""
    process: Noise | None
    paired: Noise | None = None
    wide: dict[str, Noise] = field(default_factory=dict)
    paired_wide: dict[str, Noise] = field(default_factory=dict)

    def basis(self, *paired: bool) -> tuple[bool, Noise | None]:
        """(whether the comparison of rungs with these `paired` flags uses the ratios, the noise it uses)."""
        both = self.paired is not None and all(paired)
        return both, self.paired if both else self.process

    def own(self, name: str, paired: bool = False) -> Noise | None:
        """The noise of one rung's runs (or ratios): its own where it was set apart, else the pool's."""
        pool, wide = (self.paired, self.paired_wide) if paired else (self.process, self.wide)
        return wide.get(name, pool)

    def between(self, a: str, b: str, paired: bool = False) -> Noise | None:
        """The noise of a comparison of rung `a` with rung `b`."""
        mine, theirs = self.own(a, paired), self.own(b, paired)
        return None if mine is None or theirs is None else combined(mine, theirs)

    def only(self, paired: bool) -> "Noises":
        """These noises on one basis, as the process pool (a simulated rerun's candidates carry plain repeats)."""
        if paired:
            return Noises(self.paired, wide=dict(self.paired_wide))
        return Noises(self.process, wide=dict(self.wide))


@dataclass(frozen=True)
class Candidate:
    """A rung that may be recommended: its name, how many switches it turns on, and its repeats (its speed-up
    against the baseline is estimated from them, paired by pass, inside `recommend`); `ratios`: its in-process
    ratios against the baseline as repeats (Noises), or None when it was not paired."""
    name: str
    switches: float         # how far from the baseline (ablate.switch_count): the tie-break towards the simplest
    repeats: list[Repeat]
    ratios: list[Repeat] | None = None


def as_noises(noise: Noise | Noises | None) -> Noises:
    return noise if isinstance(noise, Noises) else Noises(noise)


def compare_candidates(a: Candidate, b: Candidate, min_effect: float = MIN_EFFECT,
                       noise: Noise | Noises | None = None) -> Comparison:
    """`a` against `b` on the basis both share (Noises.basis)."""
    noises = as_noises(noise)
    paired, chosen = noises.basis(a.ratios is not None, b.ratios is not None)
    if chosen is not None:
        chosen = noises.between(a.name, b.name, paired)
    if paired:
        return compare(a.name, a.ratios, b.name, b.ratios, min_effect, chosen)
    return compare(a.name, a.repeats, b.name, b.repeats, min_effect, chosen)


def recommend(candidates: list[Candidate], min_effect: float = MIN_EFFECT,
              noise: Noise | Noises | None = None) -> tuple[str, list[str]]:
    """(recommended, tie). The first candidate is the baseline. The fastest candidate is recommended only
    when it is measurably faster than the baseline; then, among the candidates measurably faster than the
    baseline and not measurably slower than the fastest, the simplest (fewest switches) is recommended, so a
    switch is never added for a gain inside the noise. The tie: the candidates not measurably different from
    the recommendation. "Measurably" means a firm verdict: called (`verdict`) *and* one a rerun would call
    again at least FIRM of the time (Comparison.firm); a call just past the threshold (marked ? in the report)
    is inside the noise.

    One rule for a cumulative ladder and for independent rungs. (Climbing a ladder rung by rung while the next
    one is measurably faster than the current recommendation made the answer depend on where small gains
    happened to add up past the threshold: on the default ladder three runs in a row recommended three
    different rungs with the same verdicts.) How often a rerun would recommend the same: recommendation_odds."""
    if not candidates:
        raise ValueError("recommend needs at least one candidate")

    def differs(c: Candidate, ref: Candidate) -> str:
        versus = compare_candidates(c, ref, min_effect, noise)
        return versus.verdict if versus.firm else SAME

    best = base = candidates[0]
    speedup = {c.name: compare_candidates(c, base, min_effect, noise).speedup.value for c in candidates}
    top = max(candidates, key=lambda c: speedup[c.name])
    if top is not base and differs(top, base) == FASTER:
        near = [c for c in candidates[1:] if c is top or
                (differs(c, base) == FASTER and differs(c, top) != SLOWER)]
        best = min(near, key=lambda c: (c.switches, -speedup[c.name]))
    tie = [c.name for c in candidates if c is best or differs(c, best) == SAME]
    return best.name, tie


RERUNS = 400            # simulated reruns behind recommendation_odds


def recommendation_odds(candidates: list[Candidate], min_effect: float = MIN_EFFECT,
                        noise: Noise | Noises | None = None, reruns: int = RERUNS) -> dict[str, float]:
    """How often the same command, run again, would recommend each candidate: the recommendation's own
    repeatability, as `rerun_agreement` is a verdict's. Each simulated rerun draws every candidate's mean log
    rate around this run's, with this estimate's error and the rerun's own (variance 2 sigma^2 / passes,
    independent between candidates: the two-way model has taken the pass effects out), and applies `recommend`
    to it. Seeded, so the same measurements always give the same odds. Without a noise estimate (one repeat)
    there is nothing to draw from: the recommendation alone, at 1.0. Drawn on the in-process ratios when every
    candidate has them (Noises), else on the runs' own rates."""
    best, _ = recommend(candidates, min_effect, noise)
    noises = as_noises(noise)
    paired, chosen = noises.basis(*(c.ratios is not None for c in candidates))
    own = [noises.own(c.name, paired) for c in candidates]
    if chosen is None or None in own or all(n.variance == 0 for n in own):
        return {best: 1.0}
    rows = [c.ratios if paired else c.repeats for c in candidates]
    passes = min(len(r) for r in rows)
    means = np.array([statistics.fmean(math.log(r.rate) for r in row[:passes]) for row in rows])
    sigmas = np.sqrt([2 * n.variance / passes for n in own])
    shifts = _rng().normal(0.0, 1.0, size=(reruns, len(candidates))) * sigmas
    rerun = noises.only(paired)
    counts: dict[str, int] = {}
    for row in means + shifts:
        drawn = [Candidate(c.name, c.switches, [Repeat(((math.exp(m), 1.0),))] * passes)
                 for c, m in zip(candidates, row)]
        name, _ = recommend(drawn, min_effect, rerun)
        counts[name] = counts.get(name, 0) + 1
    return {name: counts[name] / reruns for name in sorted(counts, key=counts.get, reverse=True)}
