"""The report's charts, one PNG per measure (rate with its interval and verdict, peak memory, the judged
metric with the baseline's noise band), each a bar per finished rung."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..results import AblationResult, Rung, Status
from .format import fmt_sig, rung_label, short_verdict
from .table import Columns, judged_name


def chart_specs(result: AblationResult, done: list[Rung]) -> list[tuple[str, str, list[float], Any]]:
    """(file stem, y label, one value per rung, error bars or None) for each chart."""
    rates = [r.result.throughput for r in done]
    intervals = [r.result.throughput_interval or (v, v) for r, v in zip(done, rates)]
    rate_errors = [[v - lo for v, (lo, hi) in zip(rates, intervals)], [hi - v for v, (lo, hi) in zip(rates, intervals)]]
    columns = Columns.for_settings(result.settings, result.rungs, result.metric)
    specs = [
        ("throughput", f"{columns.unit} (95% interval bars)", rates, rate_errors),
        ("peak_memory", "peak memory (MiB)", [r.result.peak_memory_bytes / 2**20 for r in done], None),
    ]
    if all(r.result.metric is not None for r in done):
        held_out = "held-out " + judged_name(result)
        specs.append(("metric", held_out if not result.settings.get("command") else columns.metric_label,
                      [r.result.metric for r in done], None))
    return specs


def bar_texts(name: str, values: list[float], done: list[Rung]) -> list[str]:
    """The label over each bar: its value, and under a rate the verdict against the baseline."""
    texts = [fmt_sig(v) for v in values]
    if name != "throughput":
        return texts
    return [t + ("" if r.name == "baseline" else "\n" + short_verdict(r.result.verdict, r.result.speedup,
                                                                       r.result.is_firm)
                 .replace("no measurable difference", "no diff."))
            for t, r in zip(texts, done)]


def write_charts(result: AblationResult) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in result.rungs if r.status == Status.DONE]
    if not done:
        return []
    labels = [rung_label(r) for r in done]
    base = done[0].result
    paths = []
    for name, ylabel, values, errors in chart_specs(result, done):
        fig, ax = plt.subplots(figsize=(8, 3.6), dpi=110)
        bars = ax.bar(range(len(values)), values, yerr=errors, capsize=3, color="#3b75af")
        ax.bar_label(bars, labels=bar_texts(name, values, done), fontsize=7, padding=2)
        tops = [v + (errors[1][i] if errors else 0) for i, v in enumerate(values)]
        ax.set_ylim(0, max(tops) * 1.25)          # room for the labels above the tallest bar
        if name == "metric" and base.metric_band:
            mean = base.metric_reference if base.metric_reference is not None else base.metric
            ax.axhspan(mean - base.metric_band, mean + base.metric_band, color="#999", alpha=0.25,
                       label="baseline noise band")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xticks(range(len(values)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel} per rung — {result.environment['device_name']}", fontsize=9)
        fig.tight_layout()
        path = Path(result.out_dir) / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
