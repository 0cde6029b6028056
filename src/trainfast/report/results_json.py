"""results.json: every number of the table with the recipe that produced it, each process's own record and
the machine it was measured on, in plain JSON (schema: results.SCHEMA_VERSION)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..checkpoint import atomic_write_text
from ..results import SCHEMA_VERSION, AblationResult, EffectLabel, Rung, Status

# A rung's numbers that lead its entry, in this order (what the table shows); every other result field follows.
HEADLINE = ("throughput", "throughput_interval", "throughput_spread", "speedup", "speedup_interval", "epoch_time_s",
            "peak_memory_bytes", "metric", "loss", "flops_per_s", "ceiling_fraction")


def rung_verdict(rung: Rung) -> str | None:
    """The verdict results.json gives a rung: stats' against the baseline, or why it has none."""
    if rung.status == Status.NO_EFFECT:
        return {EffectLabel.SLOW_HALF: "not run: slower on this device", EffectLabel.NOT_APPLICABLE: "not applicable",
                EffectLabel.NO_SESSION: "no effect: the script has no trainfast.Session",
                EffectLabel.NOT_APPLIED: "not applied: the framework did not end up with the switch"}.get(rung.effect,
                                                                                       "no effect on this device")
    if rung.status == Status.FAILED:
        return "failed"
    return rung.result.verdict


def rung_dict(rung: Rung, metric: dict[str, Any] | None = None) -> dict[str, Any]:
    """One rung's entry: what it changed and its recipe, its status, its verdict, then every RungResult field
    (null when not measured), the headline numbers first, then every process's own record (step times
    included). `metric`: the ladder's judged metric (AblationResult.metric), whose name and goal the rung's
    `metric` carries beside its value (None when the runs were only timed); its other numbers are `metric_*`."""
    numbers = rung.result.to_dict()
    del numbers["verdict"]
    item: dict[str, Any] = {
        "name": rung.name,
        "changes": rung.changes,
        "recipe": rung.recipe.to_dict(),
        "effect": str(rung.effect),
        "effect_reason": rung.reason,
        "status": str(rung.status),
        "verdict": rung_verdict(rung),
    }
    for key in HEADLINE:
        item[key] = numbers.pop(key)
    # The judged metric, named: accuracy, mAP, a language model's validation loss (lower is better), a script's own.
    value = item["metric"]
    item["metric"] = ({"name": (metric or {}).get("name"), "goal": (metric or {}).get("goal"), "value": value}
                      if metric or value is not None else None)
    item.update(numbers)
    if rung.script:                 # a rung of the script's own flags: its args, env, command line, observed note
        item["script"] = rung.script
    item["runs"] = rung.repeats
    if rung.seed_runs:              # metric-only runs: the baseline's noise seeds, a --target rung's extra seeds
        item["seed_runs"] = rung.seed_runs
    return item


def results_dict(result: AblationResult) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "environment": result.environment,
        "settings": result.settings,
        "ceilings_flops_per_s": result.ceilings,
        "metric": result.metric,
        "best": {"name": result.best_name, "recipe": result.best.to_dict() if result.best else None, "tie": result.tie,
                 "rerun_odds": result.odds, "none_because": result.no_recommendation,
                 **best_command(result)},
        "baseline_seeds": result.seed_runs,
        "rungs": [rung_dict(rung, result.metric) for rung in result.rungs],
    }


def best_command(result: AblationResult) -> dict[str, Any]:
    """Where the recommendation is a rung of the script's own flags: the command line (and variables) to run."""
    best = next((r for r in result.rungs if r.name == result.best_name and r.script), None)
    return {"command": best.script["command"], "command_env": best.script["command_env"]} if best else {}


def write_results_json(result: AblationResult) -> Path:
    """results.json in the result's folder, whole or not at all (an interrupted write leaves the old one)."""
    path = Path(result.out_dir) / "results.json"
    atomic_write_text(path, json.dumps(results_dict(result), indent=2, default=str))
    return path
