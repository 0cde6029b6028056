"""A script's own flags in the search (`trainfast tune --rung NAME='ARGS' -- COMMAND`): stage 1 measures each rung of
them alone, like a switch; those that gain are combined with the switches that do, their flags merged (a later
rung's flag replaces an earlier one's) and their variables joined; every later stage's rungs run the command line
of the recipe they stand for, and the recommendation names it (Decision.script)."""
from __future__ import annotations

from typing import Any, Sequence

from ..results import Rung
from ..scriptargs import CommandChange, flag_groups, merge_args


def merged_script(rungs: Sequence[Rung], names: Sequence[str], command: Sequence[str] | None) -> dict[str, Any]:
    """The script's flags of the rungs named, in that order, merged into one rung's `script` (ablation's
    script_rungs.add_script_rungs: args, env, the command line and its variables); {} when none is a script's."""
    chosen = [r for r in (next((r for r in rungs if r.name == n and r.script), None) for n in names) if r is not None]
    if not chosen or command is None:
        return {}
    total = CommandChange("together")
    for rung in chosen:
        total = total.then(CommandChange(rung.name, tuple(rung.script["args"]), dict(rung.script["env"])))
    return {**total.to_dict(), "command": merge_args(list(command), total.args), "command_env": dict(total.env),
            "on": "baseline", "switches": len(flag_groups(total.args)) + len(total.env)}


def script_of(rungs: Sequence[Rung], name: str) -> dict[str, Any]:
    """The `script` of the rung called `name` ({} for a switch's rung, or none of that name)."""
    return next((dict(r.script) for r in rungs if r.name == name and r.script), {})


def with_script(rungs: Sequence[Rung], script: dict[str, Any]) -> None:
    """Every rung without flags of its own gets `script`'s: the stage's candidates stand on a recipe that holds
    the script's flags, so their runs start that command line (the baseline, plan[0], keeps the command as is)."""
    if script:
        for rung in rungs:
            rung.script = rung.script or dict(script)


def stamp_stage(rungs: Sequence[Rung], sources: Sequence[Rung], names: Sequence[str],
                command: Sequence[str] | None) -> None:
    """Stage 2's rungs (combine.combine_stage) with the script's flags each stands for: the best single's own, the
    combination's merged, and each leave-one-out's merged without the one it leaves out."""
    for rung in rungs[1:]:
        if rung.name.startswith("single-"):
            rung.script = script_of(sources, rung.name.removeprefix("single-"))
        elif rung.name == "combined":
            rung.script = merged_script(sources, names, command)
        elif rung.name.startswith("without-"):
            left = rung.name.removeprefix("without-")
            rung.script = merged_script(sources, [n for n in names if n != left], command)


def command_line(script: dict[str, Any]) -> str:
    """`X=1 python train.py --amp`: the command line (its variables first) a recommendation with the script's
    flags is run with, quoted for a shell."""
    import shlex

    env = [f"{k}={shlex.quote(v)}" for k, v in (script.get("command_env") or {}).items()]
    return " ".join([*env, shlex.join(script["command"])])
