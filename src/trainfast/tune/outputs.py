"""What a search writes: best.yaml (a recipe `trainfast train --recipe best.yaml` takes as is), tune.json and
tune.md (each stage's table, what was left out of the recipe and why, the notes)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..ablation.store import write_json
from ..checks.findings import INPUT_BOUND_SHARE
from ..results import AblationResult
from .combine import Decision
from .script import command_line


def write_outputs(out_dir: Path, decision: Decision, singles: AblationResult, combined: AblationResult | None,
                  seconds: float, budget_s: float, planned_steps: int | None,
                  on_level: AblationResult | None = None, batch: AblationResult | None = None,
                  inputs: list[AblationResult] | None = None, target: AblationResult | None = None) -> None:
    import yaml

    from ..checkpoint import atomic_write_text

    atomic_write_text(out_dir / "best.yaml", "# trainfast tune: the recommended recipe (trainfast train --recipe "
                      "best.yaml)\n" + yaml.safe_dump(decision.recipe.to_dict(), sort_keys=False))
    data = {"recommended": decision.name, "recipe": decision.recipe.to_dict(), "speedup": decision.speedup,
            "speedup_interval": decision.speedup_interval, "combined": decision.combined,
            "dropped": decision.dropped, "notes": decision.notes, "search_seconds": seconds, "budget_seconds": budget_s,
            "planned_steps": planned_steps, "singles": summary(singles), "on_level": summary(on_level),
            "combine": summary(combined), "input": [summary(r) for r in inputs or []],
            "batch_search": decision.batch,
            "to_target": ({r.name: r.result.to_target for r in target.rungs if r.result.to_target}
                          if target is not None else None),
            # the script's own flags it holds (--rung): the command line that runs the recipe
            **({"command": decision.script["command"], "command_env": decision.script["command_env"]}
               if decision.script else {})}
    write_json(out_dir / "tune.json", data)
    lines = tune_md(decision, singles, combined, seconds, budget_s, planned_steps, on_level, batch, inputs or [])
    if target is not None:          # the candidates' time to target, its factors and the verdicts
        from ..report.target import target_section

        lines += target_section(target, [])
    (out_dir / "tune.md").write_text("\n".join(lines) + "\n")


def summary(result: AblationResult | None) -> dict[str, Any]:
    """A stage's rungs as tune.json gives them: each one's status, switches, verdict, speed-up and judged metric."""
    return {r.name: {"status": r.status, "changes": r.changes, "verdict": r.result.verdict,
                     "speedup": r.result.speedup, "speedup_interval": r.result.speedup_interval,
                     "firm": r.result.firm, "metric": r.result.metric,
                     "metric_worse": r.result.metric_worse}
            for r in (result.rungs if result else [])}


def tune_md(decision: Decision, singles: AblationResult, combined: AblationResult | None, seconds: float,
            budget_s: float, planned_steps: int | None, on_level: AblationResult | None,
            batch: AblationResult | None, inputs: list[AblationResult]) -> list[str]:
    """tune.md's lines: the recommendation, each stage's table, what is not in the recipe and the notes."""
    from ..report import headers, markdown_table, table_rows

    # the work's own rate unit and metric (tokens/s and val loss for a language model, a script's metric)
    columns = stage_columns(singles, "each")
    lines = ["# trainfast tune", "",
             f"Recommended: **{decision.name}**, {decision.headline()}, written to [best.yaml](best.yaml). The "
             f"search took {seconds:.0f} s (budget {budget_s:.0f} s); planned run: {planned_steps} optimizer steps.",
             *([f"It holds the script's own flags: run `{command_line(decision.script)}`."] if decision.script else []),
             "",
             "## Each switch alone (stage 1)", "", markdown_table(headers(columns), table_rows(singles.rungs, columns)),
             "", "Details: [singles/report.md](singles/report.md).", ""]
    if on_level is not None:
        lines += [f"## On top of {on_level.rungs[0].name.removeprefix('on-')} (stage 1b)", "",
                  "Every other switch again, against the precision level alone.", "",
                  markdown_table(headers(columns), table_rows(on_level.rungs, columns)), "",
                  "Details: [on-level/report.md](on-level/report.md).", ""]
    if combined is not None:
        lines += ["## Together (stage 2)", "", f"Combined: {', '.join(decision.combined)}; the best single switch "
                  "and the combination without each switch in turn, against the same baseline.", "",
                  markdown_table(headers(columns), table_rows(combined.rungs, columns)), "",
                  "Details: [combine/report.md](combine/report.md).", ""]
    for result in inputs:
        stage = result.settings.get("stage", "input")
        lines += [f"## Held by its input: the input switches on top of it (stage 3, {stage}/)", "",
                  f"The recommended recipe waited for its batches {INPUT_BOUND_SHARE:.0%} of each step or more: each "
                  "input switch on top of it, against it.", "",
                  markdown_table(headers(columns), table_rows(result.rungs, columns)), "",
                  f"Details: [{stage}/report.md]({stage}/report.md).", ""]
    if batch is not None and decision.batch is not None:
        lines += batch_section(decision.batch, batch)
    lines += ["## Not in the recipe", ""] + [f"- **{name}**: {why}" for name, why in decision.dropped.items()]
    if decision.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in decision.notes]
    return lines


def stage_columns(result, mode: str):
    """The table columns of a stage's result: its work's rate unit and judged metric (tokens/s and val loss for a
    language model, a script's own metric), in `mode`."""
    from ..report import Columns

    return Columns.for_settings({**(getattr(result, "settings", None) or {}), "mode": mode}, result.rungs,
                                getattr(result, "metric", None))


def batch_section(found: dict[str, Any], batch: AblationResult) -> list[str]:
    """tune.md's section on --batch-size-search: the size found, the advice, the sizes' table."""
    from ..report import headers, markdown_table, table_rows

    advice = (f"batch size {found['batch_size']} is the largest that was still firmly faster and kept "
              f"accuracy: `trainfast train --recipe best.yaml --batch-size {found['batch_size']}` (a larger batch "
              "takes fewer steps an epoch and usually wants a larger learning rate: check the accuracy at "
              "your full length)" if found["batch_size"] != found["from"] else
              f"no larger batch was firmly faster with accuracy kept: batch size {found['from']} stays")
    columns = stage_columns(batch, "cumulative")
    return ["## Larger batches (reported apart: not in best.yaml)", "",
            "The recommended recipe at larger batch sizes, each against the size above it (a cumulative "
            f"ladder); accuracy after the same epochs. {advice}.", "",
            markdown_table(headers(columns), table_rows(batch.rungs, columns)),
            "", "Details: [batch/report.md](batch/report.md).", ""]
