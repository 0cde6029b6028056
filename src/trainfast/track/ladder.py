"""An ablation's trackers, as its loop (ablation/loop.py) feeds them: the parent opened with the ladder, each rung's
figures after every run is judged (results.json's entries, report/results_json.py: the same numbers, never measured
again), the whole result and the report folder at the end. A script's own tracker client is told, in each run's
environment, the child its runs belong under."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..report.results_json import results_dict, rung_dict
from ..results import AblationResult, Rung
from .figures import SETTING_KEYS, rung_params
from .tracking import Tracking


class LadderTracking:
    """One ladder's feed into a Tracking (its own, or a tune's stage view)."""

    def __init__(self, tracking: Tracking, plan: list[Rung]) -> None:
        self.tracking, self.plan = tracking, plan

    @classmethod
    def open(cls, track: Any, plan: list[Rung], settings: dict[str, Any], out_dir: Path) -> LadderTracking | None:
        """`track`: tracker names (this ablation's own group, named after its folder), an open Tracking (a tune's:
        this ladder is one of its stages, named after its folder), or nothing."""
        if isinstance(track, Tracking):
            return cls(track.stage(Path(out_dir).name), plan)
        params = {k: settings[k] for k in SETTING_KEYS if settings.get(k) is not None}
        tracking = Tracking.open(tuple(track or ()), Path(out_dir).name, "ablation", params, out_dir)
        return cls(tracking, plan) if tracking is not None else None

    def base(self) -> dict[str, Any]:
        return self.plan[0].recipe.to_dict()

    def run_env(self, rung: Rung) -> dict[str, str]:
        """The variables a run of `rung` adds to its environment, so that a script logging to a tracker itself
        files its run under the rung's child."""
        return self.tracking.child_env(rung.name, rung_params(rung_dict(rung), self.base()))

    def judged(self, plan: list[Rung], metric: dict[str, Any] | None) -> None:
        """After a run was scored: the rungs whose figures changed."""
        self.tracking.rungs([rung_dict(r, metric) for r in plan], self.base())

    def finish(self, result: AblationResult, interrupted: bool) -> None:
        """The scored ladder and its report folder; the runs closed (killed when interrupted)."""
        self.tracking.results(results_dict(result), Path(result.out_dir))
        self.tracking.end("killed" if interrupted else "finished")
