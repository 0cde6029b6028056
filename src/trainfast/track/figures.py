"""What a tracker is given, read from results.json's own entries (report/results_json.py), never measured again:
a rung's switches as params, its figures as metrics, its verdict and status as tags; the ablation's settings as
the parent's params and its recommendation as the parent's tags. Pure functions on plain dicts, so a finished
results.json feeds a tracker as the running ablation does."""
from __future__ import annotations

import re
from typing import Any

from .base import text

# A verdict as a number, so a dashboard can sort and plot it: faster 1, slower -1, no measurable difference 0
VERDICT_SIGN = {"faster": 1.0, "slower": -1.0, "no measurable difference": 0.0, "sooner": 1.0, "later": -1.0}
# The parent's params: what identifies the ablation (the rest stays in results.json, an artifact)
SETTING_KEYS = ("task", "model", "data", "command", "device", "mode", "repeats", "noise_seeds", "nproc", "measure",
                "min_effect", "memory_limit", "stage")
ENVIRONMENT_KEYS = ("device_name", "device", "torch", "git_sha", "cpu")


def metric_key(name: str) -> str:
    """A metric's name as a key every tracker takes: "validation loss" -> "validation_loss"."""
    return re.sub(r"[^A-Za-z0-9_.\-/]+", "_", name.strip()).strip("_") or "metric"


def rung_params(item: dict[str, Any], base_recipe: dict[str, Any] | None) -> dict[str, str]:
    """A rung's switches: every recipe field it runs with that differs from the baseline's (in a cumulative
    ladder, the rungs above it too), else its own changes; with its name and what it was measured as."""
    recipe = item.get("recipe") or {}
    switched = ({k: v for k, v in recipe.items() if base_recipe.get(k) != v} if base_recipe is not None and recipe
                else dict(item.get("changes") or {}))
    return {"rung": item["name"], "effect": str(item.get("effect")), **{k: text(v) for k, v in switched.items()}}


def rung_metrics(item: dict[str, Any]) -> dict[str, float]:
    """A rung's numbers: rate (with its interval), speed-up over the baseline with its interval, the verdict as
    VERDICT_SIGN (verdict_sign; its words are the tag `verdict`), peak memory, the judged metric (also under its
    own name), time to target with its speed-up."""
    out: dict[str, Any] = {"rate": item.get("throughput"), "speedup": item.get("speedup"),
                           "peak_memory_bytes": item.get("peak_memory_bytes"), "epoch_time_s": item.get("epoch_time_s"),
                           "repeats": item.get("repeats"), "verdict_sign": VERDICT_SIGN.get(item.get("verdict") or "")}
    for key, pair in (("rate", item.get("throughput_interval")), ("speedup", item.get("speedup_interval"))):
        if pair:
            out[f"{key}_low"], out[f"{key}_high"] = pair
    metric = item.get("metric")
    if isinstance(metric, dict) and metric.get("value") is not None:
        out["metric"] = metric["value"]
        if metric.get("name"):
            out[metric_key(metric["name"])] = metric["value"]
    target = item.get("to_target") or {}
    out.update({"time_to_target_s": target.get("time_s"), "time_to_target_speedup": target.get("speedup"),
                "time_to_target_sign": VERDICT_SIGN.get(target.get("verdict") or "")})
    if target.get("interval"):
        out["time_to_target_low"], out["time_to_target_high"] = target["interval"]
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def rung_tags(item: dict[str, Any]) -> dict[str, str]:
    """A rung's words: its status and verdict (with the interval's sentence), the unit of its rate, why it was
    not run."""
    tags = {"status": item.get("status"), "verdict": item.get("verdict"), "verdict_text": item.get("verdict_text"),
            "rate_unit": item.get("rate_unit"), "effect_reason": item.get("effect_reason"),
            "time_to_target_verdict": (item.get("to_target") or {}).get("verdict"), "error": item.get("error")}
    return {k: text(v) for k, v in tags.items() if v}


def parent_params(results: dict[str, Any]) -> dict[str, str]:
    """The ablation's identity: its settings and the machine (every other number is in results.json)."""
    settings, env = results.get("settings") or {}, results.get("environment") or {}
    params = {k: settings[k] for k in SETTING_KEYS if settings.get(k) is not None}
    params.update({f"env.{k}": env[k] for k in ENVIRONMENT_KEYS if env.get(k) is not None})
    return {k: text(v) for k, v in params.items()}


def parent_tags(results: dict[str, Any]) -> dict[str, str]:
    """The recommendation, or why there is none."""
    best = results.get("best") or {}
    tags = {"best": best.get("name"), "none_because": best.get("none_because"),
            "tie": ", ".join(best.get("tie") or []) or None}
    return {k: text(v) for k, v in tags.items() if v}


def base_recipe(results: dict[str, Any]) -> dict[str, Any] | None:
    """The baseline's recipe (the first rung's), which every rung's switches are told apart from."""
    rungs = results.get("rungs") or []
    return rungs[0].get("recipe") if rungs else None
