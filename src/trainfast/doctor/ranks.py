"""The doctor on a script of several ranks (`trainfast doctor --nproc N -- python train.py`): each rank times its own
forward and optimizer step beside the Watch's step clock and data waits, and when the watched steps end (every rank
at the same step) their figures are gathered over the script's own process group and judged as the ablation judges
them (measure/ranks.py): the straggler check reads the result (checks/ranks.py)."""
from __future__ import annotations

import os
from typing import Any

from ..measure import detect_warmup
from ..measure.ranks import judge_ranks, rank_figures
from ..probe.ranks import PhaseClock, all_gather_objects


def start_rank_clock() -> PhaseClock | None:
    """A phase clock in a rank of a torchrun job (None in one process): global hooks, each step closing itself."""
    return PhaseClock(None, closes=True) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None


def gather_watched_ranks(watch, clock: PhaseClock | None) -> dict[str, Any] | None:
    """Called by every rank as its watched steps end: every rank's figures over the steps the doctor times (after
    the sync window and the warm-up, as loop.loop_observations cuts them), judged. None in one process, or where
    the process group is gone."""
    import torch.distributed as dist

    if clock is None or not (dist.is_available() and dist.is_initialized()):
        return None
    clock.close_step()                    # the last watched step: its optimizer is still in its post-hooks
    start, steps = watch.sync_window[1], watch.clock
    ends = steps.step_ends[start - 1:] if len(steps.step_ends) >= start else []
    seconds = [b - a for a, b in zip(ends, ends[1:])]
    warmup = detect_warmup(seconds, min_skip=0) if seconds else 0
    first = start + warmup
    waits = steps.waits()[first:] if steps.num_workers is not None else [0.0] * len(seconds[warmup:])
    mine = rank_figures(int(os.environ.get("RANK", "0")), seconds[warmup:], waits, clock.forward_s[first:],
                        clock.optimizer_s[first:], steps.step_samples[first:])
    clock.remove()
    return judge_ranks(all_gather_objects(mine))
