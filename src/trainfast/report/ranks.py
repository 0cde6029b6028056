"""The report's per-rank section for a distributed ablation: each rung's ranks, side by side, and its straggler line
(measure/ranks.py says what each figure means and how a straggler is judged)."""
from __future__ import annotations

from typing import Any

from ..results import AblationResult, Status
from .format import rung_label

HEADERS = ("rank", "rate", "step ms", "data ms", "compute ms", "collective ms", "waited ms", "DDP exposed comm ms")


def ms(value: float | None) -> str:
    return "—" if value is None else f"{1000 * value:.1f}"


def rank_row(figures: dict[str, Any]) -> str:
    ddp = figures.get("ddp") or {}
    rate = figures.get("rate")
    cells = (str(figures["rank"]), "—" if rate is None else f"{rate:,.1f}", ms(figures.get("step_s")),
             ms(figures.get("data_s")), ms(figures.get("compute_s")), ms(figures.get("collective_s")),
             ms(figures.get("waited_s")), ms(ddp.get("exposed_comm_s")))
    return "| " + " | ".join(cells) + " |"


def ranks_section(result: AblationResult) -> list[str]:
    """`## Ranks`, where a rung ran as several processes and its ranks were measured; nothing otherwise."""
    measured = [r for r in result.rungs if r.status == Status.DONE and r.result.ranks]
    if not measured:
        return []
    unit = result.settings.get("rate_unit") or measured[0].result.rate_unit or "samples/s"
    lines = ["## Ranks", "",
             "Each rank's own work per step, outside the collectives (medians over its timed steps, averaged over the "
             f"repeats): its rate ({unit} of its own batches), its wait for data, its compute (training forward and "
             "optimizer step), the rest of its step (the backward with the gradient all-reduce), how much longer than "
             "the quickest rank it spent there (waiting for the others), and DDP's own exposed communication (its "
             "sampled backward communication not overlapped with compute). A rank is called slow only when its own "
             "time exceeds the others' by the stated share of a step and beyond the step-to-step noise, in every "
             "repeat.", ""]
    for rung in measured:
        ranks = rung.result.ranks
        lines += [f"**{rung_label(rung)}**: {ranks['line']}.", "",
                  "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS),
                  *(rank_row(f) for f in ranks["ranks"]), ""]
    return lines
