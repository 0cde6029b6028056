"""The ablation table, one row per rung, shared by the live display, report.md and tune's report."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..results import EffectLabel, Rung, RungResult, Status
from ..scriptargs import UNCHANGED
from ..techniques.precision import not_run_text
from .recompiled import not_a_measurement
from .format import (TOO_FEW, fmt_bytes, fmt_rate, fmt_sig, fmt_speedup, readable, repeats_needed, rung_label,
                     short_verdict)


@dataclass(frozen=True)
class Columns:
    """What the ablation table shows: the built-in run's epoch time and held-out accuracy, or for a user's
    script (`ablate -- COMMAND`) its run time, the metric it reported and its rate unit (steps/s when the
    samples of a step are unknown)."""
    cumulative: bool = True
    unit: str = "samples/s"
    time_label: str = "epoch s"
    time_key: str = "epoch_time_s"
    metric_label: str = "val acc"
    step_alone: bool = True       # the built-in run's step alone (a user's script has no step to replay)

    @classmethod
    def for_settings(cls, settings: dict[str, Any], rungs: list[Rung] | None = None,
                     judged: dict[str, Any] | None = None) -> "Columns":
        """The columns of a ladder's table. `judged`: the metric its runs are judged on (AblationResult.metric,
        the ablation's one choice), which names a script's metric column."""
        cumulative = settings.get("mode", "cumulative") == "cumulative"
        if not settings.get("command"):
            # The task's rate unit (lm: tokens/s) and its metric's column (detection: mAP), else the judged name
            label = settings.get("metric_label") or (judged or {}).get("name") or cls.metric_label
            return cls(cumulative, settings.get("rate_unit", cls.unit), metric_label=label)
        units = {run.get("rate_unit") for r in rungs or [] for run in r.repeats}
        metric = settings.get("metric") or {}
        name = (judged or {}).get("name") or metric.get("name")
        unit = "steps/s" if "steps/s" in units else "tokens/s" if units == {"tokens/s"} else "samples/s"
        return cls(cumulative, unit, "run s", "wall_s",
                   name if settings.get("measure") == "full" and name else "metric", step_alone=False)


def judged_name(result) -> str:
    """The judged metric's name as the result records it (AblationResult.metric, results.json's `metric`): accuracy,
    mAP, validation loss, a script's own; the task's (settings) for a result that recorded none."""
    return (result.metric or {}).get("name") or result.settings.get("metric_name") or "accuracy"


def headers(columns: Columns = Columns()) -> list[str]:
    cols = ["rung", f"{columns.unit} (± 95% CI)", "speed-up (95% CI)", "verdict vs baseline"]
    if columns.cumulative:
        cols.append("vs rung above")
    if columns.step_alone:
        cols.append("step alone (vs baseline's), epoch's share")
    return cols + [columns.time_label, "peak memory", f"{columns.metric_label} (Δ)", "% of matmul peak"]


def table_rows(rungs: list[Rung], columns: Columns = Columns()) -> list[list[str]]:
    """The ablation table's rows: a measured rung's numbers, or in words why a rung has none."""
    width = len(headers(columns))
    rows = []
    for rung in rungs:
        why = unmeasured_text(rung)
        if why is not None:
            rows.append([rung_label(rung), why] + ["—"] * (width - 2))
        elif not rung.repeats or not rung.result.repeats:
            rows.append([rung_label(rung), str(rung.status)] + [""] * (width - 2))
        else:
            rows.append(measured_row(rung, columns))
    return rows


def unmeasured_text(rung: Rung) -> str | None:
    """Why a rung has no numbers (ruled out, failed, cut by the time budget); None for one that has or will."""
    if rung.status == Status.NO_EFFECT:
        if rung.effect == EffectLabel.NO_SESSION:        # the same reason on every such rung: given once in the notes
            return "no effect: the script has no trainfast.Session (see notes)"
        if rung.effect == EffectLabel.NOT_APPLICABLE:
            return "not applicable: " + short(rung.reason)
        if rung.effect == EffectLabel.NOT_APPLIED:
            return "not applied: " + short(rung.reason)
        if rung.effect == EffectLabel.SLOW_HALF:
            return not_run_text(rung.reason)
        return "no effect on this device"
    if rung.status == Status.FAILED:
        return "failed: " + (rung.result.error or "")[:60]
    if rung.status == Status.SKIPPED:
        return "skipped: not in the time budget"
    return None


def short(reason: str, width: int = 64) -> str:
    """A reason cut to fit a table cell; report.md's notes give it whole."""
    return reason if len(reason) <= width else reason[:width - 12].rstrip(" ,;:") + "… (see notes)"


def above_verdict(r: RungResult) -> str:
    """The verdict against the rung above (a cumulative ladder's `vs rung above`), in a few words."""
    above = r.vs_previous or {}
    return short_verdict(above.get("verdict"), above.get("speedup"), above.get("firm", True))


def measured_row(rung: Rung, columns: Columns) -> list[str]:
    r = rung.result
    baseline = rung.name == "baseline"
    verdict = "reference" if baseline else short_verdict(r.verdict, r.speedup, r.is_firm)
    if not_a_measurement(rung.repeats):      # recompiled in its timed steps, its repeat too (see notes)
        verdict = "not a measurement: recompiled in its timed steps"
    if rung.status != Status.DONE:
        verdict += f" (so far: {len(rung.repeats)} repeat(s))"
    if rung.script.get("unchanged"):          # a --rung observed doing what the rung above did (script_rungs.py)
        verdict += f"; {UNCHANGED}"
    acc = "—" if r.metric is None else f"{r.metric:.3f}"
    if not baseline and r.metric_delta is not None:
        acc += f" ({r.metric_delta:+.3f}{' !' if r.metric_flag else ''})"
    frac = "—" if r.ceiling_fraction is None else f"{100 * r.ceiling_fraction:.1f}%"
    mem = fmt_bytes(r.peak_memory_bytes)
    if r.memory_ratio and not baseline:
        mem += f" ({r.memory_ratio:.2f}x)"
    documents = f" ({fmt_sig(r.documents_per_s)} documents/s)" if r.documents_per_s else ""
    if readable(r):
        row = [rung_label(rung), fmt_rate(r.throughput, r.throughput_spread) + documents,
               fmt_speedup(r.speedup, r.speedup_interval), verdict]
    else:            # a bound from one degree of freedom (±12,357 around 120): not printed as if it meant something
        row = [rung_label(rung), f"{fmt_sig(r.throughput)} ({TOO_FEW})",
               "1.00x" if baseline else f"{r.speedup:.2f}x ({TOO_FEW}{repeats_needed(r)})", verdict]
    if columns.cumulative:
        row.append(above_verdict(r))
    if columns.step_alone:
        row.append(step_alone_text(r))
    seconds = getattr(r, columns.time_key)
    return row + ["—" if seconds is None else f"{seconds:.1f}", mem, acc, frac]


def step_alone_text(r: RungResult) -> str:
    """'2,150 (2.61x), epoch 41%': the step alone's rate, its speed-up over the baseline's step alone, and the
    share of it the epoch reached (near 100%: the step holds the epoch; well under: the input does). An epoch
    cannot outrun its own step: a share above 100% is the two timings' noise, said as such (epoch_share_text)."""
    if not r.step_alone:
        return "—"
    speedup = f" ({r.step_alone_speedup:.2f}x)" if r.step_alone_speedup else ""
    share = f", {epoch_share_text(r)}" if r.epoch_of_step else ""
    return fmt_rate(r.step_alone) + speedup + share


EPOCH_ABOVE_STEP = 0.05   # with no noise estimate (one repeat), an epoch up to this far above its step alone is noise


def epoch_share_text(r: RungResult) -> str:
    """'epoch 41%', or for an epoch timed faster than its step alone, 'epoch at its step alone (within the noise)'
    when the excess is inside the runs' noise, and 'epoch at its step alone (the two timings disagree: rerun)'
    past it; never a share above 100%."""
    import math

    share = r.epoch_of_step
    if share <= 1.0:
        return f"epoch {100 * share:.0f}%"
    sigma = (r.noise or {}).get("sigma_log")
    # the epoch's rate and the step alone's are each a mean over the repeats, each with the runs' noise
    allowed = 2 * math.sqrt(2 / max(1, r.repeats)) * sigma if sigma else math.log1p(EPOCH_ABOVE_STEP)
    if math.log(share) <= allowed:
        return "epoch at its step alone (within the noise)"
    return "epoch at its step alone (the two timings disagree: rerun)"


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)
