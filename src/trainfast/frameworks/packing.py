"""A framework script's language-model batches: the padding switches on the training batches a framework
iterates, and their proof at the end of a run. One code path for every adapter: the packing collator is
text/packing.py's (shared with a Session's loader), wrapped around the script's own collator (the Trainer's
data_collator, or the collate_fn of the training DataLoader Lightning iterates or Accelerate prepares); the
length-grouped sampler is data/adopt.py's (transformers' LengthGroupedSampler, or text/'s equivalent without it).

padding_free packs each padded batch's documents into rows whose position ids restart at each document, which
only a model whose forward takes position_ids can keep inside each document: any other model is not applicable,
said why. group_by_length replaces a shuffling sampler by a length-grouped one drawn from the same generator, so
the script's seed still decides the order. Every run that names either switch counts the padding of the script's
batches: batches with none leave both switches nothing to remove, which the baseline's run says."""
from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, RandomSampler

from ..text.packing import PADDING_FIELDS, PackingCollator, positions_model
from .board import FrameworkRecord
from .common import rebuild_loader

PACKS = "collate_fn packs"                   # the DataLoader's collate_fn wrapped to pack (Lightning, Accelerate)
GROUPED = "sampler length-grouped"           # the DataLoader's sampler, length-grouped (Lightning, Accelerate)
NO_POSITIONS = ("{model}.forward takes no position_ids (nor does any module inside it that takes the token ids): "
                "packed rows need them to keep attention inside each document")


ROUNDING = "pad_to_multiple"


def asks_padding(fields: dict[str, Any]) -> bool:
    return any(name in fields for name in (*PADDING_FIELDS, ROUNDING))


def switch_pad_multiple(record: FrameworkRecord, collator: Any, fields: dict[str, Any], setting: str) -> None:
    """pad_to_multiple through the script's collator's own `pad_to_multiple_of` (transformers'
    DataCollatorWithPadding, DataCollatorForLanguageModeling, DataCollatorForSeq2Seq have it), read back at once
    from the collator. 0 leaves the script's own value (its baseline is the script as written). A collator without
    the attribute is said not applicable: trainfast does not know where it pads."""
    if ROUNDING not in fields:
        return
    if not hasattr(collator, "pad_to_multiple_of"):
        record.unsupported[ROUNDING] = (f"the script's collator ({type(collator).__name__}) has no pad_to_multiple_of "
                                        "to set")
        return
    had = collator.pad_to_multiple_of
    wanted = int(fields[ROUNDING]) or had
    record.set(ROUNDING, setting, wanted, had)
    collator.pad_to_multiple_of = wanted
    record.prove(setting, collator.pad_to_multiple_of)


def packing_collator(record: FrameworkRecord, model: Any, inner: Any, fields: dict[str, Any],
                     setting: str = PACKS) -> PackingCollator:
    """`inner` (the script's collator) wrapped to count its batches' padding and, with padding_free on, pack them;
    recorded as `setting`. A model that cannot take packed rows is said not applicable. One row per batch where the
    model's attention skips across documents by itself (flex, flash)."""
    from ..techniques.attention import in_use
    from ..text.batching import VARLEN_ATTENTION

    wanted = bool(fields.get("padding_free"))
    target = positions_model(model) if model is not None else None
    if wanted and target is None:
        record.unsupported["padding_free"] = NO_POSITIONS.format(model=type(model).__name__)
        wanted = False
    if "padding_free" in fields:
        record.set("padding_free", setting, wanted, False)
    collator = PackingCollator(inner, wanted, one_row=in_use(target) in VARLEN_ATTENTION)
    if wanted:
        collator.watch_positions(target)
    return collator


def switch_padding(record: FrameworkRecord, loader: Any, fields: dict[str, Any],
                   model: Any) -> tuple[Any, PackingCollator | None]:
    """The training DataLoader a framework iterates, rebuilt with the padding switches (its collate_fn wrapped,
    its shuffling sampler length-grouped) as the run asks, and the collator that counts its batches (None when the
    run names neither switch, or the loader is not a plain DataLoader: then said not applicable). Off leaves the
    script's order, unless the script groups by length itself: a shuffling sampler from the same generator then."""
    from ..data.adopt import grouped_sampler, own_sampler

    if not asks_padding(fields):
        return loader, None
    if type(loader) is not DataLoader:
        for name in (*PADDING_FIELDS, ROUNDING):
            if name in fields:
                record.unsupported[name] = (f"the training data is a {type(loader).__name__}, not a torch DataLoader "
                                            "whose collate_fn and sampler trainfast replaces")
        return loader, None
    switch_pad_multiple(record, loader.collate_fn, fields, "collate_fn.pad_to_multiple_of")
    collator = packing_collator(record, model, loader.collate_fn, fields)
    settings: dict[str, Any] = {"collate_fn": collator}
    if "group_by_length" in fields:
        had = uses_length_groups(loader)
        wanted = bool(fields["group_by_length"])
        # Drawn in every run that names the switch, the baseline's too: a loader it cannot act on is then said not
        # applicable before the rung runs.
        sampler = None if had else grouped_sampler(loader, collator, int(fields.get("seed", 0)), None)
        if wanted and sampler is not None:
            settings["sampler"] = sampler
        elif had and not wanted and own_sampler(loader) is not None:
            settings["sampler"] = RandomSampler(loader.dataset, generator=loader.generator)
        if not collator.ungrouped:
            record.set("group_by_length", GROUPED, wanted, had)
    return rebuild_loader(loader, settings), collator


def prove_padding(record: FrameworkRecord, collator: PackingCollator | None, loader: Any,
                  fields: dict[str, Any], setting: str = PACKS) -> None:
    """Both switches as the training loader ended up with them: packed batches made, the sampler length-grouped."""
    prove_packing(record, collator, fields, setting)
    if loader is not None:
        record.prove(GROUPED, uses_length_groups(loader))


def prove_packing(record: FrameworkRecord, collator: PackingCollator | None, fields: dict[str, Any],
                  setting: str = "data_collator packs") -> None:
    """The padding switches' proof at the end of a run: packed batches made (padding_free), and why neither can
    act on a script whose batches hold no padding (recorded in every run, the baseline's first)."""
    if collator is None:
        return
    for name, why in collator.unsupported(fields, packing=bool(fields.get("padding_free"))).items():
        record.unsupported.setdefault(name, why)         # a reason known before the run (TRL packs itself) stands
    if collator.batches and collator.tokens == collator.slots:
        return
    if collator.batches:
        note = f"the script's training batches are {collator.padding_share:.0%} padding ({collator.batches} batches)"
        record.notes[:] = [n for n in record.notes if not n.startswith("the script's training batches are")] + [note]
    if collator.positions is False:
        # Packed, but the step called the model without the rows' position ids: attention crossed documents.
        record.prove(setting, "packed, but the model's forward got no position_ids (the script's step passes the "
                              "batch's fields by name and leaves them out): a row's documents attended to one "
                              "another", applied=False)
        return
    record.prove(setting, collator.packed > 0 and collator.packed == collator.batches)


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
