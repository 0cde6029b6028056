"""A search in the trackers (--track): one parent run per search, its options as params; each stage's candidates
as its children (named stage/candidate: the stage's ladder feeds them, track/ladder.py); the recommendation, its
speed-up with its interval, and best.yaml, tune.md and tune.json at the end."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..track import Tracking
from ..track.names import check_names
from .combine import Decision
from .options import TuneOptions

# The options that identify a search on its parent run (the rest are in tune.json)
PARAMS = ("budget_s", "repeats", "amp_dtype", "planned_steps", "min_effect", "memory_limit", "target", "switches",
          "command", "nproc", "metric", "batch_size_search")


def open_tracking(opts: TuneOptions, out_dir: Path, settings: dict[str, Any]) -> Tracking | None:
    """The search's parent in each tracker asked for (None: none); `settings`: the work's (model, data, task)."""
    options = dataclasses.asdict(opts)
    params = {**settings, **{k: options[k] for k in PARAMS if options.get(k) not in (None, False)}}
    return Tracking.open(check_names(opts.track), Path(out_dir).name, "tune", params, out_dir)


def finish_tracking(tracking: Tracking | None, decision: Decision, out_dir: Path) -> None:
    """The recommendation on the parent, the search's files kept with it, every run closed."""
    if tracking is None:
        return
    metrics = {"speedup": decision.speedup}
    if decision.speedup_interval:
        metrics["speedup_low"], metrics["speedup_high"] = decision.speedup_interval
    tracking.log(metrics, {"recommended": decision.name, "headline": decision.headline(),
                           "switches": ", ".join(decision.combined or [decision.name])})
    tracking.artifacts(out_dir)
    tracking.end()
