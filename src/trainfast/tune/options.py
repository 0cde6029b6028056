"""How a search is run: everything `tune()` takes beside the work, checked when made, before any work starts."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..ablation import LadderOptions, TimingBudget
from ..ablation.work import check_measure
from ..defaults import TUNE_BUDGET_S
from ..recipe import RecipeError
from ..stats import MIN_EFFECT


@dataclass(frozen=True)
class TuneOptions:
    """out: the search's folder (default runs/tune-<timestamp>). amp_dtype: the half type of the precision
    levels ("auto": the device's fast one). repeats: every stage's passes. budget_s: the seconds the search
    plans within. planned_steps: the optimizer steps of the run the recipe is for (decides compile). timing:
    the steady steps each run is timed over. min_effect, resume, show: as the ablation's. switches: search
    only these. command, nproc, metric, goal: search on a user's own command (script_rungs: its own flags too).
    batch_size_search: afterwards, larger batches (reported apart). settle: passes added while a verdict is within
    the noise. paired: as the ablation's (LadderOptions)."""
    out: str | Path | None = None
    amp_dtype: str = "auto"
    repeats: int = 3
    budget_s: float = TUNE_BUDGET_S          # defaults.py: the CLI shows it before torch loads
    planned_steps: int | None = None
    timing: TimingBudget = field(default_factory=TimingBudget)
    min_effect: float = MIN_EFFECT
    resume: bool = False
    show: bool = True
    switches: list[str] | None = None
    command: Sequence[str] | None = None
    nproc: int = 1
    metric: str | None = None
    goal: str | None = None
    metric_pattern: str | None = None         # --metric-pattern: the metric read from the script's output
    batch_size_search: bool = False
    settle: bool = True
    paired: bool = False
    memory_limit: int | str | None = None     # bytes, or "2GiB": the search starts with its memory stage
    # --target (target.py): a last stage judges the rate pick and its batch sizes on their time to target
    target: Any = None
    track: Any = ()      # tracker names (track/): a parent run per search, a child per candidate
    # --rung / --ladder (scriptargs.CommandChange): the script's own flags, tried alone and combined (tune/script.py)
    script_rungs: Sequence[Any] = ()
    # time.monotonic() the budget counts from (the CLI: its process's start, tune/budget.py: process_started); None:
    # from tune()'s call
    started: float | None = None

    def __post_init__(self) -> None:
        if self.timing is None:
            object.__setattr__(self, "timing", TimingBudget())
        # Every stage is a ladder run `repeats` times with as many baseline seeds: checked as one here, and the
        # memory limit read as the ladders read it (bytes, or a size as written).
        ladder = LadderOptions(repeats=self.repeats, noise_seeds=self.repeats, budget=self.timing,
                               min_effect=self.min_effect, memory_limit=self.memory_limit, target=self.target,
                               track=self.track)
        object.__setattr__(self, "memory_limit", ladder.memory_limit)
        object.__setattr__(self, "target", ladder.target)
        check_measure("full", self.goal)
        if self.script_rungs and self.command is None:
            raise RecipeError("--rung: a rung of a script's own flags needs the script: trainfast tune --rung "
                              "NAME='ARGS' -- python train.py ...")
        if self.batch_size_search and self.command is not None:
            raise RecipeError("--batch-size-search: a script sets its own DataLoader batch size, which the recipe "
                              "cannot change; search it with the built-in run, or in the script")


def tune_options(options: dict[str, Any]) -> TuneOptions:
    """TuneOptions from tune()'s keyword arguments; an unknown one is refused with the names it can be."""
    known = {f.name for f in dataclasses.fields(TuneOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"tune(): unknown option(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    return TuneOptions(**options)
