"""Which number a user's script is judged on for accuracy, and why: the one place that choice is made.

In order: the metric named on the command line (--metric, with --metric-goal); the one the script declares
itself (a Trainer's metric_for_best_model and greater_is_better, a Lightning ModelCheckpoint's monitor and
mode: the framework adapters put it in the run's record as "declared_metric"); a Session script's first value
given to tf.report (its own choice, by calling it); the validation loss the framework logged (lower is better);
else none, and the ablation times the rungs without judging accuracy. Every value a run reported, whether
through tf.report or read from the framework's own evaluation, is in the run's `reported` dict under the name
the script gave it, so the choice and the accuracy guard read one field for every kind of script.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SCRIPT_CHOICE = "<the script's choice>"     # --measure full without --metric: chosen here from the runs
TASK_METRIC = "<the task's metric>"         # the built-in run: its task's metric, in its record's `metric`
# The names frameworks and scripts give the validation loss: eval_loss (Trainer), val_loss, val/loss,
# validation_loss, and Lightning's val_loss_epoch when logged with on_epoch.
VAL_LOSS = re.compile(r"^(eval|val|valid|validation)[_/.\-]?loss(_epoch)?$", re.IGNORECASE)


@dataclass(frozen=True)
class MetricChoice:
    name: str | None           # None: nothing to judge (the rungs are timed only)
    goal: str | None           # "max" or "min"
    why: str                   # in words, for the report

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "goal": self.goal, "why": self.why}


def metric_goal(name: str | None) -> str:
    """Whether a metric is better high or low, from its name: losses, errors and perplexities are minimized."""
    lowered = (name or "").lower()
    return "min" if any(word in lowered for word in ("loss", "err", "perplexity", "wer", "mse", "mae")) else "max"


def better(goal: str) -> str:
    return "lower is better" if goal == "min" else "higher is better"


def choose_metric(asked: str | None, goal: str | None, run: dict[str, Any] | None) -> MetricChoice:
    """The metric a ladder is judged on: `asked` (--metric) if given, else the script's choice as `run` (the
    baseline's first finished run) shows it. A declared metric the script never logged is said, not used."""
    if asked:
        judged = goal or metric_goal(asked)
        return MetricChoice(asked, judged, f"--metric, {better(judged)}"
                            + (" (--metric-goal)" if goal else " (from its name)"))
    run = run or {}
    reported = {k: v for k, v in (run.get("reported") or {}).items() if is_number(v)}
    declared = run.get("declared_metric") or None
    missing = ""
    if declared and declared.get("name"):
        if declared["name"] in reported:
            goal = declared.get("goal") or metric_goal(declared["name"])
            return MetricChoice(declared["name"], goal, f"{declared.get('source', 'the script declares it')}, "
                                f"{better(goal)}")
        missing = f"the script declares {declared['name']} ({declared.get('source')}) but never logged it; "
    if run.get("session") and reported:
        name = next(iter(reported))
        return MetricChoice(name, goal or metric_goal(name), f"{missing}the first value the script reports with "
                            f"tf.report, {better(goal or metric_goal(name))}")
    loss = next((k for k in reported if VAL_LOSS.match(k)), None)
    if loss is not None:
        return MetricChoice(loss, "min", f"{missing}the validation loss the script logged (it declares no metric "
                            "of its own), lower is better")
    return MetricChoice(None, None, f"{missing}the script declares no metric, reports none with tf.report and "
                        "logs no validation loss: the rungs are compared on speed alone")


def task_metric_value(run: dict[str, Any]) -> Any:
    """The built-in run's judged value: its record's `metric` ({"name", "goal", "value"}; a record an earlier
    version wrote is read in today's names by store.current_record)."""
    judged = run.get("metric")
    return judged.get("value") if isinstance(judged, dict) else None


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
