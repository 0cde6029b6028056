"""A script's padded language-model batches, packed after its own collator: what the Trainer adapter
(frameworks/hf.py) and a Session's training loader (data/adopt.py) both use for the padding_free switch, and the
padding share of the script's batches, counted in every run that asks for a padding switch.

The script's collator (a DataCollatorWithPadding, DataCollatorForLanguageModeling or a fine-tuning collator that
masks the prompt) makes its padded batch; each row's real tokens and their labels are packed into rows as the
built-in run packs documents (text/batching.py: pack), position ids restarting at each document so attention
stays inside it. Only training batches go through it: evaluation keeps the script's shapes."""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from .batching import pack, token_batch

PACKED_KEYS = {"input_ids", "attention_mask", "labels"}


class PackingCollator:
    """The script's collator, its batches' padding counted, and packed when `pack` (padding_free) is on. `cannot`:
    why a switch on these batches could not act, by its Recipe field, as its hooks found it (techniques/padding.py)."""

    def __init__(self, inner: Callable, pack: bool, one_row: bool = False,
                 cannot: dict[str, str] | None = None) -> None:
        self.inner, self.pack, self.one_row = inner, pack, one_row
        self.batches = self.packed = self.slots = self.tokens = 0
        self.refused: str | None = None              # why the batches could not be packed
        self.cannot: dict[str, str] = {} if cannot is None else cannot
        self.positions: bool | None = None           # a packed batch's position_ids reached the model (watch_positions)

    def watch_positions(self, module: torch.nn.Module) -> None:
        """Record, at `module`'s first training forward after a batch was packed, whether the packed batch's
        position_ids reached it. A step that hands the model some of the batch's fields by name
        (model(input_ids=..., labels=...)) drops them, and the documents sharing a row would attend to one another:
        the packing is then not applied, however many batches were packed (frameworks/packing.py's proof)."""
        handle = None

        @torch.compiler.disable          # eager beside a compiled model, never part of its graph
        def check(mod: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            if not self.packed or not mod.training or not torch.is_grad_enabled():
                return
            self.positions = kwargs.get("position_ids") is not None
            handle.remove()

        handle = module.register_forward_pre_hook(check, with_kwargs=True)

    def __call__(self, features: Any) -> Any:
        batch = self.inner(features)
        ids = batch.get("input_ids") if hasattr(batch, "get") else None
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            self.refused = self.refused or not_a_mapping(batch)
            return batch
        mask = batch.get("attention_mask")
        real = mask.bool() if isinstance(mask, torch.Tensor) else torch.ones_like(ids, dtype=torch.bool)
        tokens = int(real.sum())
        self.batches += 1
        self.slots += ids.numel()
        self.tokens += tokens
        why = self.cannot_pack(batch) if self.pack else None
        if why:
            self.refused = self.refused or why
        if not self.pack or why:
            # The batch as the script made it, saying its real tokens: a step is counted in tokens padded or packed
            # (measure.batch_samples reads rate_count), never in rows, which packing makes fewer.
            return counted(batch, tokens, len(ids), ids.numel())
        labels = batch["labels"]
        docs = [row[keep] for row, keep in zip(ids, real)]
        targets = [row[keep] for row, keep in zip(labels, real)]
        pad = int(ids[~real][0]) if (~real).any() else 0
        packed, packed_labels = pack(docs, targets, pad, self.one_row)
        self.packed += 1
        return token_batch({**packed, "labels": packed_labels}, packed.rate_count, packed.documents, packed.slots)

    @staticmethod
    def cannot_pack(batch: Any) -> str | None:
        """Why a mapping batch of token ids cannot be packed, None when it can."""
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


def counted(batch: Any, tokens: int, documents: int, slots: int) -> Any:
    """The script's batch saying its real tokens (`rate_count`, as a TokenBatch does), its own type kept where it
    takes an attribute (a tokenizer's BatchEncoding, whose .to() a loop may call); a plain dict becomes a
    TokenBatch."""
    if type(batch) is dict:
        return token_batch(batch, tokens, documents, slots)
    try:
        batch.rate_count, batch.documents, batch.slots = tokens, documents, slots
    except AttributeError:
        pass
    return batch


def not_a_mapping(batch: Any) -> str:
    """Why a batch that is not a mapping with input_ids is left as it is. A tuple whose first tensor is token ids
    (a hand-written collate_fn's (ids, labels)) is named as such: packing hands the model position_ids by name
    beside the ids, which a loop that calls model(ids) would drop, so it needs the batch as keywords."""
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else None
    if isinstance(first, torch.Tensor) and first.dim() == 2 and not first.is_floating_point():
        return (f"the script's collate_fn returns a {type(batch).__name__} of tensors (token ids first), not a mapping "
                "with input_ids and labels: packed rows need position_ids given to the model by name beside them; "
                "return {\"input_ids\", \"attention_mask\", \"labels\"} from the collate_fn and call model(**batch)")
    return "the script's batches are not token ids (input_ids of batch x length)"


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
    """Each item's token count, for length grouping: items that are token sequences in any of the forms a
    language-model dataset gives them (token_length); None for any other dataset."""
    try:
        first = dataset[0]
        count = len(dataset)
    except (TypeError, IndexError, KeyError, NotImplementedError):
        return None
    if token_length(first) is None:
        return None
    return [token_length(dataset[i]) or 0 for i in range(count)]


def token_length(item: Any) -> int | None:
    """The tokens in one dataset item: a mapping's input_ids (a tokenized dataset, as the Trainer's
    LengthGroupedSampler reads them), a list or tuple of ints, or a 1-D integer tensor (a hand-written loop's
    items, padded by its own collate_fn); None for anything else (an image, a (features, label) pair)."""
    if hasattr(item, "keys") and "input_ids" in item:
        item = item["input_ids"]
    if isinstance(item, torch.Tensor):
        return len(item) if item.dim() == 1 and not item.is_floating_point() and not item.is_complex() else None
    if isinstance(item, (list, tuple)) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
        return len(item)
    return None
