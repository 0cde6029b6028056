"""Padding in a language model's batches, and two ways to compute less of it.

Documents differ in length; the usual collators pad every batch to its longest document, and the model computes
every pad position (its MLPs, its attention rows) only for the loss to ignore it. `padding_free` packs the batch's
documents into rows with no padding between them, attention kept inside each document (text/batching.py): the
same tokens are learned from, at the cost of the real tokens only. `group_by_length` keeps the padded batches but
draws each from documents of similar length (the Trainer's LengthGroupedSampler), so there is little padding to
compute; it changes which documents share a step, so its accuracy is judged, never assumed."""
from __future__ import annotations

from .switch import RungSpec, Switch

# Lightning and Accelerate have no setting of their own for either: both act on the training DataLoader the
# framework iterates (the one Lightning's fit loop asks for, the one handed to accelerator.prepare()).
PACKS = "the training DataLoader's collate_fn, wrapped to pack its padded batches"
GROUPS = "the training DataLoader's sampler, length-grouped (shuffle=True loaders)"

SWITCHES = (
    Switch(("padding_free",),
           rungs=(RungSpec("padding_free", {"padding_free": True}, place=34, tasks=("lm",), default_in=("lm",),
                           tune=0.5),),
           data="documents",
           frameworks={"transformers": "the Trainer's training collator, wrapped to pack its padded batches",
                       "lightning": PACKS, "accelerate": PACKS}),
    Switch(("group_by_length",),
           rungs=(RungSpec("group_by_length", {"group_by_length": True}, place=35, tasks=("lm",), default_in=("lm",),
                           tune=0.6),),
           data="documents",
           frameworks={"transformers": "TrainingArguments.train_sampling_strategy=\"group_by_length\" (4.x: "
                                       "group_by_length=True)",
                       "lightning": GROUPS, "accelerate": GROUPS}),
)
