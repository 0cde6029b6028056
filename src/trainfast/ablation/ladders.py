"""The ladders: which rungs an ablation can run, in what order, and each rung's recipe.

A cumulative ladder adds each rung's switches to the rung above it (the classic walk through the speed-ups:
mixed precision, then set_to_none, then non_blocking copies, ...); "each" tries every rung's switches alone on
the baseline. A rung whose switches cannot work for the task is refused with the reason when the ladder is
planned; one that cannot act on the device is kept in the plan and ruled out before it runs (work.py).
"""
from __future__ import annotations

from typing import Any

import torch

from ..recipe import Recipe, RecipeError, resolve_device, validate_for_device
from ..results import Effect, Rung
from ..tasks import build_task
from ..techniques.precision import LEVEL_RUNGS, auto_amp_dtype, slow_half_reason

# name -> the switches it turns on. "{amp}" is replaced by the half type chosen for the device.
LADDER: dict[str, dict[str, Any]] = {
    "baseline": {},
    "amp": {"precision": "{amp}"},
    "set_to_none": {"set_to_none": True},
    "non_blocking": {"non_blocking": True, "pin_memory": True},
    "prefetch": {"prefetch": True},
    "channels_last": {"channels_last": True},
    "compile": {"compile": True},
    "fused": {"optimizer_impl": "fused"},
}
LADDER_MODES = ("cumulative", "each")    # how a ladder's rungs build on each other (plan_rungs)
# Every rung --switches accepts, in ladder order: the precision-level rungs (O1/O2/O3 in bf16/fp16) sit where
# "amp" sits and are opt-in only, so the default ladder stays LADDER. Each sets precision and
# precision_level, so in cumulative mode it replaces the previous level. "fp32" names the baseline (O0).
# "decode_cache" (image folders: decode each file once, then read uint8 pixels) is opt-in too, after prefetch;
# so is "device_decode" (image folders on CUDA: JPEGs decoded by nvJPEG on the device; no effect on a CPU).
# "checkpointing" (activation checkpointing) is a memory rung, opt-in after the last: slower, less memory.
# "workers" (two DataLoader worker processes) too: a script that makes or decodes its batches in the training
# process (the framework adapters switch the script's own loader).
# "async_checkpoint" (saves written in a background thread) acts on the saves inside the timed steps: a script's
# Session.save, or the built-in run's with --save-every N.
# "passive_threads" (idle OpenMP threads sleep instead of spinning) acts where loader workers share the cores.
# "reuse_memory" (freed host memory kept mapped for the next step) acts where glibc's malloc serves the process.
OPT_IN_AFTER = {"prefetch": {"decode_cache": {"decode_cache": True}, "device_decode": {"device_decode": True},
                             "workers": {"num_workers": 2},
                             "passive_threads": {"passive_threads": True}, "reuse_memory": {"reuse_memory": True}},
                "fused": {"checkpointing": {"activation_checkpointing": True},
                          "async_checkpoint": {"async_checkpoint": True}}}
RUNGS: dict[str, dict[str, Any]] = {**dict(list(LADDER.items())[:2]), **LEVEL_RUNGS}
for _name, _changes in LADDER.items():
    RUNGS.setdefault(_name, _changes)
    RUNGS.update(OPT_IN_AFTER.get(_name, {}))
RUNG_ALIASES = {"fp32": "baseline"}
# Detection's ladder: its own rungs, aspect-ratio grouping and DataLoader workers (a detector's images are
# made or decoded per sample, the batch padded by the model), before channels_last; compile last, since in
# cumulative mode every later rung would inherit it and it is not run on a detector (tasks/detection.py says
# why). The rungs that cannot work on a detector (O2/O3 levels, prefetch, decode_cache) stay nameable so
# --switches refuses them with the reason (Detection.validate) instead of calling them unknown.
DETECTION_LADDER: dict[str, dict[str, Any]] = {
    "baseline": {},
    "amp": {"precision": "{amp}"},
    "set_to_none": {"set_to_none": True},
    "group_aspect_ratio": {"group_aspect_ratio": True},
    "workers": {"num_workers": 2},
    "channels_last": {"channels_last": True},
    "compile": {"compile": True},
}
DETECTION_RUNGS: dict[str, dict[str, Any]] = {
    **{name: changes for name, changes in RUNGS.items() if name not in DETECTION_LADDER and name != "fused"},
    **{name: changes for name, changes in DETECTION_LADDER.items() if name != "compile"},
    "fused": RUNGS["fused"], "compile": DETECTION_LADDER["compile"],
}
LADDERS = {"classification": (LADDER, RUNGS), "detection": (DETECTION_LADDER, DETECTION_RUNGS)}


def plan_rungs(base: Recipe, names: list[str] | None = None, mode: str = "cumulative", amp: str = "auto",
               device: torch.device | None = None, task: str = "classification") -> list[Rung]:
    """Rung recipes. cumulative: each rung adds its switches to the previous one (the classic walk);
    each: the baseline plus one rung's switches at a time. `task` picks the ladder (LADDERS) and refuses
    the rungs that cannot work for it, with the reason."""
    if mode not in LADDER_MODES:
        raise RecipeError(f"--mode {mode!r} is not one of {', '.join(LADDER_MODES)}")
    device = device or resolve_device("auto")
    amp_dtype = auto_amp_dtype(device) if amp == "auto" else amp
    if amp_dtype not in ("bf16", "fp16"):
        raise RecipeError(f"--amp-dtype {amp!r} must be auto, bf16 or fp16")
    ladder, table = LADDERS[task]
    checker = build_task(task)
    names = list(ladder) if not names else [RUNG_ALIASES.get(n, n) for n in names]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise RecipeError(f"--switches: unknown rung(s) {', '.join(unknown)}; choose from "
                          f"{', '.join([*table, *RUNG_ALIASES])}")
    ordered = ["baseline"] + [n for n in table if n in names and n != "baseline"]
    # --amp-dtype auto on a device where neither half type is fast (a CPU without bf16 hardware): the amp rung
    # is shown with the measurement that rules it out, and the ladder climbs on without it.
    slow = slow_half_reason(device, amp_dtype) if amp == "auto" and "amp" in ordered else None
    rungs, current = [], base
    for name in ordered:
        changes = {k: (amp_dtype if v == "{amp}" else v) for k, v in table[name].items()}
        start = current if mode == "cumulative" else base
        try:
            recipe = start.replace(**changes)
            validate_for_device(recipe, device)
            checker.validate(recipe)
        except RecipeError as exc:
            raise RecipeError(f"rung {name!r}: {exc}") from exc
        rungs.append(Rung(name, changes, recipe))
        if name == "amp" and slow:
            rungs[-1].rule_out(Effect.SLOW_HALF, slow)
            continue
        current = recipe
    return rungs

