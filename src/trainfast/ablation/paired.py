"""Paired timing (`--paired`): inside a rung's own process, its step timed in alternating blocks against the
baseline's step.

Why. On a shared VM, fresh processes of the same rung can settle at different speeds for their whole life, and a
rung's few seconds of steps cannot average that out. Two runs that share one process share the cores and the clock
that process got. So with `--paired` every timed run of a built-in ladder, after its own measurement, builds the
baseline's run beside it (same model and seed, its own optimizer and loader) and times the two in alternating
blocks, A B B A A B B A (a steady drift of the machine falls on both alike); the ratio of their rates is the
rung's speed-up with that state cancelled. The baseline's own runs do the same against a second baseline (an A/A
pair, whose ratio is 1 but for the noise), so every rung's paired ratio carries the same kind of noise and the
scoring's model (stats.py) applies unchanged.

Why it is not the default. The two runs also share the allocator, and not equally: on a CPU, glibc's thresholds
move with what the process frees, so the larger fp32 baseline stepping beside a bf16 rung can stop the rung's
steps from page-faulting (1,544 faults a step to none, 4-7% faster, measured) while the baseline's own faults do not
change. A pair then flatters the rung against what its own process shows (docs/measurement.md has the numbers).

What is not paired. A switch that changes the whole process cannot be on in one run and off in the other:
the OpenMP wait policy and the allocator (read or set once per process), cudnn's autotuner and deterministic
algorithms (global flags), loader worker processes (a live iterator's workers keep decoding while the other run
steps, taking the same cores), checkpoint saves inside the steps, and ranks of a multi-process job. Those rungs
keep the fresh-process comparison only (`unpaired_reason` says why), and so do the rungs compared with them.
The rung's own measurement (its rate, epoch, memory, accuracy) is taken before the pair is built and is unchanged.
"""
from __future__ import annotations

import math
import os
import time
from itertools import islice
from typing import Any, Iterator

from ..measure import BLOCK_SECONDS, step_block
from ..recipe import Recipe
from ..techniques import own_process_fields

# Recipe fields whose setting belongs to the process, not to a run: a rung that differs from the baseline in one
# of them is not paired (module docstring).
OWN_PROCESS_FIELDS = own_process_fields()       # declared by each switch (techniques/: Switch.own_process)
PAIRED_BLOCKS = 6           # timed blocks of each run, in A B B A order: a spread from 12 blocks of ~0.2 s
WARMUP_STEPS = 3            # untimed steps of each run first (the reference's first touch of every buffer), which
                            # also size each run's blocks


def unpaired_reason(recipe: Recipe, reference: Recipe, nproc: int = 1) -> str | None:
    """Why a rung cannot be timed against `reference` inside its own process, or None when it can."""
    if nproc > 1:
        return "a multi-process job: its ranks' collectives pace each other"
    differ = [f for f in OWN_PROCESS_FIELDS if getattr(recipe, f) != getattr(reference, f)]
    if differ:
        return f"{', '.join(differ)} set(s) the whole process, so both runs of a pair would share it"
    if recipe.num_workers:
        return "loader worker processes keep decoding while the other run of the pair steps"
    return None


def endless(run) -> Iterator:
    """The run's training batches, epoch after epoch, from one live iterator: a block takes the next few."""
    epoch = run.recipe.epochs + 1000          # shuffles no epoch of the accuracy run used
    while True:
        run.dist.set_epoch(epoch)
        yield from run.train_batches
        epoch += 1


def steps_per_block(step_seconds: float, block_seconds: float = BLOCK_SECONDS) -> int:
    """Steps in a block: about `block_seconds` of them (at least 2) after the first, which is left out (its batch
    follows the other run's block: caches hold that run's weights, so the switch-over would be charged to one
    side)."""
    return 1 + max(2, math.ceil(block_seconds / step_seconds)) if step_seconds > 0 else 4


def time_block(run, batches: Iterator, steps: int, check: bool) -> dict[str, Any]:
    """`steps` steps of `run` (its loop, its switches) on its next batches; the block of all but the first."""
    return step_block(run.steps_apart(islice(batches, steps))[1:], os.cpu_count() or 1, check)


def time_paired(run, reference, check: bool, block_seconds: float = BLOCK_SECONDS) -> dict[str, Any]:
    """The run and the reference (another BuiltinRun in this process) in alternating blocks (module docstring),
    each run's blocks about `block_seconds` of its own steps. `check`: leave out blocks other processes disturbed
    (measure.Timing's rule). The record: each side's blocks and the ratio of their clean rates."""
    started = time.perf_counter()
    sides = {"rung": (run, endless(run)), "reference": (reference, endless(reference))}
    warm = {name: time_block(*sides[name], 1 + WARMUP_STEPS, False) for name in ("reference", "rung")}
    steps = {name: steps_per_block(b["seconds"] / b["steps"], block_seconds) for name, b in warm.items()}
    blocks: dict[str, list[dict]] = {"rung": [], "reference": []}
    order = ("rung", "reference", "reference", "rung")
    for i in range(2 * PAIRED_BLOCKS):
        name = order[i % 4]
        blocks[name].append(time_block(*sides[name], steps[name], check))
    rates = {name: clean_rate(b) for name, b in blocks.items()}
    return {"steps_per_block": steps, "blocks": blocks, "rate": rates["rung"], "reference_rate": rates["reference"],
            "ratio": rates["rung"] / rates["reference"], "wall_s": time.perf_counter() - started}


def clean_rate(blocks: list[dict]) -> float:
    """Samples over seconds of the blocks no other process disturbed (all of them, if every one was)."""
    kept = [b for b in blocks if not b["disturbed"]] or blocks
    return sum(b["samples"] for b in kept) / sum(b["seconds"] for b in kept)
