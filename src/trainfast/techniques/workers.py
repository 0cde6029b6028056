"""DataLoader worker processes (`num_workers`, `persistent_workers`, `prefetch_factor`): samples are read,
decoded and augmented in other processes while the step computes, so a step waits for its input only when the
workers fall behind. They pay where the batch is made per sample (decoded files, augmentation) and cost a
process start per epoch (unless persistent) and the cores they take from the step. "auto" picks the fastest of a
short measurement (data/loader.py: resolve_num_workers). The workers belong to the process: their rung is never
timed beside the baseline in one process (a live iterator's workers keep decoding while the other run steps)."""
from __future__ import annotations

from .switch import RungSpec, Switch

SWITCHES = (
    Switch(("num_workers", "persistent_workers", "prefetch_factor"),
           rungs=(RungSpec("workers", {"num_workers": 2}, place=43, places={"detection": 26},
                           default_in=("detection",), tune_inputs=3),),
           process=True,
           # persistent workers keep their random streams across epochs: a resume that changes it changes the
           # augmentation, so it is not among the resumable fields
           resumable=("num_workers", "prefetch_factor"),
           frameworks={"transformers": "TrainingArguments.dataloader_num_workers (and _persistent_workers, "
                                       "_prefetch_factor)",
                       "lightning": "the training DataLoader, rebuilt",
                       "accelerate": "the training DataLoader, rebuilt before prepare()"}),
)
