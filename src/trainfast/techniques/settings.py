"""The run's own settings: what is trained and how the run behaves, not speed switches. Declared here so every
Recipe field has exactly one declaration (techniques/switch.py), with what the tools need to know of it: whether
it belongs to the whole process (a rung changing it is never paired inside one process) and whether a run may
change it when it resumes from a checkpoint without changing its trajectory. None has a rung; the framework
adapters set only the seed (through each framework's own seeding), a script's other settings stay its own."""
from __future__ import annotations

from .switch import Switch, setting

SWITCHES = (
    setting("epochs", resumable=True),             # more epochs continue the same trajectory
    setting("batch_size", "optimizer", "lr", "weight_decay", "warmup_steps", "grad_accum_steps"),
    Switch(("seed",), frameworks={"transformers": "TrainingArguments.seed",
                                  "lightning": "seed_everything (the script's call seeds with the run's seed)",
                                  "accelerate": "set_seed (the script's call seeds with the run's seed)"}),
    # the non-finite policy acts only on a NaN/inf: a run stopped by one may be resumed with nonfinite=skip
    setting("nonfinite", "max_consecutive_skips", "log_every", resumable=True),
    setting("max_bad_fraction"),
    setting("save_every", own_process=True, resumable=True),   # saves inside the timed steps
    setting("keep_checkpoints", resumable=True),
    setting("find_unused_parameters", "dist_timeout_s"),
)
