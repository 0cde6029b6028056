"""A script's padded language-model batches, packed after its own collator: what the Trainer adapter
(frameworks/hf.py) and a Session's training loader (data/adopt.py) both use for the padding_free switch, and the
padding share of the script's batches, counted in every run that asks for a padding switch.

The script's collator (a DataCollatorWithPadding, DataCollatorForLanguageModeling or a fine-tuning collator that
masks the prompt) makes its padded batch; each row's real tokens and their labels are packed into rows as the
built-in run packs documents (text/batching.py: pack), position ids restarting at each document so attention
stays inside it. Only training batches go through it: evaluation keeps the script's shapes."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable

import torch

from .batching import pack

NO_PADDING = ("the script's training batches hold no padding (all {batches} seen were full, as a chunked or packed "
              "dataset's are): {field} has nothing to remove")
PACKED_KEYS = {"input_ids", "attention_mask", "labels"}
PADDING_FIELDS = ("padding_free", "group_by_length")


class PackingCollator:
    """The script's collator, its batches' padding counted, and packed when `pack` (padding_free) is on."""

    def __init__(self, inner: Callable, pack: bool, one_row: bool = False) -> None:
        self.inner, self.pack, self.one_row = inner, pack, one_row
        self.batches = self.packed = self.slots = self.tokens = 0
        self.refused: str | None = None              # why the batches could not be packed
        self.ungrouped: str | None = None            # why the loader could not be grouped by length

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

    def unsupported(self, present: Iterable[str], packing: bool) -> dict[str, str]:
        """Of the padding switches `present` in the run, those that could not act on the batches seen, each with why:
        both when every batch was full (nothing to remove), padding_free (when `packing` was asked) when the batches
        could not be packed, group_by_length when the loader could not be grouped."""
        present = [name for name in present if name in PADDING_FIELDS]
        if self.batches and self.tokens == self.slots:
            return {name: NO_PADDING.format(batches=self.batches, field=name) for name in present}
        out = {}
        if packing and self.refused and "padding_free" in present:
            out["padding_free"] = self.refused
        if self.ungrouped and "group_by_length" in present:
            out["group_by_length"] = self.ungrouped
        return out

    @property
    def padding_share(self) -> float | None:
        return 1 - self.tokens / self.slots if self.slots else None


def takes_positions(model: Any) -> bool:
    """Packed rows need the model to take position ids (its packed-sequence attention reads them)."""
    try:
        return "position_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def positions_model(model: Any) -> Any:
    """The module a packed batch's position ids reach: `model` itself when its forward takes them, else the first
    of its submodules whose forward takes token ids and position ids (a transformers model inside a LightningModule
    or a script's own wrapper, whose forward passes the batch on); None when no module takes them."""
    if takes_positions(model):
        return model
    for module in model.modules() if isinstance(model, torch.nn.Module) else ():
        try:
            parameters = inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            continue
        if "input_ids" in parameters and "position_ids" in parameters:
            return module
    return None


def document_lengths(dataset: Any) -> list[int] | None:
    """Each item's token count, for length grouping: items that are mappings with input_ids (a tokenized dataset,
    as the Trainer's LengthGroupedSampler reads them), or themselves the token ids (a list of ints, a 1-D integer
    tensor); None for any other dataset."""
    try:
        first = dataset[0]
        count = len(dataset)
    except (TypeError, IndexError, KeyError, NotImplementedError):
        return None
    if hasattr(first, "keys") and "input_ids" in first:
        return [len(dataset[i]["input_ids"]) for i in range(count)]
    if is_token_ids(first):
        return [len(dataset[i]) for i in range(count)]
    return None


def is_token_ids(item: Any) -> bool:
    if isinstance(item, torch.Tensor):
        return item.dim() == 1 and not item.is_floating_point() and not item.is_complex()
    return isinstance(item, list) and bool(item) and all(isinstance(t, int) for t in item[:8])
