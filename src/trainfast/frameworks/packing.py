"""A framework script's language-model batches: how much of them is padding (counted in every run), and, for the
padding_free switch, the same batches packed without it, after the script's own collator (a
DataCollatorWithPadding, DataCollatorForLanguageModeling or a fine-tuning collator that masks the prompt): each
row of the padded batch, its real tokens and their labels, packed into rows as the built-in run packs documents
(text/batching.py: pack), with position ids restarting at each document so attention stays inside it. Only
training batches are packed: evaluation keeps the script's shapes (its compute_metrics reads them)."""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

NO_PADDING = ("the script's training batches hold no padding (all {batches} seen were full, as a chunked or packed "
              "dataset's are): {field} has nothing to remove")
PACKED_KEYS = {"input_ids", "attention_mask", "labels"}


class PackingCollator:
    """The script's collator, its batches' padding counted, and packed when `pack` (padding_free) is on."""

    def __init__(self, inner: Callable, pack: bool, one_row: bool = False) -> None:
        self.inner, self.pack, self.one_row = inner, pack, one_row
        self.batches = self.packed = self.slots = self.tokens = 0
        self.refused: str | None = None

    def __call__(self, features: Any) -> Any:
        batch = self.inner(features)
        ids = batch.get("input_ids") if hasattr(batch, "get") else None
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            self.refused = self.refused or "the script's batches are not token ids (input_ids of batch x length)"
            return batch
        mask = batch.get("attention_mask")
        real = mask.bool() if isinstance(mask, torch.Tensor) else torch.ones_like(ids, dtype=torch.bool)
        self.batches += 1
        self.slots += ids.numel()
        self.tokens += int(real.sum())
        if not self.pack:
            return batch
        why = self.cannot_pack(batch)
        if why:
            self.refused = self.refused or why
            return batch
        from ..text.batching import pack

        labels = batch["labels"]
        docs = [row[keep] for row, keep in zip(ids, real)]
        targets = [row[keep] for row, keep in zip(labels, real)]
        pad = int(ids[~real][0]) if (~real).any() else 0
        packed, packed_labels = pack(docs, targets, pad, self.one_row)
        self.packed += 1
        return {**packed, "labels": packed_labels}

    @staticmethod
    def cannot_pack(batch: Any) -> str | None:
        labels = batch.get("labels")
        if not isinstance(labels, torch.Tensor):
            return "the script's batches carry no labels to pack with them (the model computes no loss from them)"
        if labels.shape != batch["input_ids"].shape:
            return ("the script's labels are not one per token (a label per sequence: a classifier), so its "
                    "documents cannot share a row")
        other = sorted(set(batch.keys()) - PACKED_KEYS)
        if other:
            return f"the script's batches carry {', '.join(other)} beside the token ids, which packing would not keep"
        return None

    @property
    def padding_share(self) -> float | None:
        return 1 - self.tokens / self.slots if self.slots else None


def takes_positions(model: Any) -> bool:
    """Packed rows need the model to take position ids (its packed-sequence attention reads them)."""
    try:
        return "position_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def prove_packing(record, collator: PackingCollator | None, fields: dict[str, Any]) -> None:
    """The padding switches' proof at the end of a run: packed batches made (padding_free), and why neither can
    act on a script whose batches hold no padding (recorded in every run, the baseline's first)."""
    if collator is None:
        return
    if collator.batches and collator.tokens == collator.slots:
        for name in ("padding_free", "group_by_length"):
            if name in fields:
                record.unsupported[name] = NO_PADDING.format(batches=collator.batches, field=name)
        return
    if collator.batches:
        record.notes.append(f"the script's training batches are {collator.padding_share:.0%} padding "
                            f"({collator.batches} batches)")
    if fields.get("padding_free") and collator.refused:
        record.unsupported["padding_free"] = collator.refused
    record.prove("data_collator packs", collator.packed > 0 and collator.packed == collator.batches)
