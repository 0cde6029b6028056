"""A ladder run with a target (--target): the order of its runs, the target's level and the runs' cap, the seeds
a rung that changes the math gets. The loop (loop.py) asks it at three moments; ablation/target.py scores.

1. The baseline's runs go first (its timed repeats and its accuracy seeds): `auto` is their median level at the
   end of their run, and every other run's cap is CAP_FACTOR times their samples to target, so both must be known
   before another rung starts. The other rungs' passes stay interleaved.
2. Once the baseline's runs are in, the target is resolved and the work told (Work.aim): from then on a run stops
   at its first evaluation that reaches it, or past the cap without it.
3. A rung whose curve left the baseline's seed band gets seeds until it has TARGET_SEEDS runs (accuracy and
   curve only: its rate is its timed repeats').
"""
from __future__ import annotations

from typing import Any, Callable

from ..curves import CAP_FACTOR
from ..results import Rung, Status
from ..stats import MIN_EFFECT
from ..target import Target
from .target import TARGET_SEEDS, auto_level, runs_with_curves, score_targets, seed_band, to_target

Entry = tuple[Rung, int, Any]        # (rung, repeat index, timing budget or None): the loop's queue


class Aim:
    def __init__(self, target: Target, plan: list[Rung], work, choice: Callable[[], Any],
                 min_effect: float = MIN_EFFECT, seeds: int = TARGET_SEEDS) -> None:
        self.target, self.plan, self.work, self.choice, self.min_effect = target, plan, work, choice, min_effect
        self.runs = seeds                         # runs a rung that changes the math is measured over
        self.cap_seen: float | None = None
        self.seeded: dict[str, int] = {}          # rung name -> seed runs queued for it
        work.aim(target, None)

    def order(self, queue: list[Entry]) -> list[Entry]:
        """The baseline's runs first, the rest in their order."""
        base = self.plan[0]
        return [e for e in queue if e[0] is base] + [e for e in queue if e[0] is not base]

    def after_run(self, queue: list[Entry]) -> None:
        """Once no baseline run is left to start: the target's level (auto) and the cap, told to the work."""
        base = self.plan[0]
        if self.cap_seen is not None or any(e[0] is base for e in queue) or not runs_with_curves(base):
            return
        if not self.target.known:
            name, goal = self.metric()
            level = auto_level(base, name) if name else None
            if level is None:
                return
            self.target = self.target.resolve(name, goal, level)
        summary = to_target(base, base, self.target, seed_band(runs_with_curves(base), self.target.name))
        samples = summary["samples"] if summary else None
        self.cap_seen = CAP_FACTOR * samples if samples and samples != float("inf") else None
        self.work.aim(self.target, self.cap_seen)

    def metric(self) -> tuple[str | None, str | None]:
        """The metric `auto` is about: the built-in run's judged one (its curve's key), a script's choice."""
        own = getattr(self.work, "curve_metric", None)
        if own is not None:
            return own()
        choice = self.choice()
        return (choice.name, choice.goal) if choice is not None else (None, None)

    def score(self) -> None:
        """Each rung's time to target. The accuracy guard at a fixed step stands down: each run stopped where it
        reached the target (the baseline trained on past its planned end), so their final metrics are not at one
        step, and a rung that reaches the target sooner is faster whatever its metric there."""
        score_targets(self.plan, self.target, self.min_effect)
        if self.target.known:
            for rung in self.plan:
                rung.result.metric_flag = rung.result.metric_worse = None

    def seeds(self, next_index: int) -> list[Entry]:
        """Seed runs for each rung that changed the math (its curve left the baseline's band) and has fewer runs than
        its target seeds (TARGET_SEEDS unless a search's budget asked fewer), numbered from `next_index` on (its seed
        is the recipe's plus that number, as for a repeat); the loop moves its next index past the largest."""
        runs = []
        for rung in self.plan[1:]:
            summary = rung.result.to_target
            if rung.status != Status.DONE or not summary or summary.get("samples_from") != "measured":
                continue
            have = len(rung.repeats) + self.seeded.get(rung.name, 0)
            runs += [(rung, next_index + k, None) for k in range(max(0, self.runs - have))]
            self.seeded[rung.name] = max(have, self.runs) - len(rung.repeats)
        return runs

    def to_dict(self) -> dict[str, Any]:
        return {**self.target.to_dict(), "text": self.target.text(), "cap_seen": self.cap_seen,
                "cap_factor": CAP_FACTOR, "seeds": self.runs}
