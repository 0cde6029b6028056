"""Reading a run's proof: for a framework's script (frameworks/board.py, the "frameworks" section of a run's
result) which of a rung's switches the framework has no setting for, which did not take effect, and what the
script itself had set; for a script with neither a Session nor a framework, which switches can reach it at all
(the process-wide ones, through the environment it starts with) and whether its process has them. Pure
functions of the result, so the ablation's verdicts on them are tested alone."""
from __future__ import annotations

from typing import Any

from ..frameworks.board import UNSET
from ..techniques import process_wide_fields

NO_SESSION = ("the script does not use trainfast.Session, nor a framework trainfast switches from inside "
              "(transformers Trainer, Lightning, Accelerate), so the recipe cannot reach it")


def framework_names(sections: dict[str, Any]) -> str:
    return ", ".join(f"{name} {record.get('version', '')}".strip() for name, record in sections.items())


def unsupported(changes: dict[str, Any], sections: dict[str, Any]) -> str | None:
    """Why none of the rung's switches has a setting in the script's framework(s); None if one has."""
    if not sections or not changes:
        return None
    reasons = []
    for name in changes:
        why = [rec["unsupported"][name] for rec in sections.values() if name in rec.get("unsupported", {})]
        served = any(s["field"] == name for rec in sections.values() for s in rec.get("switches", {}).values())
        if served or not why:
            return None
        reasons.append(f"{name}: {why[0]}" if len(changes) > 1 else why[0])
    return "; ".join(reasons)


# A switch that only helps another one act: a framework without it still runs the rung's main switch.
HELPERS = {"pin_memory"}


def lacks_a_switch(changes: dict[str, Any], sections: dict[str, Any]) -> str | None:
    """Why a rung that ran cannot be what it is named: one of its own switches (not a helper) has no setting in
    the framework of this run (an O2 level where the framework's mixed precision is autocast); None if none."""
    reasons = [f"{name}: {why}" for name in changes if name not in HELPERS
               for rec in sections.values() for key, why in rec.get("unsupported", {}).items() if key == name]
    return "; ".join(reasons) or None


def served(name: str, value: Any, sections: dict[str, Any]) -> bool:
    """A field some switch of the run serves, or precision_level "autocast", which every framework's mixed
    precision is (served by its precision switch)."""
    if name == "precision_level" and value == "autocast":
        name = "precision"
    return any(s["field"] == name for rec in sections.values() for s in rec.get("switches", {}).values())


def not_applied(changes: dict[str, Any], sections: dict[str, Any]) -> str | None:
    """The rung's switches that the framework did not end up with (read back differs from what was asked, or
    nothing could be read back), in words; None when every one is proven applied."""
    problems = []
    for fw, record in sections.items():
        for s in record.get("switches", {}).values():
            if s["field"] not in changes or s["applied"] is True:
                continue
            if s["applied"] is None:
                problems.append(f"{fw} {s['setting']}: asked {s['wanted']!r}, nothing read back (the framework "
                                f"never reached it)")
            else:
                problems.append(f"{fw} {s['setting']}: asked {s['wanted']!r}, read back {s['read_back']!r}")
    unserved = [n for n, v in changes.items() if n != "seed" and not served(n, v, sections)
                and not any(n in rec.get("unsupported", {}) for rec in sections.values())]
    problems += [f"{n}: no adapter met a setting for it in this run" for n in unserved]
    return "; ".join(problems) or None


def script_settings(sections: dict[str, Any]) -> list[str]:
    """What the script itself had set for the settings the runs switched ("transformers bf16=True"), for the
    report: every run replaced these with the rung's value."""
    out = []
    for fw, record in sections.items():
        for s in record.get("switches", {}).values():
            if s["script"] != UNSET and s["script"] != s["wanted"]:
                out.append(f"{fw} {s['setting']}={s['script']!r}")
    return out


# --- a script with neither a Session nor a framework --------------------------------------------------------

def needs_session(changes: dict[str, Any]) -> list[str]:
    """The rung's switches that reach a script only through a Session or a framework adapter (all but the
    process-wide ones, which the script's process gets from the environment the ablation starts it with)."""
    return [name for name in changes if name not in process_wide_fields()]


def no_session_reason(plan_changes: list[dict[str, Any]]) -> str:
    """Why a rung cannot reach such a script; where no rung of the plan is process-wide, which ones would."""
    if any(changes and not needs_session(changes) for changes in plan_changes):
        return NO_SESSION
    names = process_wide_fields()
    return (f"{NO_SESSION}; {', '.join(names)} act on any process (the environment it starts with, or set as it "
            f"imports torch): `--switches {','.join(names)}` measures them on this script as it is")


def process_not_applied(changes: dict[str, Any], read_back: dict[str, Any]) -> str | None:
    """The rung's process-wide switches that the script's process did not end up with (read back in it by the
    probe: its environment overrode the setting, or another allocator serves it), in words; None if none."""
    problems = [f"{name}: asked {bool(value)!r}, the script's process has {read_back.get(name)!r}"
                for name, value in changes.items()
                if name in process_wide_fields() and read_back.get(name) != bool(value)]
    return "; ".join(problems) or None


def unreached(recipe: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """The switches a rung carries from the rungs above (cumulative) that cannot reach such a script: its runs
    had the process-wide switches only."""
    return [k for k, v in recipe.items() if k not in process_wide_fields() and k != "seed" and v != base.get(k)]
