"""The report's world-size part (`ablate --nproc 1,2`): a table per process count, each rung's job rate, its rate per
rank, its scaling efficiency against the smallest size with its interval, and with a target its time to target beside
the smallest size's (ablation/scaling.py says how each is measured). Read from results.json's `settings.world`."""
from __future__ import annotations

from typing import Any

from ..results import AblationResult
from .format import fmt_sig
from .table import markdown_table
from .target import ratio, seconds

HEADERS = ["rung", "job rate", "per rank", "each rank's own", "efficiency (95% CI)", "job rate vs smallest",
           "time to target", "vs smallest (95% CI)", "verdict on time"]


def world_of(result: AblationResult) -> dict[str, Any] | None:
    return (result.settings or {}).get("world")


def efficiency_text(row: dict[str, Any]) -> str:
    value, interval = row.get("efficiency"), row.get("efficiency_interval")
    if value is None:
        return "—"
    text = f"{100 * value:.0f}%"
    if interval:
        text += f" ({100 * interval[0]:.0f}–{100 * interval[1]:.0f}%)"
    return text


def size_rows(entry: dict[str, Any], smallest: int) -> list[list[str]]:
    rows = []
    for row in entry["rungs"]:
        own = [r for r in row.get("rank_rates") or [] if r is not None]
        target = row.get("to_target") or {}
        versus = row.get("vs_reference_target") or {}
        reference = entry["nproc"] == smallest
        rows.append([
            row["rung"], fmt_sig(row.get("throughput")) if row.get("throughput") else row["status"],
            fmt_sig(row.get("per_rank")) if row.get("per_rank") else "—",
            f"{fmt_sig(min(own))}–{fmt_sig(max(own))}" if own else "—",
            "reference" if reference and row.get("throughput") else efficiency_text(row),
            "1.00x" if reference and row.get("throughput") else ratio(row.get("speedup"), row.get("speedup_interval")),
            seconds(target.get("time_s")) if target else "—",
            "1.00x" if reference and target else ratio(versus.get("speedup"), versus.get("interval")) if versus
            else "—",
            "reference" if reference and target else versus.get("verdict", "—")])
    return rows


def explanation(world: dict[str, Any], unit: str) -> str:
    smallest = world["reference"]
    target = world.get("target") or {}
    parts = [f"The same ladder at {', '.join(map(str, world['sizes']))} processes, interleaved a run of each size",
             f"in turn. Job rate: every rank's {unit}/s together; per rank: the job's over its ranks; each rank's own:",
             "the lowest and highest of the ranks' own rates (the Ranks section of each size's report). Efficiency:",
             f"the job's rate over (N / {smallest}) times the same rung's at {smallest} process(es) (100%: perfect",
             "scaling), its interval from the repeats."]
    if target.get("value") is not None:
        parts += [f"Time to target ({target.get('name')} {'<=' if target.get('goal') == 'min' else '>='}",
                  f"{target['value']:g}, the smallest size's level for every size): more processes at the same batch",
                  "per process make a larger global batch, another math, so each size is judged on its own time to",
                  f"target against the same rung at {smallest} (a time ratio above 1: sooner), with its bootstrap",
                  "interval over seeds."]
    return " ".join(parts)


def world_section(result: AblationResult) -> list[str]:
    """`## World size`, in an ablation of several process counts; nothing otherwise."""
    world = world_of(result)
    if not world:
        return []
    unit = result.rungs[0].result.unit or "samples"
    lines = ["## World size", "", explanation(world, unit), ""]
    for entry in world["by_size"]:
        folder = entry.get("folder", ".")
        where = "this folder" if folder == "." else f"[{folder}/report.md]({folder}/report.md)"
        lines += [f"### {entry['nproc']} process{'es' if entry['nproc'] > 1 else ''} ({where})", "",
                  markdown_table(HEADERS, size_rows(entry, world["reference"])), ""]
    if world.get("not_run"):
        lines += [f"Not run: {', '.join(map(str, world['not_run']))} processes (the ablation ended first).", ""]
    return lines


def console_table(result: AblationResult):
    """The sizes side by side as one rich Table for the terminal (a row per rung and size), or None."""
    world = world_of(result)
    if not world:
        return None
    from rich.table import Table

    table = Table(title="world size: each rung at each process count, against the smallest")
    for header in ["nproc", *HEADERS]:
        table.add_column(header, justify="left" if header == "rung" else "right")
    for entry in world["by_size"]:
        for row in size_rows(entry, world["reference"]):
            table.add_row(str(entry["nproc"]), *row)
    return table
