"""World size as a rung: the same ladder measured at several process counts (`ablate --nproc 1,2`), each rung at each
size judged against itself at the smallest size.

- The job's rate (every rank's samples: scoring.rung_repeats) and the rate per rank (the job's over its ranks), with
  each rank's own rate where the ranks were measured one by one (measure/ranks.py).
- The scaling efficiency: the job's rate at N over (N / N0) times its rate at the smallest size N0 (N0 = 1: over N
  times one process's rate); 1 is perfect scaling. Its interval is that of the ratio of the two rates over their
  repeats (stats.compare_candidates, on the noise pooled over every size's runs), divided by N / N0, so it is as
  wide as the repeats make it.
- Time to target (--target): more processes at the same batch per rank make a larger global batch, which changes
  the math, so the rate alone cannot say which size is sooner. Each size's rung is judged on its time to target
  against the same rung at the smallest size (ablation/target.to_target: the smallest size's seed band decides whether
  its samples to target are that size's or its own), with the verdict and bootstrap interval over seeds.

Pure functions of the runs' records, like scoring.py: recomputed from the folders of an ablation.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..results import Rung, Status
from ..stats import MIN_EFFECT, Candidate, compare_candidates
from ..target import Target
from .scoring import ladder_noises, rung_repeats
from .target import runs_with_curves, seed_band, to_target


def efficiency(speedup: float, interval: list[float] | None, scale: float) -> tuple[float, list[float] | None]:
    """(efficiency, its interval) from the job's rate at N over its rate at N0 (`speedup`) and N / N0 (`scale`)."""
    return speedup / scale, [interval[0] / scale, interval[1] / scale] if interval else None


def per_size(rung: Rung, nproc: int) -> dict[str, Any]:
    """A rung's own figures at one size: the job's rate with its interval, the rate per rank, each rank's own rate,
    the straggler line, its time to target in its own ladder."""
    r = rung.result
    ranks = (r.ranks or {}).get("ranks") or []
    measured = rung.status == Status.DONE and bool(r.repeats)
    return {"nproc": nproc, "status": str(rung.status), "repeats": r.repeats,
            "throughput": r.throughput if measured else None,
            "throughput_interval": r.throughput_interval if measured else None,
            "per_rank": r.throughput / nproc if measured and r.throughput else None,
            "rank_rates": [f.get("rate") for f in ranks],
            "ranks_line": (r.ranks or {}).get("line"),
            "to_target": r.to_target}


def scaling(ladders: dict[int, list[Rung]], target: Target | None = None,
            min_effect: float = MIN_EFFECT) -> dict[str, Any]:
    """Every size's rungs beside the same rung at the smallest size (module docstring): {"sizes", "reference",
    "target", "by_size": [{"nproc", "rungs": [...]}]}, a row per rung that is in the smallest size's ladder."""
    sizes = sorted(ladders)
    n0 = sizes[0]
    # The same rung at two sizes is two candidates: named apart, so the noise pool counts each size's runs on their own
    tagged = {n: [dataclasses.replace(r, name=f"{r.name}@{n}") for r in ladders[n]] for n in sizes}
    noises = ladder_noises([r for n in sizes for r in tagged[n]])
    reference = {r.name.rsplit("@", 1)[0]: r for r in tagged[n0]}
    by_size = []
    for n in sizes:
        rows = []
        for rung in tagged[n]:
            name = rung.name.rsplit("@", 1)[0]
            ref = reference.get(name)
            row = {"rung": name, **per_size(rung, n)}
            row.update(against(rung, ref, n / n0, noises, min_effect) if ref is not None and n != n0 else
                       {"speedup": 1.0, "efficiency": 1.0, "verdict": "reference"} if n == n0 and row["throughput"]
                       else {})
            if target is not None and target.known and ref is not None and n != n0:
                row["vs_reference_target"] = target_against(rung, ref, target, min_effect)
            rows.append(row)
        by_size.append({"nproc": n, "rungs": rows})
    return {"sizes": sizes, "reference": n0, "target": target.to_dict() if target is not None else None,
            "by_size": by_size}


def against(rung: Rung, ref: Rung, scale: float, noises, min_effect: float) -> dict[str, Any]:
    """The job's rate at this size over the same rung's at the smallest size, and the efficiency it makes. Compared on
    the runs themselves, never on in-process ratios (paired.py): those are against each size's own baseline."""
    mine, theirs = rung_repeats(rung), rung_repeats(ref)
    if rung.status != Status.DONE or ref.status != Status.DONE or not mine or not theirs:
        return {}
    comparison = compare_candidates(Candidate(rung.name, 0.0, mine, None), Candidate(ref.name, 0.0, theirs, None),
                                    min_effect, noises)
    value, interval = comparison.speedup.value, comparison.speedup.interval
    eff, eff_interval = efficiency(value, interval, scale)
    return {"speedup": value, "speedup_interval": interval, "efficiency": eff, "efficiency_interval": eff_interval,
            "verdict": comparison.verdict, "verdict_text": comparison.text}


def target_against(rung: Rung, ref: Rung, target: Target, min_effect: float) -> dict[str, Any] | None:
    """This size's time to target over the smallest size's for the same rung (ablation/target.to_target with the
    smallest size's rung as the reference: its seed band says whether the larger global batch changed the math)."""
    if rung.status not in (Status.DONE, Status.PARTIAL) or ref.status not in (Status.DONE, Status.PARTIAL):
        return None
    summary = to_target(rung, ref, target, seed_band(runs_with_curves(ref), target.name), min_effect)
    if summary is None:
        return None
    return {k: summary[k] for k in ("time_s", "samples", "samples_ratio", "samples_interval", "samples_from",
                                    "speedup", "interval", "verdict", "reached", "runs")}
