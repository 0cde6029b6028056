"""What each rung's runs were seen doing (the run record's "observed" section, probe/observe.py), as one note of
the report: the precision inside the training forward, compile, the optimizer's implementation, the loader, the
memory format, and who turned each on. A switch named on a rung but not seen in its runs shows here."""
from __future__ import annotations

from typing import Any

from ..results import Rung, Status
from .format import rung_label


def describe(seen: dict[str, Any]) -> str:
    """One rung's observations in words: "bf16 autocast (trainfast), compiled, AdamW fused (script), 2 workers"."""
    by = seen.get("by") or {}

    def who(key: str) -> str:
        return f" ({by[key]})" if key in by else ""

    words = [f"{seen.get('precision') or '?'}{' autocast' if seen.get('autocast') else ''}{who('precision')}"]
    if seen.get("compiled"):
        recompiles = seen.get("recompiles") or 0
        words.append(f"compiled{who('compiled')}" + (f", {recompiles} recompile(s)" if recompiles else ""))
    if seen.get("optimizer"):
        implementation = seen.get("optimizer_implementation") or ""
        words.append(f"{seen['optimizer']} {implementation}{who('optimizer_implementation')}".strip())
    loader = seen.get("loader")
    if loader:
        pinned = ", pinned" if loader.get("pin_memory") else ""
        words.append(f"{loader.get('num_workers', 0)} loader workers{pinned}{who('loader')}")
    if seen.get("memory_format"):
        words.append(f"{seen['memory_format']}{who('memory_format')}")
    return ", ".join(words)


def observed_note(rungs: list[Rung]) -> list[str]:
    """The report's note: each measured rung's observations, where its runs recorded them (a script's)."""
    seen = [(r, r.result.observed) for r in rungs
            if r.status in (Status.DONE, Status.SKIPPED) and r.result is not None and r.result.observed]
    if not seen:
        return []
    return ["- **observed** in each rung's first run (read from its process, not from its switches): "
            + "; ".join(f"{rung_label(r)}: {describe(o)}" for r, o in seen)]
