"""A script's own flags as rungs in a ladder: where each joins the plan, what its runs start with, and what they were
observed doing (a flag that changed nothing trainfast could see is said beside its verdict). The words of a rung
(parsed, checked, merged into the command) are scriptargs.py, which the command line reads before torch loads."""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ..launch import Command
from ..report.observed import describe
from ..results import Rung, Status
from ..scriptargs import UNCHANGED, CommandChange, flag_groups, merge_args

def add_script_rungs(plan: list[Rung], changes: Sequence[CommandChange], command: Sequence[str], mode: str) -> None:
    """Each rung of the user's command joins `plan` after the switches' rungs, in the
    order given. Cumulative: on top of the rung above, the switches' and the earlier flags' changes carried (a later
    flag replaces an earlier one); each: on the baseline alone. Its recipe is the one it starts from (no switch
    changes), its `script` says what it adds and the command line and variables its runs have."""
    carried = CommandChange("baseline")
    for change in changes:
        cumulative = mode == "cumulative"
        start = next((r for r in reversed(plan) if r.status != Status.NO_EFFECT), plan[0]) if cumulative else plan[0]
        total = carried.then(change) if cumulative else change
        plan.append(Rung(change.name, {}, start.recipe, script={
            **change.to_dict(), "command": merge_args(list(command), total.args), "command_env": dict(total.env),
            "on": "rung above" if cumulative else "baseline",
            "switches": len(flag_groups(total.args)) + len(total.env)}))
        if cumulative:
            carried = total


def rung_command(rung: Rung, command: Command) -> Command:
    """The launch.Command one run of `rung` starts: the user's command, with the rung's flags where it has some."""
    argv = rung.script.get("command")
    return dataclasses.replace(command, argv=tuple(argv)) if argv else command


def rung_env(rung: Rung) -> dict[str, str]:
    """The variables a run of `rung` sets on top of the ablation's environment (its own and those carried)."""
    return dict(rung.script.get("command_env") or {})


def observed(rung: Rung) -> dict[str, Any] | None:
    """What the rung's first run with a record of it was observed doing (probe: record["observed"]); None when
    no run recorded it (an older probe, or a run that never reached its training forward)."""
    return next((run["observed"] for run in rung.repeats if isinstance(run.get("observed"), dict)), None)


def note_unchanged(plan: list[Rung]) -> None:
    """A rung of the script's own flags whose runs were observed doing exactly what the rung it starts from did
    (the same precision, compilation, optimizer, loader, memory format, whoever turned them on) says so beside its
    verdict: the flag changed nothing trainfast could see. Said once; a rung or its reference without observations
    is left alone."""
    for i, rung in enumerate(plan):
        if not rung.script or "unchanged" in rung.script or not i:
            continue
        above = (plan[0] if rung.script.get("on") == "baseline"
                 else next((r for r in reversed(plan[:i]) if r.repeats), plan[0]))
        mine, theirs = observed(rung), observed(above)
        if mine is None or theirs is None or behaviour(mine) != behaviour(theirs):
            continue
        text = f"{UNCHANGED}: its runs were observed as {above.name}'s ({describe(behaviour(mine))})"
        rung.script["unchanged"] = text
        rung.reason = f"{rung.reason}; {text}" if rung.reason else text


def behaviour(seen: dict[str, Any]) -> dict[str, Any]:
    """What a run did, without who turned each thing on (`by`): the script's --amp on top of trainfast's amp runs
    the same bf16 autocast, and the flag changed nothing the run does."""
    return {k: v for k, v in seen.items() if k != "by"}


def script_settings(rung: Rung) -> dict[str, Any]:
    """What plan.json keeps of a rung of the script's own flags (a resumed plan must have the same): its args, its
    env, and the command line its runs start; nothing for a switch's rung."""
    if not rung.script:
        return {}
    return {key: rung.script[key] for key in ("args", "env", "command", "command_env")}
