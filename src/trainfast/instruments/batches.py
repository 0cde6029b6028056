"""What a script trains on, read from its first training forward: token ids, images or a detector's images and
targets. The ablation of a user's script plans the ladder of the task its batches are (a language model's
padding and attention switches, an image model's memory format) without being told, whatever built the loop: a
Session, transformers' Trainer, TRL, Lightning, Accelerate or a plain loop.

The first modules a forward enters say it: an embedding given a 2-D integer tensor is fed token ids (a language
model, or a text classifier: both get the language-model ladder, and packing rules itself out on one label a
sequence); a convolution given a 4-D floating tensor, images (a ViT's patch embedding is one); a module given a
list of 3-D images and a list of targets with boxes, a detector (torchvision's call). The hook is one global
forward pre-hook, removed at the first answer: nothing is left on the step after it.

Token ids also set the run's unit: tokens/s instead of rows/s, since a row holds one document when padded and
many when packed. The tokens counted are those the loss predicts (labels other than IGNORE past each row's first
position), which packing leaves exactly as they were: a padded row's first token is never predicted (the model
shifts its labels by one), and a packed document's first token is labelled IGNORE (it would be predicted across
a document boundary), so the same documents give the same count either way, prompt-masked fine-tuning labels
included. A forward without labels counts its attention mask, else its token ids. The counts stay on the device
(one tensor a step, no sync in the step) and are read once, when the run's record is written.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .eager import register_eager

IGNORE = -100            # the label no loss is computed on (torch's cross_entropy ignore_index, transformers')
# What each kind of batch makes a script's task (tasks/: TASKS), and the batches in words for the report.
TASK_OF = {"tokens": "lm", "images": "classification", "detection": "detection"}


def kind_of(module: nn.Module, args: tuple) -> tuple[str, str] | None:
    """(kind, what was seen) when this call tells what the batches are, else None."""
    first = args[0] if args else None
    if isinstance(first, (list, tuple)) and len(args) > 1 and isinstance(args[1], (list, tuple)) and first \
            and args[1] and all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in first) \
            and isinstance(args[1][0], dict) and "boxes" in args[1][0]:
        return "detection", f"{type(module).__name__} given {len(first)} images and their targets with boxes"
    if not isinstance(first, torch.Tensor):
        return None
    shape = "x".join(map(str, first.shape))
    if isinstance(module, nn.Embedding) and first.dim() == 2 and not first.is_floating_point():
        return "tokens", f"an embedding ({type(module).__name__}) given {shape} {str(first.dtype)[6:]} token ids"
    if isinstance(module, nn.Conv2d) and first.dim() == 4 and first.is_floating_point():
        return "images", f"a convolution ({type(module).__name__}) given {shape} {str(first.dtype)[6:]} images"
    return None


def tokens_in(args: tuple, kwargs: dict) -> torch.Tensor | int | None:
    """The tokens a training forward's batch holds, in the unit above (a 0-dim tensor on the batch's device, or
    None when the call carries no token ids)."""
    batch = batch_of(args, kwargs)
    ids, labels, mask = batch.get("input_ids"), batch.get("labels"), batch.get("attention_mask")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        return None
    if isinstance(labels, torch.Tensor) and labels.shape == ids.shape:
        return (labels[:, 1:] != IGNORE).sum()
    if isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
        return mask.sum()
    return ids.numel()


def documents_in(batch: Mapping, pad_id: int | None) -> torch.Tensor | int:
    """The documents a token batch holds: where it carries position ids, the positions where one restarts at 0 (a
    packed row holds several; the pad tail that fills a packed row to its width starts at 0 too, and is left out by
    its pad id where the model has one), else its rows that hold a real token (one document a padded row)."""
    ids, positions, mask = batch["input_ids"], batch.get("position_ids"), batch.get("attention_mask")
    if isinstance(positions, torch.Tensor) and positions.shape == ids.shape:
        starts = positions == 0
        return (starts & (ids != pad_id)).sum() if pad_id is not None else starts.sum()
    if isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
        return mask.bool().any(dim=1).sum()
    return ids.shape[0]


def batch_of(args: tuple, kwargs: dict) -> dict[str, Any]:
    """A forward's batch as one mapping: a mapping passed first, or token ids passed first, and the keywords."""
    batch: dict[str, Any] = {}
    if args and isinstance(args[0], Mapping):
        batch.update(args[0])
    elif args and isinstance(args[0], torch.Tensor):
        batch["input_ids"] = args[0]
    batch.update(kwargs)
    return batch


def real_positions(batch: Mapping, pad_id: int | None) -> torch.Tensor | None:
    """Which positions of a token batch hold a real token (bool, batch x length): its attention mask where it has
    one, else the positions whose id is not the model's pad id; None when neither says (every position counted)."""
    ids, mask = batch.get("input_ids"), batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and isinstance(ids, torch.Tensor) and mask.shape == ids.shape:
        return mask.bool()
    if isinstance(ids, torch.Tensor) and pad_id is not None:
        return ids != pad_id
    return None


class TokenCount:
    """The tokens of every training forward of `module` (the outermost module a step calls), summed per optimizer
    step on the device: `step()` closes one step, `read()` gives them all (one read of the device). With
    `padding` (the doctor's watch) it also sums the positions each forward computes and the real tokens among
    them (the padding share, on the device too), and keeps a copy of one batch after the first step: the batch
    the doctor replays padded and packed on the script's own model."""

    def __init__(self, module: nn.Module, padding: bool = False) -> None:
        self.pending: torch.Tensor | int = 0
        self.per_step: list[torch.Tensor | int] = []
        self.documents_pending: torch.Tensor | int = 0      # the documents of the same forwards (documents_in)
        self.documents: list[torch.Tensor | int] = []
        self.padding = padding
        self.positions, self.real = 0, 0              # summed over every counted forward
        self.forwards = 0
        self.kept: dict[str, Any] | None = None
        # the model's own pad id (a transformers config's), for batches without an attention mask
        self.pad_id = getattr(getattr(module, "config", None), "pad_token_id", None)
        # Never traced by torch.compile: the count runs eagerly beside a compiled model (a graph break at the hook,
        # outside the model's own graph), so compiling the script's model neither changes nor fails because of it.
        self.handle = register_eager(module.register_forward_pre_hook, self.count, with_kwargs=True)

    def count(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if module.training and torch.is_grad_enabled():
            tokens = tokens_in(args, kwargs)
            if tokens is not None:
                self.pending = self.pending + tokens
                self.documents_pending = self.documents_pending + documents_in(batch_of(args, kwargs), self.pad_id)
                if self.padding:
                    self.count_padding(batch_of(args, kwargs))

    def count_padding(self, batch: dict[str, Any]) -> None:
        ids = batch["input_ids"]
        real = real_positions(batch, self.pad_id)
        self.forwards += 1
        self.positions += ids.numel()
        self.real = self.real + (real.sum() if real is not None else ids.numel())
        if self.kept is None and self.per_step:       # after the first step: not a warm-up's odd first batch
            # The batch's own tensors, one row per sequence; a loss keyword beside them (the Trainer's 0-dim
            # num_items_in_batch) is the step's bookkeeping, not the batch.
            rows = ids.shape[0]
            self.kept = {k: v.detach().clone() for k, v in batch.items()
                         if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == rows}

    def padding_share(self) -> float | None:
        """The share of the positions computed that were padding, over every counted forward (one device read)."""
        if not self.positions:
            return None
        return 1 - int(self.real) / self.positions

    def step(self) -> None:
        self.per_step.append(self.pending)
        self.documents.append(self.documents_pending)
        self.pending = self.documents_pending = 0

    def read(self) -> list[int]:
        """Every step's count so far, read from the device at once (and kept read: the next read is the new
        steps' only); their documents are read with them (`documents`)."""
        both = self.per_step + self.documents
        tensors = [t for t in both if isinstance(t, torch.Tensor)]
        values = iter(torch.stack([t.to("cpu", torch.long) for t in tensors]).tolist()) if tensors else iter(())
        both = [next(values) if isinstance(t, torch.Tensor) else int(t) for t in both]
        self.per_step, self.documents = both[:len(self.per_step)], both[len(self.per_step):]
        return list(self.per_step)


class BatchKind:
    """Watches training forwards until one says what the batches are (`kind`, `seen`); then stops watching, and
    for token ids counts the tokens of every later step (`tokens`, on the outermost module a step calls).
    `on_start(module)` is told of the first training forward (the probe starts a script's step clock there)."""

    def __init__(self, padding: bool = False, on_start: Callable[[nn.Module], None] | None = None) -> None:
        self.padding = padding                   # count the padding too and keep a batch (TokenCount)
        self.on_start = on_start
        self.kind: str | None = None
        self.seen = ""
        self.outer: nn.Module | None = None      # the first module this forward entered: the model the step calls
        self.tokens: TokenCount | None = None
        # `hook` never traced, as TokenCount.count: eager beside a compiled model, never in its graph
        register = nn.modules.module.register_module_forward_pre_hook
        self.handle = register(self.hook_eager) if padding else register_eager(register, self.hook)

    def hook(self, module: nn.Module, args: tuple) -> None:
        # Training forwards only: a script's evaluation, or a model built and probed before it trains, may differ.
        if self.kind is not None or not module.training or not torch.is_grad_enabled():
            return
        if self.outer is None:
            self.outer = module
            if self.on_start is not None:
                self.on_start(module)
        found = kind_of(module, args)
        if found is not None:
            self.kind, self.seen = found
            self.close()
            if self.kind == "tokens":
                self.tokens = TokenCount(self.outer, self.padding)

    def hook_eager(self, module: nn.Module, args: tuple) -> None:
        """The doctor's watch: `hook` on eager forwards only. Inside a compiled forward the call of a disabled hook
        is a graph break, which the doctor's compile check would then blame on the loop; a compiled model's token
        batches are left unseen instead."""
        if not torch.compiler.is_compiling():
            self.hook(module, args)

    def step(self) -> None:
        """An optimizer step ended: the tokens since the last one are that step's. A first step that said nothing
        (a model with neither an embedding nor a convolution) ends the watch: no hook stays on every module call
        of the steps after it."""
        if self.tokens is not None:
            self.tokens.step()
        elif self.kind is None and self.outer is not None:
            self.close()

    def step_documents(self, steps: int) -> list[int] | None:
        """Documents of each of the run's last `steps` steps (as step_tokens; read by it)."""
        if self.tokens is None:
            return None
        counted = self.tokens.documents[-steps:] if steps else []
        return [0] * (steps - len(counted)) + [int(n) for n in counted]

    def step_tokens(self, steps: int) -> list[int] | None:
        """Tokens of each of the run's last `steps` steps (0 for a step before counting began), None when the
        batches are not token ids."""
        if self.tokens is None:
            return None
        counted = self.tokens.read()[-steps:] if steps else []
        return [0] * (steps - len(counted)) + counted

    def close(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def remove(self) -> None:
        """Every hook off, the token count's too (a watch that ends while the script goes on)."""
        self.close()
        if self.tokens is not None:
            self.tokens.handle.remove()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "seen": self.seen, "task": TASK_OF.get(self.kind or "")}
