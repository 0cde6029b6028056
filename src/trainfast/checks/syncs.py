"""Host-device syncs: the loop's reads of tensor values per step, and the fix for the code they are in (the
script's own, or a library's option)."""
from __future__ import annotations

from typing import Any

from .findings import NOT_HERE, SYNCS_PER_STEP, Finding, Observations

# Where a library's own loop reads a value every step, the setting of that library that stops it.
LIBRARY_SYNC_FIXES = {
    "transformers/trainer.py": "TrainingArguments(logging_nan_inf_filter=False) turns off the Trainer's check of "
                               "every step's loss for NaN/inf (a read of the loss each step)",
}


def library_of(where: str) -> str | None:
    """The installed package a source location belongs to ("transformers"), None for the script's own files."""
    import re

    match = re.search(r"(?:site|dist)-packages/([^/]+)/", where.replace("\\", "/"))
    return match.group(1) if match else None


def sync_fix(user: list[dict[str, Any]]) -> str:
    """The fix for the syncs found: in the script's code, keep values on the device; in a library's, its option."""
    generic = ("keep values on the device (accumulate losses in a tensor) and read them every N steps; print from "
               "those reads (the built-in Meter does this)")
    libraries = {library_of(s["where"]) for s in user}
    if None in libraries:
        return generic
    known = [fix for s in user for key, fix in LIBRARY_SYNC_FIXES.items() if key in s["where"].replace("\\", "/")]
    return (f"these reads are in the code of {', '.join(sorted(libraries))}, not the script's: "
            + ("; ".join(dict.fromkeys(known)) if known else "look for its option that logs or checks less often"))


def syncs(obs: Observations) -> Finding:
    name = "host-device syncs per step"
    if not obs.sync_steps:
        return Finding(name, "mistake", NOT_HERE, "the loop ran too few steps to count them")
    user = obs.user_syncs()
    ours = sum(s["calls"] for s in obs.syncs if s["trainfast"])
    per_step = sum(s["calls"] for s in user) / obs.sync_steps
    lines = "; ".join(f"{s['calls'] / obs.sync_steps:g}/step {s['op']} at {s['where']}" for s in user[:4])
    text = (f"{per_step:g} per step from the loop over {obs.sync_steps} counted steps"
            + (f" ({lines})" if lines else "")
            + (f"; trainfast's own metric reads: {ours / obs.sync_steps:g} per step (once a log window)"
               if ours else ""))
    if per_step < SYNCS_PER_STEP:
        return Finding(name, "mistake", "fine", text)
    if not obs.cuda:
        # On the CPU the host is the device: a read waits for nothing, so calling it a problem here would be a
        # false alarm on the many correct loops that log loss.item() every step. Counted, with what a GPU would pay.
        return Finding(name, "mistake", "measured", text + "; on the CPU nothing runs ahead of the host, so they cost "
                       f"nothing here; on a GPU each one stalls it until its queued work is done: {sync_fix(user)}")
    return Finding(name, "mistake", "problem", text, fix=sync_fix(user))
