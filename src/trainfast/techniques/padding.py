"""Padding in a language model's batches, and two ways to compute less of it.

Documents differ in length; the usual collators pad every batch to its longest document, and the model computes
every pad position (its MLPs, its attention rows) only for the loss to ignore it. `padding_free` packs the batch's
documents into rows with no padding between them, attention kept inside each document (text/batching.py): the
same tokens are learned from, at the cost of the real tokens only. `group_by_length` keeps the padded batches but
draws each from documents of similar length (the Trainer's LengthGroupedSampler), so there is little padding to
compute; it changes which documents share a step, so its accuracy is judged, never assumed.

`pad_to_multiple` goes the other way for a compiled model: it pads more, each batch's length rounded up to a
multiple of N tokens (transformers' pad_to_multiple_of), so the model sees a few lengths instead of one per batch.
Every new length can make torch.compile recompile (seconds each, inside the run), and past dynamo's recompile
limit the new shapes run uncompiled; the extra padding is masked out of attention and of the loss, so the math is
the same, at the cost of computing the extra positions. The rate counts real tokens, never the padding."""
from __future__ import annotations

from .switch import RungSpec, Switch

# Lightning and Accelerate have no setting of their own for either: both act on the training DataLoader the
# framework iterates (the one Lightning's fit loop asks for, the one handed to accelerator.prepare()).
PACKS = "the training DataLoader's collate_fn, wrapped to pack its padded batches"
GROUPS = "the training DataLoader's sampler, length-grouped (shuffle=True loaders)"
ROUNDS = "the training DataLoader's collate_fn.pad_to_multiple_of (transformers' padding collators have it)"

SWITCHES = (
    Switch(("padding_free",),
           rungs=(RungSpec("padding_free", {"padding_free": True}, place=34, tasks=("lm",), default_in=("lm",),
                           tune=0.5),),
           data="documents",
           changes_math=True,              # a packed batch's loss is normalized over other rows than the padded one's
           frameworks={"transformers": "the Trainer's training collator, wrapped to pack its padded batches",
                       "lightning": PACKS, "accelerate": PACKS}),
    Switch(("group_by_length",),
           rungs=(RungSpec("group_by_length", {"group_by_length": True}, place=35, tasks=("lm",), default_in=("lm",),
                           tune=0.6),),
           data="documents",
           changes_math=True,              # which documents share a batch: another order, another trajectory
           frameworks={"transformers": "TrainingArguments.train_sampling_strategy=\"group_by_length\" (4.x: "
                                       "group_by_length=True)",
                       "lightning": GROUPS, "accelerate": GROUPS}),
    # Not in any default ladder: it helps only a compiled model (it adds padding to compute otherwise); name it
    # with --switches beside compile.
    Switch(("pad_to_multiple",),
           rungs=(RungSpec("pad_multiple", {"pad_to_multiple": 64}, place=36, tasks=("lm",)),),
           data="documents",
           frameworks={"transformers": "the Trainer's data_collator.pad_to_multiple_of",
                       "lightning": ROUNDS, "accelerate": ROUNDS}),
)
