"""DataLoader worker processes (`num_workers`, `persistent_workers`, `prefetch_factor`): samples are read,
decoded and augmented in other processes while the step computes, so a step waits for its input only when the
workers fall behind. They pay where the batch is made per sample (decoded files, augmentation) and cost a
process start per epoch (unless persistent) and the cores they take from the step. "auto" picks the fastest of a
short measurement (data/loader.py: resolve_num_workers). The workers belong to the process: their rung is never
timed beside the baseline in one process (a live iterator's workers keep decoding while the other run steps)."""
from __future__ import annotations

from typing import Any

from .switch import RungSpec, Switch


def worker_counts(current: int, available: int) -> list[int]:
    """More loader workers to try: twice the current count (two for none) and one a CPU, each above the current
    count and within the CPUs. One worker a CPU is the most that decode in parallel; the doubling finds the
    knee below it, where the workers' memory and fork cost is not yet spent for nothing."""
    return sorted({n for n in (2 * current or 2, available) if current < n <= available})


def more_workers(recipe, cpus: int) -> list[tuple[str, dict[str, Any]]]:
    """The tune's input stage: a rung for each worker count worth trying on top of `recipe` (none for "auto",
    which measures its own). Across epochs a fresh pool of workers is forked and filled again at each epoch's
    start: kept (persistent) when there is more than one."""
    if not isinstance(recipe.num_workers, int):
        return []
    return [(f"workers-{n}", {"num_workers": n, **({"persistent_workers": True} if recipe.epochs > 1 else {})})
            for n in worker_counts(recipe.num_workers, cpus)]


SWITCHES = (
    Switch(("num_workers", "persistent_workers", "prefetch_factor"),
           rungs=(RungSpec("workers", {"num_workers": 2}, place=43, places={"detection": 26},
                           held_note=(1, "loader workers (--num-workers)"),
                           default_in=("detection",), tune_inputs=3, tune_changes=more_workers),),
           own_process=True, observed="loader",
           # persistent workers keep their random streams across epochs: a resume that changes it changes the
           # augmentation, so it is not among the resumable fields
           resumable=("num_workers", "prefetch_factor"),
           frameworks={"transformers": "TrainingArguments.dataloader_num_workers (and _persistent_workers, "
                                       "_prefetch_factor)",
                       "lightning": "the training DataLoader, rebuilt",
                       "accelerate": "the training DataLoader, rebuilt before prepare()"}),
)
