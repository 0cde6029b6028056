"""Rank by rank: each rank's own figures in a distributed run, their spread, and the straggler named with its phase.

Under DDP every rank's step ends at the gradient all-reduce, so the step times of all ranks are the same and a slow
rank is invisible in them: the others simply wait for it inside the collective. What shows it is the work each rank
does on its own, outside the collectives, timed per step on each rank:
  data       the time it waited for its next batch (the step clock's wait: measure/clock.py)
  compute    its training forward and its optimizer step (the backward is left out: under DDP it holds the
             all-reduce, whose end every rank shares)
  collective the rest of its step: the backward with the gradient all-reduce, where a rank that arrived early
             waits for the last one (`waited_s`: how much longer than the quickest rank it spent there)
A rank is named slow only when its own time (data + compute) per step exceeds the other ranks' by at least
STRAGGLER_SHARE of the step AND by NOISE_FACTOR times the noise of that difference (the steps' own scatter, as a
standard error of the medians): two equal ranks on a busy machine never cross both. The phase named is the one
that holds most of its excess. Over the repeats of a rung (`combine_runs`) a straggler is named only when every run
named the same rank and phase: one that comes and goes is within the run-to-run noise.

Pure arithmetic on plain numbers (no torch): the probe times the phases (probe/ranks.py), the report reads the
result."""
from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

STRAGGLER_SHARE = 0.2      # a rank's own time must exceed the others' by this share of the median step
NOISE_FACTOR = 4.0         # ... and by this many standard errors of that difference
MAD_TO_SD = 1.4826         # a normal distribution's standard deviation per median absolute deviation
MEDIAN_SE = 1.2533         # the standard error of a median per that of a mean (normal data)
PHASES = ("data", "compute")


def median_and_error(values: Sequence[float]) -> tuple[float, float]:
    """The median of per-step values and its standard error, from their median absolute deviation (robust to
    the few steps a busy machine stretches)."""
    if not values:
        return 0.0, 0.0
    mid = statistics.median(values)
    mad = statistics.median(abs(v - mid) for v in values)
    return mid, MEDIAN_SE * MAD_TO_SD * mad / math.sqrt(len(values))


def rank_figures(rank: int, step_s: Sequence[float], data_s: Sequence[float], forward_s: Sequence[float],
                 optimizer_s: Sequence[float], samples: Sequence[int]) -> dict[str, Any]:
    """One rank's figures over its timed steps (aligned lists, one value per optimizer step): the medians per step
    of each phase with their standard errors, and its rate (its own samples over its own seconds)."""
    n = min(len(step_s), len(data_s), len(forward_s), len(optimizer_s))
    step_s, data_s, forward_s, optimizer_s = (list(x[:n]) for x in (step_s, data_s, forward_s, optimizer_s))
    compute = [f + o for f, o in zip(forward_s, optimizer_s)]
    own = [d + c for d, c in zip(data_s, compute)]
    rest = [max(0.0, s - o) for s, o in zip(step_s, own)]
    out: dict[str, Any] = {"rank": rank, "steps": n,
                           "rate": sum(samples[:n]) / sum(step_s) if n and sum(step_s) else None}
    for name, values in (("step", step_s), ("data", data_s), ("forward", forward_s), ("optimizer", optimizer_s),
                         ("compute", compute), ("collective", rest), ("own", own)):
        mid, error = median_and_error(values)
        out[f"{name}_s"] = mid
        out[f"{name}_error_s"] = error
    return out


def judge_ranks(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's figures (rank_figures, with `ddp` where DDP timed itself), their spread and the straggler:
    the rank and phase the module docstring's rule names, or None. The time each rank waited at the collective is
    its collective time beyond the quickest rank's."""
    usable = [r for r in ranks if r.get("steps")]
    if len(usable) < 2:
        return {"ranks": ranks, "spread": None, "straggler": None, "threshold": None}
    quickest = min(r["collective_s"] for r in usable)
    for r in usable:
        r["waited_s"] = r["collective_s"] - quickest
    own = [r["own_s"] for r in usable]
    slowest = max(usable, key=lambda r: r["own_s"])
    others = [r for r in usable if r is not slowest]
    step = statistics.median(r["step_s"] for r in usable)

    def excess(name: str) -> float:
        return slowest[f"{name}_s"] - statistics.median(r[f"{name}_s"] for r in others)

    noise = math.hypot(slowest["own_error_s"], statistics.median(r["own_error_s"] for r in others))
    threshold = max(STRAGGLER_SHARE * step, NOISE_FACTOR * noise)
    middle = statistics.median(own)
    judged = {"ranks": ranks, "spread": max(own) / middle if middle > 0 else None, "threshold": {
        "share_of_step": STRAGGLER_SHARE, "noise_factor": NOISE_FACTOR, "seconds": threshold,
        "noise_s": noise}, "straggler": None}
    over = excess("own")
    if over > 0 and over >= threshold:
        phase = max(PHASES, key=excess)
        judged["straggler"] = {"rank": slowest["rank"], "phase": phase, "excess_s": over,
                               "phase_excess_s": excess(phase), "share_of_step": over / step if step else None}
    return judged


def straggler_line(judged: dict[str, Any] | None) -> str:
    """One sentence: the straggler and what makes it slow, or that no rank stands out (and by how much at most)."""
    if not judged or judged.get("spread") is None:
        return "per-rank figures: not measured"
    found = judged.get("straggler")
    if found is None:
        return (f"no rank is slow: the ranks' own time per step (data + compute) spreads {judged['spread']:.2f}x "
                f"(max / median), inside the {100 * judged['threshold']['share_of_step']:.0f}%-of-a-step and "
                "noise bar")
    waited = [r for r in judged["ranks"] if r.get("rank") != found["rank"] and r.get("waited_s") is not None]
    wait = (f"; the other ranks waited {1000 * statistics.median(r['waited_s'] for r in waited):.1f} ms a step for "
            "it at the collective" if waited else "")
    return (f"rank {found['rank']} is the straggler, slow in {found['phase']}: its own time per step is "
            f"{1000 * found['excess_s']:.1f} ms over the other ranks' ({100 * (found['share_of_step'] or 0):.0f}% "
            f"of a step), {1000 * found['phase_excess_s']:.1f} ms of it in {found['phase']}{wait}")


def combine_runs(runs: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """A rung's per-rank figures over its repeats: each rank's medians averaged, and the straggler named only when
    every run named the same rank and phase (otherwise `straggler_runs` says how many did: within the run-to-run
    noise)."""
    judged = [r for r in runs if r and r.get("spread") is not None]
    if not judged:
        return None
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for run in judged:
        for figures in run["ranks"]:
            by_rank.setdefault(figures["rank"], []).append(figures)
    ranks = []
    for rank, seen in sorted(by_rank.items()):
        keys = [k for k, v in seen[0].items() if isinstance(v, (int, float)) and k != "rank"]
        ranks.append({"rank": rank, **{k: statistics.fmean(f[k] for f in seen if f.get(k) is not None)
                                       for k in keys if any(f.get(k) is not None for f in seen)},
                      "ddp": seen[0].get("ddp")})
    named = [(r["straggler"]["rank"], r["straggler"]["phase"]) if r.get("straggler") else None for r in judged]
    same = named[0] is not None and all(n == named[0] for n in named)
    return {"ranks": ranks, "spread": statistics.fmean(r["spread"] for r in judged),
            "threshold": judged[0]["threshold"], "runs": len(judged),
            "straggler_runs": sum(n is not None for n in named),
            "straggler": judged[0]["straggler"] if same else None,
            "line": straggler_line(judged[0]) if same or not any(named) else
            (f"no rank is named slow: a straggler was seen in {sum(n is not None for n in named)} of "
             f"{len(judged)} runs only (within the run-to-run noise)")}
