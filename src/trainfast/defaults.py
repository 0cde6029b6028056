"""The defaults the CLI parses with and shows in its help, kept where nothing imports torch, so a subcommand's
flags are built, and a bad one refused, before torch loads (the modules that use them import torch at the top).
Each is used by the module named beside it, which imports it from here."""
from __future__ import annotations

import os

# the ablation (ablation/ladders.py, ablation/loop.py, ablation/rung.py: TimingBudget)
LADDER_MODES = ("cumulative", "each")    # how a ladder's rungs build on each other (plan_rungs)
MAX_REPEATS = 8                 # settling adds passes up to this many repeats of every rung
SETTLE_WITHIN_S = 150.0         # the built-in ablation's default: what keeps `make ablate` under 3 minutes
TIMING_STEPS = 16               # steady steps each run is timed over, at least...
TIMING_SECONDS = 60.0           # ...or TIMING_FLOOR of them once they take this long (slow models)
TIMING_FLOOR = 8

# the verdicts (stats.py): the smallest speed difference called a gain or a loss, as a fraction (--min-effect)
MIN_EFFECT = 0.05

# the tune (tune/options.py: TuneOptions)
TUNE_BUDGET_S = 900.0           # the whole search

# the doctor (doctor/common.py)
DOCTOR_STEPS = 10               # timed steps: a median over the steps after warm-up (the watched pass warms up)
DOCTOR_EVAL_WITHIN = 120.0      # seconds an own loop is kept going for its first evaluation: a small epoch


# --memory-limit (ablation/loop.py: LadderOptions, tune/options.py: TuneOptions): a size as people write it
SIZE_SYNTAX = "a size like 2GiB, 512MiB or 1.5GB"
SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "k": 2**10, "kib": 2**10,
              "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30, "t": 2**40, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """'2GiB' or '2G' -> 2 * 2**30, '1.5GB' -> 1.5e9, '4096' -> 4096: bytes (a bare K/M/G is binary, as `free -h`
    and torch's memory summaries print). Raises ValueError for anything else (not positive, an unknown unit)."""
    import re

    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        if match is None:
            raise ValueError(f"must be {SIZE_SYNTAX}, got {text!r}")
        value, unit = float(match.group(1)), match.group(2).lower()
    if unit not in SIZE_UNITS or not value > 0:
        raise ValueError(f"must be {SIZE_SYNTAX} (more than 0), got {text!r}")
    return int(value * SIZE_UNITS[unit])


# --nproc 1,2 (ablation/world.py): the world sizes one ablation measures side by side
def parse_world_sizes(value: str | int | tuple | list) -> int | tuple[int, ...]:
    """--nproc as written: one process count ("2" -> 2, every rung as that many processes, as always), or a comma list
    ("1,2" -> (1, 2), ascending: the same ladder at each size, the smallest the reference of the scaling). Refused,
    naming the flag and the value, before torch loads: a count that is not a positive integer, one given twice, and
    in a list a count above this machine's cores (each rank needs one: more would time the cores' sharing, not the
    scaling)."""
    parts = [p.strip() for p in value.split(",")] if isinstance(value, str) else (
        list(value) if isinstance(value, (tuple, list)) else [value])
    counts = []
    for part in parts:
        try:
            count = part if isinstance(part, int) and not isinstance(part, bool) else int(part)
        except (TypeError, ValueError):
            count = None
        if count is None or count < 1:
            raise ValueError(f"--nproc {value!r}: {part!r} is not a positive process count (e.g. --nproc 2 or "
                             "--nproc 1,2)")
        if count in counts:
            raise ValueError(f"--nproc {value!r}: {count} is given twice; each world size is measured once")
        counts.append(count)
    if len(counts) == 1:
        return counts[0]
    cores = usable_cpus()
    if max(counts) > cores:
        raise ValueError(f"--nproc {value!r}: {max(counts)} processes need at least {max(counts)} cores and this "
                         f"machine gives this process {cores}; measure the sizes it can hold (up to {cores})")
    return tuple(sorted(counts))


def usable_cpus() -> int:
    """The cores this process may run on: its affinity mask where the OS has one (a container's or taskset's
    limit), else every core the machine has."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
