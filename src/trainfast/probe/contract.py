"""The contract between the ablation (the parent) and a run it measures (the child): what the parent puts in the
run's environment, how the run ends once it is timed, and where and how it writes its record.

The ablation starts every run with TRAINFAST_MEASURE in its environment (JSON: where to write the result, the
mode, the timing budget) next to TRAINFAST_RECIPE (the rung's switches). Modes: "speed" stops the run once warm-up
is over and the budget of steady steps is timed; "full" lets the run end by itself and writes the result at exit.
Rank 0 writes the result file (atomically: the parent never reads half a record); a run that ends without one
(crashed before its first step, os._exit) is reported by the ablation with the tail of its log. What the record
holds is record.py's.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

MEASURE_ENV = "TRAINFAST_MEASURE"
PROBE_MODES = ("speed", "full")    # stop once the budget is timed, or let the run end by itself


class MeasureError(ValueError):
    """TRAINFAST_MEASURE does not parse; names the variable and the value."""


@dataclass(frozen=True)
class MeasureSpec:
    result: str                  # where rank 0 writes the result (JSON)
    mode: str = "full"
    steps: int = 16              # the timing budget (ablate.TimingBudget)
    seconds: float = 60.0
    floor: int = 8
    min_seconds: float = 2.0
    # Full mode: the rate is that of the steps speed mode would have timed (warm-up excluded, the budget's steady
    # window), not of the whole run: a step later in the run that is not the training step's own cost (a
    # compiled model recompiling for the last, smaller batch: 20 s in one step of a 524-step run, which put a
    # rung whose steady steps were faster at 0.52x) stays out, and a rung timed to its end (to be judged on its
    # metric) measures the same rate as when it is stopped once timed. The run's whole time is its run_seconds.
    steady_window: bool = False
    # --target: the run records a point at each evaluation it reports (instruments/curve.py) and stops at the first
    # that reaches `target` (Target.to_dict(); auto before its level is known: no stop), or past `cap_seen` samples
    # seconds without reaching it.
    target: dict | None = None
    cap_seen: float | None = None
    # --metric on a script's output (printedmetric.PrintedMetric.to_dict()): its lines read as reported values
    printed_metric: dict | None = None

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "MeasureSpec | None":
        text = (os.environ if environ is None else environ).get(MEASURE_ENV)
        if not text:
            return None
        try:
            spec = cls(**json.loads(text))
        except (ValueError, TypeError) as exc:
            raise MeasureError(f"{MEASURE_ENV}={text!r} is not a measurement spec: {exc}") from None
        if spec.mode not in PROBE_MODES:
            raise MeasureError(f"{MEASURE_ENV}: mode {spec.mode!r} is not one of {', '.join(PROBE_MODES)}")
        return spec


class StopRun(SystemExit):
    """Speed mode: the budget is timed, the result written; the run ends here with exit status 0 (a
    SystemExit, so a script's `except Exception` does not swallow it; its `finally` blocks still run)."""

    def __init__(self) -> None:
        super().__init__(0)


def write_result(spec: MeasureSpec, record: dict[str, Any]) -> None:
    """The run's record where the parent reads it, whole or not at all (a run killed mid-write leaves none)."""
    from ..checkpoint import atomic_write_text

    atomic_write_text(spec.result, json.dumps(record, default=str))
