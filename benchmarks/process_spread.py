"""What sets a fresh process's speed on this machine: the same work timed in every run of one or more ablations.

Every paired run of a built-in ablation (ablation/paired.py) times the baseline's step inside its own process, so
the reference's rate across the runs is the same work measured in N different processes, on whatever state each
process got. This script reads the report folders and prints:

- the spread of that rate from process to process (its log standard deviation), against the spread of the
  in-process ratios (what the verdicts are judged on when paired);
- whether the processes fall into separate speed levels (the gap between sorted rates against their spread);
- how the rate follows what the machine gave each process (its `process` record, procstate.py): the times the
  kernel took the CPU from it, its page faults and huge pages, whether its two busiest threads last ran on one
  core, and its place in the ladder (early or late: the machine drifting), as rank correlations.

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


def runs_of(folder: Path) -> list[dict]:
    """Every paired run of the folder's ablation, in the order they ran, with its rung's name."""
    result = json.loads((folder / "results.json").read_text())
    out = []
    for rung in result["rungs"]:
        for i, run in enumerate(rung.get("runs") or []):
            pair = run.get("paired") or {}
            if "ratio" in pair:
                out.append({"folder": folder.name, "rung": rung["name"], "repeat": i, "run": run, "pair": pair})
    # Interleaved passes: repeat i of every rung ran in pass i, rungs in ladder order.
    names = [r["name"] for r in result["rungs"]]
    return sorted(out, key=lambda r: (r["repeat"], names.index(r["rung"])))


def features(entry: dict, order: int) -> dict[str, float]:
    proc = entry["run"].get("process") or {}
    threads = sorted(proc.get("busy_threads") or [], key=lambda t: -t.get("cpu_s", 0))[:2]
    same_core = float(len(threads) == 2 and threads[0].get("core") == threads[1].get("core"))
    seconds = entry["run"].get("run_seconds") or 1.0
    return {"preempted per s": (proc.get("preempted") or 0) / seconds,
            "minor faults per s": (proc.get("minor_faults") or 0) / seconds,
            "huge pages KiB": proc.get("anon_huge_kib") or 0,
            "two busiest threads on one core": same_core,
            "place in the ladder": order}


def levels(rates: list[float]) -> str:
    """Whether the rates form separate levels: the widest gap between neighbours (sorted) against the spread
    inside the groups it splits."""
    xs = sorted(math.log(r) for r in rates)
    if len(xs) < 4:
        return "too few runs to tell"
    gaps = [(b - a, i) for i, (a, b) in enumerate(zip(xs, xs[1:]), 1)]
    gap, at = max(gaps)
    low, high = xs[:at], xs[at:]
    inside = math.sqrt((len(low) * statistics.pvariance(low) + len(high) * statistics.pvariance(high)) / len(xs))
    kind = "two levels" if inside > 0 and gap > 4 * inside and min(at, len(xs) - at) >= 2 else "one level"
    return f"{kind}: widest gap {100 * (math.exp(gap) - 1):.1f}% between runs {at} and {at + 1} of {len(xs)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    args = p.parse_args(argv)
    entries = [e for f in args.folders for e in runs_of(f)]
    if len(entries) < 4:
        print("fewer than 4 paired runs: run `trainfast ablate` (paired by default) first", file=sys.stderr)
        return 1
    ref = [e["pair"]["reference_rate"] for e in entries]
    print(f"{len(entries)} processes, each timing the baseline's step against its own rung")
    print(f"the baseline's step, process to process: {statistics.median(ref):,.0f} samples/s median, "
          f"{100 * statistics.stdev(math.log(r) for r in ref):.1f}% spread (log sd); {levels(ref)}")
    by_rung: dict[str, list[float]] = {}
    for e in entries:
        by_rung.setdefault(e["rung"], []).append(math.log(e["pair"]["ratio"]))
    resid = [x - statistics.fmean(xs) for xs in by_rung.values() if len(xs) > 1 for x in xs]
    df = sum(len(xs) - 1 for xs in by_rung.values() if len(xs) > 1)
    if df:
        print(f"the in-process ratios: {100 * math.sqrt(sum(r * r for r in resid) / df):.1f}% spread ({df} df)")
    table = [features(e, i) for i, e in enumerate(entries)]
    print("rank correlation of the baseline step's rate with what each process got (Spearman rho, p):")
    for name in table[0]:
        values = [row[name] for row in table]
        if len(set(values)) < 2:
            print(f"  {name}: the same in every process ({values[0]:g})")
            continue
        rho, pvalue = stats.spearmanr(values, ref)
        print(f"  {name}: rho {rho:+.2f}, p {pvalue:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
