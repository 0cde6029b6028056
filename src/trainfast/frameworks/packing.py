"""A framework script's training batches: the batch switches (padding_free, group_by_length, pad_to_multiple, and
every switch declared with a BatchSwitch) on the batches a framework iterates, and their proof at the end of a run.
One code path for every adapter, the one a Session's loader and the built-in run take too: the declarations'
hooks (techniques/padding.py), looped over by techniques/__init__.py (collate_batches, choose_sampler,
batch_refusals), on the script's own collator (the Trainer's data_collator, or the collate_fn of the training
DataLoader Lightning iterates or Accelerate prepares) and its training DataLoader's sampler.

Packing a padded batch needs a model whose forward takes position_ids (any other model is not applicable, said
why); a length-grouped sampler replaces a shuffling one, drawn from the same generator, so the script's seed still
decides the order. Every run that names a switch that removes padding counts the padding of the script's batches
(text/packing.py's counting collator): batches with none leave those switches nothing to remove, which the
baseline's run says."""
from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from ..techniques import TrainBatches, batch_fields, batch_refusals, batch_switches, choose_sampler, collate_batches
from ..techniques.padding import GROUPED, uses_length_groups
from ..text.packing import PackingCollator
from .board import FrameworkRecord
from .common import rebuild_loader

__all__ = ["GROUPED", "PACKS", "PackingCollator", "asks_batches", "named_batches", "prove_batches",
           "switch_batches", "switch_collate", "uses_length_groups"]

PACKS = "collate_fn packs"                   # the DataLoader's collate_fn wrapped to pack (Lightning, Accelerate)


def named_batches(fields: dict[str, Any]) -> dict[str, Any]:
    """The batch switches a run names (the baseline's too, at their off value), with their values."""
    return {name: fields[name] for name in batch_fields() if name in fields}


def asks_batches(fields: dict[str, Any]) -> bool:
    return bool(named_batches(fields))


def record_batches(record: FrameworkRecord, batches: TrainBatches) -> None:
    """What the batch switches' hooks set and read back so far, into the framework's record."""
    for field_, setting, wanted, had in batches.settings:
        record.set(field_, setting, wanted, had)
    for setting, read_back, applied in batches.proofs:
        record.prove(setting, read_back, applied)
    batches.settings.clear()
    batches.proofs.clear()


def switch_collate(record: FrameworkRecord, batches: TrainBatches, values: dict[str, Any], count: bool) -> Any:
    """The script's collator with the batch switches at `values` set on it or wrapped around it (with `count`, the
    counting collator), recorded; what cannot act on it is said before the run."""
    collate = collate_batches(batches, values, count)
    record.unsupported.update(batches.cannot)
    record_batches(record, batches)
    return collate


def switch_batches(record: FrameworkRecord, loader: Any, fields: dict[str, Any],
                   model: Any) -> tuple[Any, PackingCollator | None]:
    """The training DataLoader a framework iterates, rebuilt with the batch switches the run names (its collate_fn
    set or wrapped, its sampler chosen), and the counting collator (None when the run names none, or the loader is
    not a plain DataLoader: then said not applicable). Off leaves the script's order, unless the script groups by
    length itself: a shuffling sampler from the same generator then."""
    from ..data.adopt import own_sampler

    values = named_batches(fields)
    if not values:
        return loader, None
    if type(loader) is not DataLoader:
        for name in values:
            record.unsupported[name] = (f"the training data is a {type(loader).__name__}, not a torch DataLoader "
                                        "whose collate_fn and sampler trainfast replaces")
        return loader, None
    batches = TrainBatches(loader.collate_fn, loader=loader, sampler=own_sampler(loader),
                           seed=int(fields.get("seed", 0)), model=model, checks_model=True)
    settings: dict[str, Any] = {"collate_fn": switch_collate(record, batches, values, count=True)}
    sampler = choose_sampler(batches, values)
    record_batches(record, batches)
    if sampler is not None:
        settings["sampler"] = sampler
    return rebuild_loader(loader, settings), settings["collate_fn"]


def prove_batches(record: FrameworkRecord, collate: Any, loader: Any, fields: dict[str, Any],
                  collate_name: str = "collate_fn") -> None:
    """The batch switches as the training collator and loader ended up with them (packed batches made, the sampler
    length-grouped), the padding the script's batches held, and why a switch could not act (recorded in every run,
    the baseline's first; a reason known before the run, such as TRL packing itself, stands)."""
    if collate is None:
        return
    values = named_batches(fields)
    for name, why in batch_refusals(collate, values).items():
        record.unsupported.setdefault(name, why)
    seen = getattr(collate, "batches", 0)
    if seen and collate.tokens != collate.slots:
        note = f"the script's training batches are {collate.padding_share:.0%} padding ({seen} batches)"
        record.notes[:] = [n for n in record.notes if not n.startswith("the script's training batches are")] + [note]
    for name, hooks in batch_switches():
        if name in values and hooks.state is not None:
            for setting, read_back, applied in hooks.state(collate, loader):
                record.prove(setting.format(collate=collate_name), read_back, applied)
