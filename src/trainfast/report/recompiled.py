"""A run repeated for a recompile that left too few of its timed steps (ablation/recompiled.py), in words: the
console's line, the rung's notes, and whether its rate is a measurement (the table's verdict)."""
from __future__ import annotations

from typing import Any


def left_out_texts(run: dict[str, Any]) -> list[str]:
    """A run's compiles inside its timed steps, each with the steps left out of its rate as warm-up (measure.Timing):
    the rung's notes and, as each run ends, the console."""
    out = []
    for c in run.get("timing", {}).get("compiled_left_out") or []:
        last = c["step"] + c["steps"] - 1
        steps = f"steps {c['step']}..{last}" if last > c["step"] else f"step {c['step']}"
        out.append(f"recompiled at step {c['step']}: {steps} left out of the rate as warm-up "
                   f"({c.get('seconds', 0.0):.1f} s of compilation, not the switch's rate)")
    return out


def evaluation_text(runs: list[dict[str, Any]]) -> str | None:
    """A rung's runs whose timed steps held another loader's pass (an evaluation), left out of the training rate,
    in one note: how many steps in how many runs, and their seconds."""
    found = [e for run in runs for e in run.get("timing", {}).get("evaluation_left_out") or []]
    if not found:
        return None
    holding = sum(1 for run in runs if run.get("timing", {}).get("evaluation_left_out"))
    seconds = sum(e.get("seconds", 0.0) for e in found)
    return (f"{len(found)} timed step(s) in {holding} of {len(runs)} run(s) held a pass over another loader than "
            f"the training one (an evaluation, {seconds:.1f} s in all): left out of the training rate, as in every "
            "rung")


def repeat_text(short: dict[str, Any]) -> str:
    return (f"recompiled at step {short['step']}: run repeated ({short['kept_steps']} of {short['timed_steps']} "
            f"timed steps left once its compile's {short['steps']} were left out)")


def again_text(short: dict[str, Any]) -> str:
    return (f"recompiled again at step {short['step']} in the repeat ({short['kept_steps']} of "
            f"{short['timed_steps']} timed steps left): its rate is not a measurement")


def not_repeated_text(short: dict[str, Any], why: str) -> str:
    return (f"recompiled at step {short['step']} ({short['kept_steps']} of {short['timed_steps']} timed steps left) "
            f"and not measured again ({why}): its rate is not a measurement")


def recompiled_notes(run: dict[str, Any], seed: Any) -> list[str]:
    """A run's repeat for a recompile, in the rung's notes (report/notes.py)."""
    done = run.get("recompiled")
    if not done:
        return []
    if done.get("not_repeated"):
        return [f"seed {seed}: {not_repeated_text(done['first'], done['not_repeated'])}"]
    out = [f"seed {seed}: {repeat_text(done['first'])}"]
    if done.get("again"):
        out.append(f"seed {seed}: {again_text(done['again'])}")
    return out


def not_a_measurement(runs: list[dict[str, Any]]) -> bool:
    """Whether any of a rung's runs kept a rate that is not a measurement (a recompile in its repeat too)."""
    return any((run.get("recompiled") or {}).get("measurement") is False for run in runs)
