"""A run whose timed steps held a recompile, when leaving its steps out is not enough: the run repeated once.

A recompile inside the timed steps is left out of the rate as warm-up (measure/timing.py: compile_left_out), and
speed mode then times more steps to fill its budget. A run that cannot time more (a token script timed over its
whole run, a run trained to its end, one that reached its step cap) may be left with a rate from a handful of
steps, or from steps that are only the compile's tail: the 19.5 s recompile measured inside one language model's
run took 60% of its timed seconds. Such a run is repeated once, in a fresh process with the same seed (the
compile caches on disk are warm by then, so a recompile costs less there, and one a guard or a transient shape
caused may not come back); the console and the rung's notes say "recompiled at step k: run repeated". A repeat
that again keeps too few steps is said too, and its rate is marked as not a measurement: the table's verdict
says so instead of a gain or a loss.

The rule (short_of_steps): a compile left out of the timed steps, and fewer than MIN_KEPT steps left for the rate
(the record's timed_steps: the clean steps its rate is taken over), MIN_KEPT being the fewest steps a timing is
taken over (measure.steps_to_time's floor). No share of the timed steps is asked for as well: a compile's steps
are left out only while slower than 1.5x the median of the timed steps, so they are always fewer than half.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from ..report.recompiled import again_text, left_out_texts, not_repeated_text, repeat_text

MIN_KEPT = 8        # measure.steps_to_time's floor: the fewest steady steps a rate is taken over
REPEAT_DIR = "repeat"


def short_of_steps(result: dict[str, Any]) -> dict[str, Any] | None:
    """Where a recompile left too few of the run's timed steps (module docstring): its first compile left out
    (step, steps, seconds), the timed steps and the steps kept; None where the run is fine as it is."""
    if "error" in result:
        return None
    timing = result.get("timing") or {}
    compiled = timing.get("compiled_left_out") or []
    if not compiled:
        return None
    timed, kept = len(timing.get("step_seconds") or []), timing.get("timed_steps", 0)
    if kept >= MIN_KEPT:
        return None
    return {"step": compiled[0]["step"], "steps": sum(c["steps"] for c in compiled),
            "seconds": sum(c.get("seconds", 0.0) for c in compiled), "timed_steps": timed, "kept_steps": kept}


def repeated(first: dict[str, Any], short: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The result kept: the repeat's, with both recompiles recorded ("recompiled"); the first run's where the
    repeat failed (its recompile note then says so)."""
    if "error" in second:
        return {**first, "recompiled": {"first": short, "not_repeated": f"the repeat failed: {second['error']}",
                                        "measurement": False}}
    again = short_of_steps(second)
    return {**second, "recompiled": {"first": short, "again": again, "measurement": again is None}}


def run_repeating(launch: Callable[[Path], dict[str, Any]], run_dir: Path, display, kind: str,
                  fits: Callable[[float], bool] = lambda seconds: True, name: str = "the run"
                  ) -> tuple[dict[str, Any], float]:
    """The run in `run_dir`, and once more in its `repeat` folder where short_of_steps says so and a run as long
    as the first `fits` in the time left (a budget is kept): the first run's cost told to the display and the
    repeat added to its plan, with why (the console's line). Returns the result kept (repeated) and when its
    last launch started (the caller times that one). A compile left out of the kept run's rate is said on the
    console as the run ends, `name` first (its rung and seed), as the rung's notes say it."""
    said: list[str] = []
    result, started = run_once_more(launch, run_dir, display, kind, fits, said)
    for text in left_out_texts(result) + said:
        display.note(f"{name}: {text}")
    return result, started


def run_once_more(launch: Callable[[Path], dict[str, Any]], run_dir: Path, display, kind: str,
                  fits: Callable[[float], bool], said: list[str]) -> tuple[dict[str, Any], float]:
    """run_repeating's runs: `said` gets what the console says after them."""
    started = time.monotonic()
    first = launch(run_dir)
    short = short_of_steps(first)
    if short is None:
        return first, started
    if not fits(time.monotonic() - started):
        result = {**first, "recompiled": {"first": short, "not_repeated": "no time left for it in the budget",
                                          "measurement": False}}
        said.append(not_repeated_text(short, result["recompiled"]["not_repeated"]))
        return result, started
    display.finished(kind, time.monotonic() - started)
    display.plan([kind, *display.runs.planned], repeat_text(short))
    started = time.monotonic()
    result = repeated(first, short, launch(run_dir / REPEAT_DIR))
    done = result["recompiled"]
    if done.get("again") is not None:
        said.append(again_text(done["again"]))
    elif done.get("not_repeated"):
        said.append(not_repeated_text(short, done["not_repeated"]))
    return result, started
