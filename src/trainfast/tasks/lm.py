"""Causal language modelling: documents of token ids, the model's own next-token loss, validation loss per token.

A batch is `(TokenBatch, labels)` (text/batching.py): the model's keyword arguments (padded: input_ids and
attention_mask; packed: input_ids and position_ids) and the labels, IGNORE where no token is predicted. The loss
is the model's own (transformers shifts the labels and averages over the predicted tokens), so the built-in step
is the step of a plain transformers loop. The rate counts real tokens (tokens/s), never padding; the judged metric
is validation loss in nats per token (lower is better), with its perplexity beside it."""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..recipe import RecipeError
from ..techniques.chunked_loss import chunked_lm_loss, chunked_lm_loss_sum
from .base import Task
from .declarations import LM, require_text_packages


class LanguageModel(Task):
    declaration = LM

    def __init__(self, loss_fn: Callable | None = None, dist=None, recipe=None) -> None:
        if loss_fn is not None:
            raise RecipeError("the language-model task takes no loss_fn: the model computes its own next-token loss")
        # The next-token loss of the step and of evaluation, chosen once: the model's own from its logits, or the
        # chunked_loss switch's (techniques/chunked_loss.py), which never holds the whole batch's logits.
        chunked = recipe is not None and recipe.chunked_loss
        self.loss = chunked_lm_loss if chunked else model_loss
        self.loss_sum = chunked_lm_loss_sum if chunked else logits_loss_sum

    # --- the step -------------------------------------------------------------------------------------
    def forward(self, model: Callable, inputs, labels: torch.Tensor) -> tuple[int, torch.Tensor]:
        """The model's next-token loss on the batch; `outputs` is the batch's real-token count (what score()
        counts)."""
        return inputs.rate_count, self.loss(model, inputs, labels)

    def score(self, outputs: int, targets: torch.Tensor) -> tuple[None, int]:
        return None, outputs

    def probe_batch(self, samples: list, device: torch.device):
        from ..techniques.transfer import to_device
        from ..text.batching import PadCollate

        return to_device(PadCollate(0)(samples), device)

    # --- evaluation and the epoch record ----------------------------------------------------------------
    def evaluate(self, model: nn.Module, batches: Iterable, precision, dist) -> dict[str, float]:
        """Validation loss per predicted token over every rank's shard (sums on the device, read once)."""
        import math

        model.eval()
        device = precision.device
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        predicted = torch.zeros((), dtype=torch.long, device=device)
        documents = 0
        with torch.inference_mode():
            for inputs, labels in batches:
                with precision.forward_context():
                    summed, count = self.loss_sum(model, inputs, labels)
                loss_sum += summed.double()
                predicted += count
                documents += inputs.documents
        model.train()
        count = int(predicted)
        reduced = dist.reduce_eval({"loss": float(loss_sum) / max(1, count), "tokens": count, "samples": documents})
        reduced["perplexity"] = math.exp(min(reduced["loss"], 50.0))
        return reduced

    def train_metrics(self, stats, dist) -> dict[str, float]:
        loss, _ = dist.reduce_train(stats.loss, 0, stats.samples)
        return {"train_loss": loss, "train_tokens": stats.samples}

    def val_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"val_loss": metrics["loss"], "val_perplexity": metrics["perplexity"]}

    def judged(self, metrics: dict[str, float]) -> float:
        return metrics["loss"]

    def rung_metrics(self, metrics: dict[str, float]) -> dict[str, Any]:
        """No held-out-sample band (validation loss is no proportion): the baseline's seeds give its noise band."""
        return {"loss": metrics["loss"], "perplexity": metrics["perplexity"], "val_samples": None}

    def summary(self, record: dict[str, Any]) -> str:
        return f"val loss {record['val_loss']:.4f}  val ppl {record['val_perplexity']:.2f}"

    # --- data, model, schedule --------------------------------------------------------------------------
    def load_data(self, spec: str, image_size: int | None):
        require_text_packages()
        self.declaration.check_image_size(image_size)
        from ..text.batching import load_text

        return load_text(spec)

    def build_model(self, name: str, split) -> nn.Module:
        from ..text.models import build_lm

        return build_lm(name, split.vocab_size, split.max_length, split.pad_id, split.eos_id)

    def resolve_workers(self, recipe, split, device: torch.device):
        """num_workers="auto": the fastest worker count, measured once on the recipe's own batches."""
        from ..data.loader import choose_num_workers, with_workers

        if recipe.num_workers != "auto":
            return recipe
        collate, _, _ = train_batching(recipe, split)
        return with_workers(recipe, choose_num_workers(split.train, recipe, device, collate_fn=collate))

    def build_loaders(self, split, recipe, device: torch.device, dist) -> tuple[Any, Any]:
        """Training batches in the recipe's form (padded, packed, length-grouped); validation always padded, in
        the documents' order (the metric does not depend on the switches' batching)."""
        from ..data.loader import make_loader
        from ..techniques.transfer import DeviceBatches
        from ..text.batching import PadCollate

        collate, sampler, batch_sampler = train_batching(recipe, split, dist)
        if sampler is None and batch_sampler is None:
            sampler = dist.train_sampler(split.train, recipe.seed)
        train = make_loader(split.train, recipe, device, True, sampler, rank=dist.rank, collate_fn=collate,
                            batch_sampler=batch_sampler)
        val = make_loader(split.val, recipe, device, False, dist.val_sampler(split.val), rank=dist.rank,
                          collate_fn=PadCollate(split.pad_id))
        return tuple(DeviceBatches(loader, device, keep, recipe.non_blocking) for loader in (train, val))

    def tokens_per_sample(self, split) -> float:
        """The mean length of a training document (as cut), in tokens: the rate in documents/s is tokens/s over it."""
        lengths = split.train.lengths
        return sum(lengths) / max(1, len(lengths))

    def flops_per_sample(self, model: nn.Module, split, recipe) -> float | None:
        """Training FLOPs of one real token (the rate's unit): text.models.flops_per_token with the context a token
        of the training documents sees on average (a document of n tokens gives each of its n tokens n)."""
        from ..text.models import flops_per_token

        lengths = split.train.lengths
        context = sum(n * n for n in lengths) / max(1, sum(lengths))
        return flops_per_token(model, context)


def train_batching(recipe, split, dist=None) -> tuple[Any, Any, Any]:
    """The built-in run's training collate function, sampler and batch sampler (None: the run's own shuffled
    batches of batch_size), as the recipe's batch switches make them from padded documents (rounded, packed,
    length-grouped, sized by tokens): the declarations' hooks (techniques/padding.py, ...), which a Session's loader
    and every framework adapter loop over too."""
    from ..data.loader import loader_generator
    from ..techniques import TrainBatches, asked_batches, choose_batch_sampler, choose_sampler, collate_batches
    from ..text.batching import VARLEN_ATTENTION, PadCollate

    values = asked_batches(recipe)
    batches = TrainBatches(PadCollate(split.pad_id), lengths=split.train.lengths, batch_size=recipe.batch_size,
                           seed=recipe.seed, generator=loader_generator(recipe.seed, dist.rank if dist else 0),
                           dist=dist, one_row=recipe.attention in VARLEN_ATTENTION)
    if dist is None:                     # the collate function alone (num_workers="auto" measures with it)
        return collate_batches(batches, values), None, None
    return collate_batches(batches, values), choose_sampler(batches, values), choose_batch_sampler(batches, values)


def model_loss(model: Callable, inputs, labels: torch.Tensor) -> torch.Tensor:
    """The model's own loss: transformers shifts the labels and averages over the predicted tokens."""
    return model(**inputs, labels=labels).loss


def logits_loss_sum(model: Callable, inputs, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed next-token loss, predicted tokens) of a batch, from the model's logits (fp32 for the softmax)."""
    logits = model(**inputs).logits
    targets = labels[:, 1:]
    summed = nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(),
                                         ignore_index=-100, reduction="sum")
    return summed, (targets != -100).sum()


def keep(batch):
    """A language-model batch needs nothing done on the device once it is there."""
    return batch
