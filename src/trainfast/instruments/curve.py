"""A script's curve: a point at each evaluation the script makes, read where it already reports it (a Session's
`tf.report(...)`, a Trainer's evaluate() with eval_strategy="steps", values given to Accelerate's log), with no
change to the script. target.py says what a point holds.

A point's training time is the run's steps' own: the step clock restarts when the evaluation is reported, so the
time between the last optimizer step and the report (the script's evaluation) belongs to no step, and neither the
curve nor the rate counts it. Its samples are what the run's rate counts: a token script's real tokens
(instruments/batches.py), else the samples its loader gave, else its steps times the samples a framework says one
holds, else its steps.
"""
from __future__ import annotations

import math
from typing import Any

from ..target import Target, point_value


class ScriptCurve:
    """The points of one run, and its stop past the cap. A script that reaches the target runs on to its own end:
    its rate is timed over its whole run (a token script's: probe.Probe.whole_run), the same documents in every
    rung, which a stop at the target would cut short; its time to target is read off its curve all the same."""

    def __init__(self, target: dict[str, Any] | None = None, cap_seen: float | None = None) -> None:
        self.target = Target.from_dict(target)
        self.cap_seen = cap_seen
        self.points: list[dict[str, Any]] = []
        self.stopped: str | None = None
        self.reached = False

    def add(self, probe, metrics: dict[str, Any]) -> bool:
        """A point for `metrics` (numbers only) at the run's step now; whether the run should stop here. Values
        reported at the same step join one point (a script reporting its loss and its accuracy in two calls). An
        evaluation before the first step (a script's look at its untrained model) is no point: nothing trained.
        Without a target (a run not under --target) nothing is recorded."""
        if self.target is None:          # no --target: the run records no curve, and its clock is left alone
            return False
        timer = probe.timer
        values = {k: float(v) for k, v in metrics.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if timer is None or not timer.updates or not values:
            return False
        steps = timer.restart()              # what ran since the last step (the evaluation) belongs to no step
        if self.points and self.points[-1]["step"] == timer.updates:
            self.points[-1]["metrics"].update(values)
        else:
            self.points.append({"step": timer.updates, "seen": seen(probe, steps),
                                "train_s": sum(s.seconds for s in steps), "metrics": values})
        return self.judge(self.points[-1])

    def judge(self, point: dict[str, Any]) -> bool:
        """Whether the run stops here: past its cap without having reached the target."""
        if self.target.known and self.target.reached(point_value(point, self.target.name)):
            self.reached = True
        if not self.reached and self.cap_seen is not None and point["seen"] >= self.cap_seen:
            self.stopped = "cap"
        return self.stopped is not None

    def record(self) -> dict[str, Any]:
        if not self.points:
            return {}
        return {"curve": self.points, "curve_stopped": self.stopped or ("reached" if self.reached else "end"),
                "curve_target": self.target.to_dict() if self.target is not None else None}


def seen(probe, steps) -> int:
    """What the run's rate counts, over `steps` (every step so far), on every rank together."""
    tokens = probe.batches.step_tokens(len(steps)) if probe.batches is not None else None
    if tokens is not None:
        count = sum(tokens)
    elif any(s.samples for s in steps):
        count = sum(s.samples for s in steps)
    else:
        count = len(steps) * (probe.samples_per_step() or 1)
    return count * probe.world_size
