"""--batch-size-search: the recommended recipe at larger batch sizes, reported apart from best.yaml (a larger
batch changes the optimization: steps per epoch, the learning rate it wants, which the user decides)."""
from __future__ import annotations

from typing import Any

from ..recipe import Recipe
from ..results import AblationResult, Rung, Status

BATCH_FACTORS = (2, 4, 8)


def batch_rungs(recipe: Recipe, train_size: int) -> list[Rung]:
    """The recommended recipe at its batch size and at 2x, 4x, 8x of it, while an epoch keeps at least two
    optimizer steps (a batch near the dataset's size would measure nothing but its last partial step)."""
    rungs = [Rung(f"batch-{recipe.batch_size}", {}, recipe)]
    for factor in BATCH_FACTORS:
        size = recipe.batch_size * factor
        if size * recipe.grad_accum_steps * 2 > train_size:
            break
        rungs.append(Rung(f"batch-{size}", {"batch_size": size}, recipe.replace(batch_size=size)))
    return rungs


def batch_finding(result: AblationResult) -> dict[str, Any]:
    """The largest batch that fits (its runs did not fail) and still gains: the ladder climbs from the
    recommended recipe's batch size while the next size is firmly faster in samples/s and keeps accuracy
    (the ablation's pick_best on a cumulative ladder); what each size measured, for the report."""
    rungs = result.rungs
    sizes = {r.name: {"batch_size": r.recipe.batch_size, "status": r.status, "speedup": r.result.speedup,
                      "speedup_interval": r.result.speedup_interval, "verdict": r.result.verdict_text,
                      "metric": r.result.metric, "metric_worse": r.result.metric_worse,
                      "peak_memory_bytes": r.result.peak_memory_bytes} for r in rungs}
    failed = [r.recipe.batch_size for r in rungs if r.status == Status.FAILED]
    return {"batch_size": result.best.batch_size if result.best else rungs[0].recipe.batch_size,
            "from": rungs[0].recipe.batch_size, "tie": result.tie, "does_not_fit_or_failed": failed, "sizes": sizes}
