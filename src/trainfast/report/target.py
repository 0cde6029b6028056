"""The report's time-to-target part (--target): a row per rung with its time to target, its two factors (samples to
target, the rate on the way) and the verdict on time beside the verdict on rate; and the chart people look at
first, each rung's metric against its training time."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..results import AblationResult, Rung
from ..target import point_value
from .format import fmt_sig, rung_label, short_verdict
from .table import markdown_table

HEADERS = ["rung", "time to target", "vs baseline (95% CI)", "samples to target", "samples vs baseline (95% CI)",
           "rate to target", "reached", "verdict on time", "verdict on rate"]


def summary(rung: Rung) -> dict[str, Any] | None:
    return rung.result.to_target


def seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "not reached"
    return f"{value:,.1f} s" if value < 600 else f"{value / 60:,.1f} min"


def ratio(value: float | None, interval: list[float] | None) -> str:
    if value is None:
        return "—"
    text = "∞" if math.isinf(value) else f"{value:.2f}x"
    if interval:
        low, high = (("∞" if math.isinf(v) else f"{v:.2f}") for v in interval)
        text += f" ({low}–{high})"
    return text


def target_rows(result: AblationResult) -> list[list[str]]:
    unit = unit_of(result)
    rows = []
    for rung in result.rungs:
        s = summary(rung)
        if s is None:
            continue
        base = rung is result.rungs[0]
        from_base = s["samples_from"] == "baseline" and not base
        # A rung whose median run did not reach the target has no ratio to show (its runs' are in results.json)
        reached = s["time_s"] is not None and math.isfinite(s["time_s"])
        rows.append([
            rung_label(rung), seconds(s["time_s"]),
            "1.00x" if base else ratio(s["speedup"], s["interval"]) if reached else "—",
            (f"{s['samples']:,.0f} {unit}" if math.isfinite(s["samples"]) else "not reached"),
            "1.00x" if base else ("the baseline's (curve inside its seed band)" if from_base
                                  else ratio(s["samples_ratio"], s["samples_interval"]) if reached else "—"),
            f"{fmt_sig(s['rate'])} {unit}/s" if s.get("rate") else "—",
            f"{s['reached']} of {s['runs']}",
            "reference" if base else s["verdict"],
            "reference" if base else short_verdict(rung.result.verdict, rung.result.speedup, rung.result.is_firm)])
    return rows


def target_text(result: AblationResult) -> str | None:
    target = result.settings.get("target")
    return target.get("text") if target else None


def unit_of(result: AblationResult) -> str:
    return result.rungs[0].result.unit or "samples"


def explanation(result: AblationResult) -> str:
    target = result.settings["target"]
    cap = f"{target['cap_seen']:,.0f} {unit_of(result)}" if target.get("cap_seen") else "its planned run"
    return " ".join([
        f"Target: **{target['text']}**. Each run evaluates on its way; its time to target is its training time",
        "(compilation and input waits included, evaluation excluded) at its first evaluation that reaches the target",
        "(the built-in run stops there, a script runs on to its end); a run still short of it at its cap",
        f"({cap}, {target['cap_factor']:g}x the baseline's samples to target) stops and counts as not reaching it.",
        "Time to target = samples to target / rate: a rung whose curve over samples stays inside the baseline's",
        "seed band needs the baseline's samples (the median over its seeds) and its rate decides; a rung that",
        f"leaves the band is measured on its own runs, over up to {target['seeds']} seeds. A time ratio is the",
        "baseline's time over the rung's (above 1: sooner), a samples ratio the rung's samples over the baseline's",
        "(above 1: it needs more), each with a bootstrap interval over seeds; the verdict on time to target stands",
        "beside the verdict on rate."])


def target_section(result: AblationResult, charts: list[Path]) -> list[str]:
    rows = target_rows(result)
    if not rows:
        return []
    chart = [f"![time to target]({c.name})" for c in charts if c.stem == "target_curves"]
    return ["## Time to target", "", explanation(result), "", markdown_table(HEADERS, rows), "", *chart,
            *([""] if chart else [])]


def run_curves(rung: Rung, name: str) -> list[list[tuple[float, float]]]:
    """(training seconds, metric) along each of a rung's runs that recorded a curve."""
    curves = []
    for run in rung.repeats + rung.seed_runs:
        points = [(float(p["train_s"]), point_value(p, name)) for p in run.get("curve") or []]
        curves.append([(t, v) for t, v in points if v is not None])
    return curves


def console_table(result: AblationResult):
    """The rows as a rich Table for the terminal, or None without a target."""
    rows = target_rows(result)
    if not rows:
        return None
    from rich.table import Table

    table = Table(title=f"time to target: {target_text(result)}")
    for header in HEADERS:
        table.add_column(header, justify="left" if header == "rung" else "right")
    for row in rows:
        table.add_row(*row)
    return table


def write_target_chart(result: AblationResult) -> Path | None:
    """target_curves.png: each rung's runs, the metric against training time, the target drawn across."""
    target = result.settings.get("target") or {}
    name = target.get("name")
    if not name or not any(summary(r) for r in result.rungs):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4), dpi=110)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, rung in enumerate(r for r in result.rungs if summary(r)):
        colour = colours[index % len(colours)]
        for k, points in enumerate(run_curves(rung, name)):
            if points:
                ax.plot(*zip(*points), color=colour, alpha=0.7, linewidth=1.0,
                        label=rung_label(rung) if k == 0 else None)
    if target.get("value") is not None:
        ax.axhline(target["value"], color="#444", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("training time (s), evaluation excluded")
    ax.set_ylabel(name)
    ax.set_title(f"{name} against training time, every run — {result.environment['device_name']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(result.out_dir) / "target_curves.png"
    fig.savefig(path)
    plt.close(fig)
    return path
