"""The report's memory section: each rung's profiled step split by what holds the memory (measure/memory.py),
beside the run's measured peak, and what each switch moved against the baseline."""
from __future__ import annotations

from typing import Any

from ..measure.memory import largest, limit_peak, run_memory
from ..results import AblationResult, Rung
from ..techniques import memory_shrinkers
from .table import markdown_table

# The columns shown, in order: the three a switch aims at first, then what the step makes
SHOWN = (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer_state", "optimizer state"),
         ("activations", "activations"))



def rung_memory(rung: Rung) -> dict[str, Any] | None:
    return run_memory(rung.repeats)


def mib(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB" if value < 10 * 2**20 else f"{value / 2**20:,.0f} MiB"


def change(value: float, base: float | None) -> str:
    if not base:
        return ""
    return f" ({(value / base - 1) * 100:+.0f}%)" if abs(value / base - 1) >= 0.005 else ""


def limit_line(result: AblationResult) -> str | None:
    """With --memory-limit: which rungs were over it (measured and shown, never recommended)."""
    limit = result.settings.get("memory_limit")
    if not limit:
        return None
    peaks = {r.name: limit_peak(r) for r in result.rungs if r.repeats}
    over = [f"{name} ({mib(peak)})" if peak is not None else f"{name} (not measured)"
            for name, peak in peaks.items() if peak is None or peak > limit]
    fit = [name for name, peak in peaks.items() if peak is not None and peak <= limit]
    return (f"Memory limit {mib(limit)}: " + (f"over it, never recommended: {', '.join(over)}" if over
                                               else "every rung fits") +
            (f"; within it: {', '.join(fit)}." if over and fit else "." if not over else "; none fits."))


def memory_section(result: AblationResult) -> list[str]:
    """`## Memory`: a row per rung with a profiled step, and the memory limit's verdicts; nothing when there is
    neither (a script without a Session, no limit)."""
    found = [(rung, memory) for rung in result.rungs if (memory := rung_memory(rung))]
    limit = limit_line(result)
    if not found:
        return ["## Memory", "", limit, ""] if limit else []
    base = rung_memory(result.rungs[0]) or {}
    rows = []
    for rung, memory in found:
        at = memory["at_peak"]
        item, _ = largest(memory)
        peak = rung.result.peak_memory_bytes
        rows.append([rung.name, mib(peak) if peak else "—",
                     mib(memory["peak_bytes"]) + change(memory["peak_bytes"], base.get("peak_bytes")),
                     *(mib(at[key]) + change(at[key], base.get("at_peak", {}).get(key)) for key, _ in SHOWN),
                     mib(memory["highest"]["activations"]),
                     mib(at["inputs"] + at["temporaries"] + at["other"]), item.replace("_", " ")])
    headers = ["rung", "run's peak", "step's peak", *(label for _, label in SHOWN), "activations' own highest",
               "inputs and the rest", "largest"]
    first = found[0][1]
    item, held = largest(first)
    lines = ["## Memory", "",
             f"Step {first['step'] + 1} of each run profiled by what holds the memory (torch.profiler's memory "
             "profile; parameters, gradients, optimizer state and activations at the step's peak, each change "
             "against the baseline's). The run's peak is the whole process's (on a CPU its resident set, the "
             "Python runtime and libraries included).", "",
             markdown_table(headers, rows), "", *([limit, ""] if limit else [])]
    if result.rungs[0] is found[0][0]:
        lines += [f"The baseline's largest item is its {item.replace('_', ' ')} ({mib(held)} at the step's peak): "
                  f"{memory_shrinkers().get(item, 'no single switch')} would shrink it.", ""]
    return lines
