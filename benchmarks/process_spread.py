"""What sets a fresh process's speed on this machine: every run of one or more ablations, set against what the
machine gave its process.

Every run of a rung is the same work in a fresh process (same model, recipe and batch shapes; only the seed
moves). So within a rung, what separates a fast process from a slow one is process-level state. Each run's record
holds that state (`process`, procstate.py): its page faults, huge pages, the times the kernel took the CPU from it,
the cores its two busiest threads last ran on. This script prints, within every rung, each run's rate against its
page faults per step, and over all runs the rank correlation of the rate (as a deviation from its rung's mean, on
the log scale) with each of those, so the state that moves the speed shows as the one that follows it.

Runs made with `--paired` also hold the baseline's step timed in the same process as each rung: its rate across
all runs is the same work in every process, and its spread is printed apart.

    python benchmarks/process_spread.py runs/ablate-A runs/ablate-B runs/ablate-C
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from scipy import stats


def rungs_of(folder: Path) -> list[tuple[str, list[dict]]]:
    """(rung name, its timed runs that recorded their process) for every rung of the folder's ablation."""
    result = json.loads((folder / "results.json").read_text())
    out = []
    for rung in result["rungs"]:
        runs = [r for r in rung.get("runs") or [] if r.get("process") and r.get("throughput")]
        if len(runs) >= 2:
            out.append((f"{folder.name}/{rung['name']}", runs))
    return out


def steps(run: dict) -> int:
    return run.get("steps_run") or run.get("steps") or 1


def state(run: dict) -> dict[str, float]:
    """What the machine gave the run's process, per step where it accrues with the steps."""
    proc = run["process"]
    threads = sorted(proc.get("busy_threads") or [], key=lambda t: -t.get("cpu_s", 0))[:2]
    return {"page faults per step": (proc.get("minor_faults") or 0) / steps(run),
            "preempted per step": (proc.get("preempted") or 0) / steps(run),
            "huge pages KiB": proc.get("anon_huge_kib") or 0,
            "two busiest threads last on one core": float(len(threads) == 2
                                                          and threads[0].get("core") == threads[1].get("core"))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    args = p.parse_args(argv)
    rungs = [r for folder in args.folders for r in rungs_of(folder)]
    if not rungs:
        print("no rung with two runs that recorded their process: run `trainfast ablate` first", file=sys.stderr)
        return 1
    deviation: list[float] = []
    features: dict[str, list[float]] = {}
    print("rate (samples/s) / page faults per step, run by run:")
    for name, runs in rungs:
        logs = [math.log(r["throughput"]) for r in runs]
        mean = statistics.fmean(logs)
        deviation += [x - mean for x in logs]
        rows = [state(r) for r in runs]
        for key in rows[0]:
            values = [row[key] for row in rows]
            centre = statistics.fmean(values)
            features.setdefault(key, []).extend(v - centre for v in values)
        print(f"  {name:40s} " + "  ".join(f"{r['throughput']:7,.0f} / {s['page faults per step']:6,.0f}"
                                           for r, s in zip(runs, rows)))
    df = len(deviation) - len(rungs)
    print(f"{len(deviation)} runs of {len(rungs)} rungs: the runs' rates spread "
          f"{100 * math.sqrt(sum(d * d for d in deviation) / df):.1f}% around their rung's mean ({df} df)")
    print("rank correlation of a run's rate with its process's state, both as deviations from its rung's mean:")
    for key, values in features.items():
        if len(set(round(v, 9) for v in values)) < 3:
            print(f"  {key}: no spread within the rungs")
            continue
        rho, pvalue = stats.spearmanr(values, deviation)
        print(f"  {key}: rho {rho:+.2f} (p {pvalue:.1g})")
    paired = [r["paired"]["reference_rate"] for _, runs in rungs for r in runs
              if "reference_rate" in (r.get("paired") or {})]
    if len(paired) >= 3:
        print(f"--paired: the baseline's step timed in {len(paired)} processes: "
              f"{100 * statistics.stdev(math.log(x) for x in paired):.1f}% spread")
    return 0


if __name__ == "__main__":
    sys.exit(main())
