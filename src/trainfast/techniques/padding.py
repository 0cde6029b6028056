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

from typing import Any

from .switch import BatchSwitch, RungSpec, Switch, TrainBatches

# Lightning and Accelerate have no setting of their own for either: both act on the training DataLoader the
# framework iterates (the one Lightning's fit loop asks for, the one handed to accelerator.prepare()).
PACKS = "the training DataLoader's collate_fn, wrapped to pack its padded batches"
GROUPS = "the training DataLoader's sampler, length-grouped (shuffle=True loaders)"
ROUNDS = "the training DataLoader's collate_fn.pad_to_multiple_of (transformers' padding collators have it)"

# --- How each acts on the training batches (BatchSwitch): the built-in run's, a Session's, a framework script's ---

GROUPED = "sampler length-grouped"           # the proof's setting for a loader's sampler, length-grouped
NO_PADDING = ("the script's training batches hold no padding (all {batches} seen were full, as a chunked or packed "
              "dataset's are): {field} has nothing to remove")
NO_POSITIONS = ("{model}.forward takes no position_ids (nor does any module inside it that takes the token ids): "
                "packed rows need them to keep attention inside each document")


def no_padding(collate_fn: Any, name: str) -> str | None:
    """Why `name` had nothing to remove: every batch the counting collator saw was full."""
    batches = getattr(collate_fn, "batches", 0)
    if batches and collate_fn.tokens == collate_fn.slots:
        return NO_PADDING.format(batches=batches, field=name)
    return None


def no_rounding(collate_fn: Any) -> str | None:
    """Why the script's collator cannot round its batches' length: it has no pad_to_multiple_of (transformers'
    padding collators have it); trainfast does not know where another collator pads."""
    script = getattr(collate_fn, "inner", collate_fn)
    if hasattr(script, "pad_to_multiple_of"):
        return None
    return f"the script's collator ({type(script).__name__}) has no pad_to_multiple_of to set"


def round_lengths(batches: TrainBatches, value: Any) -> Any:
    """pad_to_multiple: trainfast's padded batches rounded; a script's collator through its own
    `pad_to_multiple_of`, read back at once. 0 (a framework run's baseline) leaves the script's own value."""
    from ..text.batching import PadCollate

    collate = batches.collate
    if isinstance(collate, PadCollate):
        return PadCollate(collate.pad_id, int(value))
    why = no_rounding(collate)
    if why:
        batches.cannot["pad_to_multiple"] = why
        return collate
    had = collate.pad_to_multiple_of
    wanted = int(value) or had
    setting = f"{batches.collate_name}.pad_to_multiple_of"
    batches.set("pad_to_multiple", setting, wanted, had)
    collate.pad_to_multiple_of = wanted
    batches.prove(setting, collate.pad_to_multiple_of)
    return collate


def pack_batches(batches: TrainBatches, value: Any) -> Any:
    """padding_free: trainfast's documents packed (one row where its attention skips across documents by itself);
    a script's batches packed after its collator, by the counting collator that wraps it. Where a framework's step
    calls a model that cannot take packed rows (no position_ids), not applicable, said why."""
    from ..text.batching import VARLEN_ATTENTION, PackCollate, PadCollate
    from ..text.packing import positions_model
    from .attention import in_use

    collate = batches.collate
    if isinstance(collate, PadCollate):
        return PackCollate(collate.pad_id, one_row=batches.one_row) if value else collate
    wanted, target = bool(value), None
    if batches.checks_model:
        target = positions_model(batches.model) if batches.model is not None else None
        if wanted and target is None:
            batches.cannot["padding_free"] = NO_POSITIONS.format(model=type(batches.model).__name__)
            wanted = False
        batches.set("padding_free", f"{batches.collate_name} packs", wanted, False)
    collate.pack, collate.one_row = wanted, in_use(target) in VARLEN_ATTENTION
    if wanted and target is not None:
        collate.watch_positions(target)
    return collate


def packing_refused(collate_fn: Any, value: Any) -> str | None:
    return no_padding(collate_fn, "padding_free") or (getattr(collate_fn, "refused", None) if value else None)


def packing_state(collate: Any, loader: Any) -> list[tuple[str, Any, bool | None]]:
    """Packed batches made, every one of them; none to prove where the batches held no padding."""
    setting = "{collate} packs"
    if not hasattr(collate, "packed") or no_padding(collate, "padding_free"):
        return []
    if collate.positions is False:
        # Packed, but the step called the model without the rows' position ids: attention crossed documents.
        return [(setting, "packed, but the model's forward got no position_ids (the script's step passes the "
                          "batch's fields by name and leaves them out): a row's documents attended to one another",
                 False)]
    return [(setting, collate.packed > 0 and collate.packed == collate.batches, None)]


def trl_packs(trainer: Any, notes: list[str]) -> str | None:
    """TRL's SFTTrainer packs by its own settings, read back in every run: SFTConfig(packing=True) packs the
    dataset when the trainer is built, padding_free=True (or best-fit packing) makes its collator flatten each
    batch into one row. Where the script has either on, why the padding_free switch cannot act: its batches are
    already packed, and no baseline could be the script without them. Off, the script's padded batches go through
    the packing collator, which gives the loss TRL's padding-free batches give (tests/test_trl.py)."""
    args = trainer.args
    if not (hasattr(args, "packing") and hasattr(args, "padding_free")):
        return None
    packs, flat = bool(args.packing), bool(getattr(trainer, "padding_free", args.padding_free))
    notes.append(f"TRL SFTConfig as the script set it: packing={packs}, padding_free={flat}")
    if not (packs or flat):
        return None
    said = " and ".join(name for name, on in (("packing=True", packs), ("padding_free=True", flat)) if on)
    return (f"the script's SFTConfig has {said}: TRL packs its batches itself, so there is no padding to remove "
            "and no baseline without packing to compare with (set them False in the script to measure packing)")


def group_lengths(batches: TrainBatches, value: Any) -> Any:
    """group_by_length: batches drawn from documents of similar length (text/batching.py: length_sampler), in place
    of a script's shuffling sampler, its order drawn from the generator the script's shuffle drew from. On a
    script's loader it is drawn in every run that names it (the baseline's too: a loader it cannot act on is then
    said not applicable before the rung runs); off, a loader the script groups itself gets a shuffling sampler from
    the same generator."""
    from ..text.batching import length_sampler

    if batches.loader is None:                   # trainfast's own documents: their lengths known
        return length_sampler(batches.lengths, batches.batch_size, batches.seed, batches.generator,
                              batches.dist) if value else None
    had, wanted = uses_length_groups(batches.loader), bool(value)
    grouped = None if had else script_grouping(batches)
    if "group_by_length" in batches.cannot:
        return None
    batches.set("group_by_length", GROUPED, wanted, had)
    if wanted and grouped is not None:
        return grouped
    if had and not wanted and batches.sampler is not None:
        from torch.utils.data import RandomSampler

        return RandomSampler(batches.loader.dataset, generator=batches.loader.generator)
    return None


def script_grouping(batches: TrainBatches) -> Any:
    """A length-grouped sampler for a script's loader, reading its items' token counts (text/packing.py:
    document_lengths); None where it cannot act, why in batches.cannot: items without token ids, a batch sampler of
    the script's own, or an order the script chose (no shuffle, a sampler of its own) that a shuffled grouping would
    replace."""
    from torch.utils.data import DistributedSampler, RandomSampler

    from ..text.batching import length_sampler
    from ..text.packing import document_lengths

    loader, sampler = batches.loader, batches.sampler
    lengths = document_lengths(loader.dataset)
    if lengths is None:
        why = ("the script's training items are not token sequences (a mapping with input_ids, a list of ints or a "
               "1-D integer tensor), whose lengths length grouping reads")
    elif sampler is None or loader.batch_size is None:
        why = (f"the script's loader draws its batches with its own batch_sampler "
               f"({type(loader.batch_sampler).__name__}), which trainfast does not replace")
    elif not isinstance(sampler, (RandomSampler, DistributedSampler)):
        why = (f"the script's training loader keeps an order of its own ({type(sampler).__name__}, not "
               "shuffle=True), which a shuffled length-grouped order would replace")
    else:
        generator = getattr(sampler, "generator", None) or loader.generator
        return length_sampler(lengths, loader.batch_size, batches.seed, generator, batches.dist)
    batches.cannot["group_by_length"] = why
    return None


def grouping_refused(collate_fn: Any, value: Any) -> str | None:
    return no_padding(collate_fn, "group_by_length")


def grouping_state(collate: Any, loader: Any) -> list[tuple[str, Any, bool | None]]:
    return [(GROUPED, uses_length_groups(loader), None)] if loader is not None else []


def uses_length_groups(loader: Any) -> bool:
    """Whether the training loader draws its batches through a length-grouped sampler (transformers' or text/'s;
    through Accelerate's wrappers: their sampler or batch sampler, a few levels down)."""
    seen, todo = 0, [loader]
    while todo and seen < 16:
        item = todo.pop()
        seen += 1
        if item is None:
            continue
        if "LengthGroupedSampler" in type(item).__name__:
            return True
        todo += [getattr(item, name, None) for name in ("sampler", "batch_sampler", "base_dataloader")]
    return False


def group_arguments(args: Any, value: Any) -> list[tuple[str, Any, Any]]:
    """The Trainer's own length grouping: transformers 5 names the sampler in train_sampling_strategy
    ("group_by_length" among its choices), 4 has a group_by_length flag. Off leaves the script's own strategy
    unless it was length grouping."""
    enabled = bool(value)
    if hasattr(args, "train_sampling_strategy"):
        had = args.train_sampling_strategy
        wanted = "group_by_length" if enabled else ("random" if had == "group_by_length" else had)
        args.train_sampling_strategy = wanted
        return [("train_sampling_strategy", wanted, had)]
    had = getattr(args, "group_by_length", None)
    args.group_by_length = enabled
    return [("group_by_length", enabled, had)]


def read_group_arguments(args: Any, loader: Any) -> list[tuple[str, Any]]:
    """The Trainer's training loader read back: length-grouped or not, and the strategy that drew it."""
    grouped = uses_length_groups(loader)
    strategy = getattr(args, "train_sampling_strategy", None)
    return [("group_by_length", grouped),
            ("train_sampling_strategy", "group_by_length" if grouped else
             (strategy if strategy != "group_by_length" else "not in the loader"))]


SWITCHES = (
    Switch(("padding_free",),
           rungs=(RungSpec("padding_free", {"padding_free": True}, place=34, tasks=("lm",), default_in=("lm",),
                           tune=0.5),),
           data="documents",
           changes_math=True,              # a packed batch's loss is normalized over other rows than the padded one's
           batch=BatchSwitch(collate=pack_batches, wraps=True, counts=True, refuse=packing_refused,
                             state=packing_state, trainer_refusal=trl_packs),
           frameworks={"transformers": "the Trainer's training collator, wrapped to pack its padded batches",
                       "lightning": PACKS, "accelerate": PACKS}),
    Switch(("group_by_length",),
           rungs=(RungSpec("group_by_length", {"group_by_length": True}, place=35, tasks=("lm",), default_in=("lm",),
                           tune=0.6),),
           data="documents",
           changes_math=True,              # which documents share a batch: another order, another trajectory
           batch=BatchSwitch(sampler=group_lengths, counts=True, refuse=grouping_refused, state=grouping_state,
                             arguments=group_arguments, read_arguments=read_group_arguments),
           frameworks={"transformers": "TrainingArguments.train_sampling_strategy=\"group_by_length\" (4.x: "
                                       "group_by_length=True)",
                       "lightning": GROUPS, "accelerate": GROUPS}),
    # Not in any default ladder: it helps only a compiled model (it adds padding to compute otherwise); name it
    # with --switches beside compile.
    Switch(("pad_to_multiple",),
           rungs=(RungSpec("pad_multiple", {"pad_to_multiple": 64}, place=36, tasks=("lm",)),),
           data="documents",
           batch=BatchSwitch(collate=round_lengths, refuse=lambda collate_fn, value: no_rounding(collate_fn)),
           frameworks={"transformers": "the Trainer's data_collator.pad_to_multiple_of",
                       "lightning": ROUNDS, "accelerate": ROUNDS}),
)
