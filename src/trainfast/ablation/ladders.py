"""The ladders: which rungs an ablation can run, in what order, and each rung's recipe.

A cumulative ladder adds each rung's switches to the rung above it (the classic walk through the speed-ups:
mixed precision, then set_to_none, then non_blocking copies, ...); "each" tries every rung's switches alone on
the baseline. A rung whose switches act on data the task does not offer (Task.rules_out) is ruled out "not
applicable" with the reason when the ladder is planned, one that cannot work for it otherwise is refused with the
reason; one that cannot act on the device is kept in the plan and ruled out before it runs (work.py).
"""
from __future__ import annotations

from typing import Any

import torch

from ..defaults import LADDER_MODES  # how a ladder's rungs build on each other (the CLI's --mode)
from ..recipe import Recipe, RecipeError, resolve_device, validate_for_device
from ..results import EffectLabel, Rung
from ..tasks import TASKS, declared
from ..techniques import AMP, default_ladder, rung_table
from ..techniques.precision import auto_amp_dtype, slow_half_reason
from ..techniques.static import RUNG_ALIASES, unknown_rungs

# The ladders, derived from the switches' declarations (techniques/switch.py: each rung's place, the tasks whose
# default ladder runs it, the tasks that can name it). RUNGS is every rung --switches accepts, in ladder order: the
# precision-level rungs (O1/O2/O3 in bf16/fp16) sit right after "amp" and are opt-in, each setting precision and
# precision_level (in cumulative mode a level replaces the previous one); "fp32" names the baseline (O0). The
# opt-in rungs (decode_cache, device_decode, workers, passive_threads, reuse_memory, checkpointing,
# async_checkpoint) are run when --switches names them. Detection's default ladder runs aspect-ratio grouping and
# loader workers before channels_last, and compile last: in cumulative mode every later rung would inherit it, and
# it is not run on a detector (tasks/detection.py says why). The rungs whose data a task does not offer stay
# nameable, so --switches shows them ruled out with the reason (Task.rules_out) instead of calling them unknown.
# A user's script (`ablate -- COMMAND`, SCRIPT) can name every rung, those of every task: what it is training is
# not known before it runs, and a rung that cannot reach it is ruled out after its baseline, with the reason.
SCRIPT = "script"
LADDERS: dict[str, tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]] = {
    **{task: (default_ladder(task), rung_table(task)) for task in TASKS},
    SCRIPT: (default_ladder("classification"), rung_table(None))}
LADDER, RUNGS = LADDERS["classification"]
DETECTION_LADDER, DETECTION_RUNGS = LADDERS["detection"]


def plan_rungs(base: Recipe, names: list[str] | None = None, mode: str = "cumulative", amp: str = "auto",
               device: torch.device | None = None, task: str = "classification") -> list[Rung]:
    """Rung recipes. cumulative: each rung adds its switches to the previous one (the classic walk);
    each: the baseline plus one rung's switches at a time. `task` picks the ladder (LADDERS), rules out the rungs
    whose data it does not offer (not applicable, not carried down a cumulative ladder) and refuses those that
    cannot work for it otherwise, each with the reason."""
    if mode not in LADDER_MODES:
        raise RecipeError(f"--mode {mode!r} is not one of {', '.join(LADDER_MODES)}")
    device = device or resolve_device("auto")
    amp_dtype = auto_amp_dtype(device) if amp == "auto" else amp
    if amp_dtype not in ("bf16", "fp16"):
        raise RecipeError(f"--amp-dtype {amp!r} must be auto, bf16 or fp16")
    ladder, table = LADDERS[task]
    checker = declared(task) if task != SCRIPT else None         # a script's task is its own
    names = list(ladder) if not names else [RUNG_ALIASES.get(n, n) for n in names]
    unknown = unknown_rungs(names, [*table, *RUNG_ALIASES])
    if unknown:
        raise RecipeError(unknown)
    ordered = ["baseline"] + [n for n in table if n in names and n != "baseline"]
    # --amp-dtype auto on a device where neither half type is fast (a CPU without bf16 hardware): the amp rung
    # is shown with the measurement that rules it out, and the ladder climbs on without it.
    slow = slow_half_reason(device, amp_dtype) if amp == "auto" and "amp" in ordered else None
    rungs, current = [], base
    for name in ordered:
        changes = {k: (amp_dtype if v == AMP else v) for k, v in table[name].items()}
        start = current if mode == "cumulative" else base
        offered = checker.rules_out(changes) if checker is not None else None
        if offered is not None:
            rungs.append(Rung(name, changes, start.replace(**changes)))
            rungs[-1].rule_out(EffectLabel.NOT_APPLICABLE, offered)
            continue
        try:
            recipe = start.replace(**changes)
            validate_for_device(recipe, device)
            if checker is not None:
                checker.validate(recipe)
        except RecipeError as exc:
            raise RecipeError(f"rung {name!r}: {exc}") from exc
        rungs.append(Rung(name, changes, recipe))
        if name == "amp" and slow:
            rungs[-1].rule_out(EffectLabel.SLOW_HALF, slow)
            continue
        current = recipe
    return rungs



# With --target the default ladder also runs the batch size (batch_scale, the learning rate and warm-up scaled): the
# switch that changes the math most, which only a time to target can judge.
TARGET_RUNGS = ("batch_2x", "batch_4x")


def target_ladder(task: str) -> list[str]:
    """The rungs a --target ablation runs when --switches names none: the task's ladder and TARGET_RUNGS."""
    ladder, table = LADDERS[task]
    return [*ladder, *(name for name in TARGET_RUNGS if name in table and name not in ladder)]
