"""The defaults the CLI parses with and shows in its help, kept where nothing imports torch, so a subcommand's
flags are built, and a bad one refused, before torch loads (the modules that use them import torch at the top).
Each is used by the module named beside it, which imports it from here."""
from __future__ import annotations

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
