"""The built-in run's way to a target: evaluations on a schedule during training, each a point of its curve
(target.py says what a point holds), and the stop once the target is reached or the run's cap is spent.

The evaluation runs between two optimizer updates, on the validation batches the final evaluation uses; the
step clock restarts after it (StepTimer: whatever runs between two steps belongs to no step), so a point's
training time is the steps' own (compilation and input waits included, evaluation excluded) and the rate the
probe times over those steps is untouched by it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import takewhile
from typing import Any, Callable, Iterable

from .target import Target, point_value

EVALS = 16              # evaluations over the planned run (its epochs): the curve's resolution
# A run stops, not reaching the target, once it has seen this many times the baseline's samples to target: a
# batch k times larger may need up to k times the samples (its steps, not its samples, did the work), so the cap
# must leave room for a 4x batch to be measured, not cut. Counted in samples, not seconds: a compiled run pays its
# compilation first and is still measured, its time to target counting it.
CAP_FACTOR = 6.0
MAX_RUN_FACTOR = 6      # ... and whatever the time, at this many times its planned epochs
# Before auto's level is known (the baseline's runs, which set it): each trains this many times its planned steps,
# the level read at its planned end. The seeds that end above the median (half of them, by construction) would
# otherwise count as never reaching it, and every interval against the baseline would be open on one side.
AUTO_EXTEND = 1.5


@dataclass(frozen=True)
class CurvePlan:
    """How a run evaluates on its way: `evals` points over its planned epochs; `target`: stop at the first point
    that reaches it (auto not yet resolved: AUTO_EXTEND times the planned updates, the baseline that sets it);
    `cap_seen`: samples (the rate's unit) after which a run that has not reached it stops; `max_factor`: with a
    known target, the most updates a run trains, as a multiple of its planned ones (train: 1, its epochs are the
    user's)."""
    evals: int = EVALS
    target: Target | None = None
    cap_seen: float | None = None
    max_factor: float = MAX_RUN_FACTOR      # a known target: at most this many times the planned updates

    @property
    def stops(self) -> bool:
        return self.target is not None and self.target.known


def judged_name(task) -> str:
    """The key a built-in point keeps its task's judged metric under: val_accuracy, val_loss, val_map."""
    return {"accuracy": "val_accuracy", "validation loss": "val_loss", "mAP": "val_map"}.get(task.metric.name,
                                                                                            task.metric.name)


class BuiltinCurve:
    """One built-in run's curve (module docstring). `after_step` is the loop's hook; `batches` ends a pass once the
    run is done; `more()` says whether another pass is due."""

    def __init__(self, run, plan: CurvePlan) -> None:
        self.run, self.plan = run, plan
        planned = max(1, len(run.train_batches) * run.recipe.epochs // max(1, run.recipe.grad_accum_steps))
        self.planned = planned                                          # the planned run's optimizer updates
        self.every = max(1, round(planned / max(1, plan.evals)))       # optimizer updates between evaluations
        # auto before its level is known: AUTO_EXTEND times the planned updates; a known target: max_factor times
        self.limit = math.ceil(planned * (plan.max_factor if plan.stops else AUTO_EXTEND))
        self.points: list[dict[str, Any]] = []
        self.stopped: str | None = None      # "reached", "cap" (its samples), or None (trained its updates)
        self.last_step = 0
        self.metrics: dict[str, float] | None = None

    def more(self) -> bool:
        return self.stopped is None and self.run.state.step < self.limit

    def batches(self, batches: Iterable) -> Iterable:
        """The pass's batches until the run is done (reached, its cap, or its updates)."""
        state = self.run.state
        return takewhile(lambda _batch: self.stopped is None and state.step < self.limit, batches)

    def after_step(self, state) -> None:
        if state.step != self.last_step and (state.step % self.every == 0 or state.step == self.planned):
            self.evaluate(state)

    def hooked(self, after_step: Callable) -> Callable:
        """The loop's `after_step` (a checkpoint cadence) followed by this curve's evaluation."""
        def both(state) -> None:
            after_step(state)
            self.after_step(state)
        return both

    def evaluate(self, state) -> dict[str, float]:
        """One point: the task's evaluation now, at this step's training time and samples; then the stop rule."""
        run = self.run
        metrics = run.task.evaluate(state.model, run.val_batches, state.precision, run.dist)
        state.model.train()
        steps = state.timer.restart()        # the evaluation belongs to no step
        judged = run.task.judged(metrics)
        values = {judged_name(run.task): judged, **{f"val_{k}": v for k, v in metrics.items()
                                                     if k not in ("samples",) and isinstance(v, (int, float))}}
        point = {"step": state.step, "seen": sum(s.samples for s in steps) * run.dist.world_size,
                 "train_s": sum(s.seconds for s in steps), "metrics": values}
        self.points.append(point)
        self.last_step, self.metrics = state.step, metrics
        if self.plan.stops and self.plan.target.reached(point_value(point, self.plan.target.name)):
            self.stopped = "reached"
        elif self.plan.cap_seen is not None and self.agreed(point["seen"]) >= self.plan.cap_seen:
            self.stopped = "cap"
        return metrics

    def agreed(self, value: float) -> float:
        """A count as every rank sees it (the largest): ranks must stop at the same step."""
        dist = self.run.dist
        return max(dist.gather_objects(value)) if dist.enabled else value

    def finish(self, state) -> dict[str, float]:
        """The run's final evaluation: the last point's, or one more point where the run ended between two."""
        if self.metrics is None or self.last_step != state.step:
            return self.evaluate(state)
        return self.metrics

    def record(self) -> dict[str, Any]:
        return {"curve": self.points, "curve_every": self.every, "curve_stopped": self.stopped or "end",
                "curve_planned_step": self.planned,          # the planned run's end: where auto's level is read
                "curve_target": self.plan.target.to_dict() if self.plan.target else None}
