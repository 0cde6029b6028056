"""The user's target (`--target val_loss<=3.2`, `val_acc>=0.95`, `auto`) and the curves a run records on its way
to it: what "reached" means, and where on a curve it happened.

A curve is the list of a run's evaluations in order, each point
    {"step": optimizer updates so far, "seen": samples (tokens, for a language model) trained on so far,
     "train_s": training seconds so far, "metrics": {name: value}}
where the training seconds are the run's steps' own time: compilation and waiting for data included (they are
part of getting there), evaluation excluded (the clock restarts after each one). A run's time to target is the
training time at the first evaluation that reaches it (not interpolated: the run did not know it was there
before it evaluated), its samples to target the samples seen by then. A run that ends, or hits its cap, without
reaching it is counted as not reaching it, never dropped (MLPerf's and AlgoPerf's rule).

`auto` is the level the baseline reaches at the end of its run, the median over its seeds: resolved once the
baseline's runs are in (Target.resolve).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

AUTO = "auto"
SPEC = re.compile(r"^\s*(?P<name>[A-Za-z][\w/.@\- ]*?)\s*(?P<op><=|>=)\s*(?P<value>[-+0-9.eE]+)\s*$")
OPS = {"<=": "min", ">=": "max"}
# Names users and frameworks give the same held-out numbers: "val_loss" finds a Trainer's eval_loss, a Lightning
# script's val/loss, the built-in language model's validation loss; "val_acc" finds accuracy, eval_accuracy, val_acc.
PREFIX = re.compile(r"^(eval|val|valid|validation|test)[_/.\- ]*", re.IGNORECASE)
CANONICAL = {"acc": "accuracy", "loss": "loss", "accuracy": "accuracy", "ppl": "perplexity",
             "perplexity": "perplexity", "map": "map"}


class TargetError(ValueError):
    """--target does not parse, or names a metric the run does not report; says which."""


@dataclass(frozen=True)
class Target:
    """What a run must reach. `name`: the metric as written (None for auto until resolved); `goal`: "min" (a loss:
    reached at or below `value`) or "max" (an accuracy: at or above)."""
    name: str | None
    goal: str | None
    value: float | None
    auto: bool = False

    @property
    def known(self) -> bool:
        """The level is set: a target as written, or auto once the baseline has given it."""
        return self.value is not None and self.goal is not None

    def reached(self, value: Any) -> bool:
        if not self.known or not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            return False
        return value <= self.value if self.goal == "min" else value >= self.value

    def resolve(self, name: str, goal: str, value: float) -> "Target":
        """auto, once the baseline's final level is known: that metric, its goal, that value."""
        return replace(self, name=name, goal=goal, value=float(value))

    def text(self) -> str:
        if not self.known:
            return "auto (the baseline's median level at the end of its run)"
        written = f"{self.name} {'<=' if self.goal == 'min' else '>='} {self.value:.4g}"
        return f"{written} (auto: the baseline's median at the end of its run)" if self.auto else written

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "goal": self.goal, "value": self.value, "auto": self.auto}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Target | None":
        return None if not data else cls(data.get("name"), data.get("goal"), data.get("value"),
                                         bool(data.get("auto")))


def parse_target(text: str | Target | None) -> Target | None:
    """`--target`: "auto", or a metric, <= (lower is better) or >= (higher is better), and a number."""
    if text is None or isinstance(text, Target):
        return text
    if text.strip().lower() == AUTO:
        return Target(None, None, None, auto=True)
    match = SPEC.match(text)
    if match is None:
        raise TargetError(f"--target {text!r} is not a target: write auto, or a metric, <= or >=, and a number "
                          "(val_loss<=3.2, val_acc>=0.95)")
    try:
        value = float(match["value"])
    except ValueError:
        raise TargetError(f"--target {text!r}: {match['value']!r} is not a number") from None
    if not math.isfinite(value):
        raise TargetError(f"--target {text!r}: the level must be a finite number")
    return Target(match["name"].strip(), OPS[match["op"]], value)


def canonical(name: str) -> str:
    """A metric's name without its split prefix and separators: eval_loss, val/loss, "validation loss" -> loss."""
    bare = PREFIX.sub("", name.strip().lower()).strip("_/.- ")
    return CANONICAL.get(bare, bare)


def metric_key(name: str, available: Sequence[str]) -> str | None:
    """The key among `available` that `name` means: itself, else the one with the same canonical name (a
    validation loss asked as val_loss, logged as eval_loss); None when none, or more than one, matches."""
    if name in available:
        return name
    wanted = canonical(name)
    matches = [k for k in available if canonical(k) == wanted]
    return matches[0] if len(matches) == 1 else None


def point_value(point: dict[str, Any], name: str) -> float | None:
    metrics = point.get("metrics") or {}
    key = metric_key(name, list(metrics))
    value = metrics.get(key) if key is not None else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def first_reach(curve: Sequence[dict[str, Any]], target: Target) -> dict[str, Any] | None:
    """The first point of `curve` at which `target` is reached, or None (never reached on this curve)."""
    if not target.known or target.name is None:
        return None
    for point in curve:
        if target.reached(point_value(point, target.name)):
            return point
    return None


def time_at(curve: Sequence[dict[str, Any]], seen: float) -> float | None:
    """The training seconds a run took to see `seen` samples: read off its curve between the points around it (its
    rate between two evaluations is steady enough for a straight line), and past its last point at its rate over
    the last stretch. None when the curve holds no point."""
    points = [(0.0, 0.0)] + [(float(p["seen"]), float(p["train_s"])) for p in curve]
    if len(points) < 2:
        return None
    for (s0, t0), (s1, t1) in zip(points, points[1:]):
        if seen <= s1:
            return t0 + (t1 - t0) * (seen - s0) / (s1 - s0) if s1 > s0 else t1
    (s0, t0), (s1, t1) = points[-2], points[-1]
    return t1 + (t1 - t0) * (seen - s1) / (s1 - s0) if s1 > s0 else None


def value_at(curve: Sequence[dict[str, Any]], seen: float, name: str) -> float | None:
    """The metric `name` at `seen` samples, between the evaluations around it (a straight line); None outside the
    curve's evaluated span."""
    points = [(float(p["seen"]), point_value(p, name)) for p in curve]
    points = [(s, v) for s, v in points if v is not None]
    for (s0, v0), (s1, v1) in zip(points, points[1:]):
        if s0 <= seen <= s1:
            return v0 + (v1 - v0) * (seen - s0) / (s1 - s0) if s1 > s0 else v1
    if points and seen == points[-1][0]:
        return points[-1][1]
    return None
