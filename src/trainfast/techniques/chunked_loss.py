"""The next-token loss of a causal language model computed in chunks of the sequence.

The output layer's logits are the largest single tensor of a small language model: batch x sequence x vocabulary
floats, kept for backward with their log-softmax, and a gradient of the same size in backward. With `chunked_loss`
the model's own forward returns its final hidden states without logits (transformers' `logits_to_keep`), and the
loss projects them onto the vocabulary a chunk of rows at a time: each chunk's logits are made, reduced to a sum
and dropped, and made again in backward (activation checkpointing of the output layer alone), so only one chunk's
logits exist at a time. A memory technique: the step does one more output-layer product (its forward, again in
backward), and a larger batch or a longer context fits. The loss is the model's own (labels shifted as transformers
shifts them, a mean over the predicted tokens): only the order of a float sum changes.

Only the built-in language-model task computes its loss itself: a script's loss is computed inside its model's
forward (transformers' `model(..., labels=labels).loss`, a LightningModule's training_step), which trainfast cannot
change without patching the model, so the framework adapters cannot set it.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .base import ACTS, Effect
from .switch import EVERY_ADAPTER, LossSwitch, RungSpec, Switch

# Rows (token positions) projected onto the vocabulary at once. A chunk's fp32 logits are 4 KB per vocabulary
# entry (32 MB at an 8k vocabulary, 128 MB at 32k), against 16 x 2048 rows for a batch of 16 documents of 2048
# tokens; 1024 rows still keep the product's matrices large enough to run at the matmul's full rate.
CHUNK_TOKENS = 1024
IGNORE = -100          # transformers' ignore_index: labels that are not predicted (padding, document boundaries)


def chunk_loss_sum(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                   ignore_index: int) -> torch.Tensor:
    """One chunk's summed cross entropy. The logits in fp32 for the softmax, as transformers' loss upcasts them
    (under autocast the product itself runs in the half type, as the model's own output layer would)."""
    logits = nn.functional.linear(rows, weight, bias).float()
    return nn.functional.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")


def next_token_loss_sum(hidden: torch.Tensor, head_weight: torch.Tensor, labels: torch.Tensor,
                        chunk_tokens: int = CHUNK_TOKENS, ignore_index: int = IGNORE,
                        head_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed next-token cross entropy in fp32, number of predicted tokens) of final hidden states (batch, seq,
    hidden) under the output layer `head_weight` (vocab, hidden). Position t predicts label t+1 of its own row, as
    transformers' ForCausalLMLoss shifts: the labels are moved one left and padded with `ignore_index` at the
    end (the hidden states need no copy to drop their last position). Packed rows need nothing more: their labels
    are already `ignore_index` where a document ends. Each chunk of `chunk_tokens` rows is checkpointed, so its
    logits are not kept for backward but made again there."""
    targets = nn.functional.pad(labels[:, 1:], (0, 1), value=ignore_index).flatten()
    rows = hidden.flatten(0, 1)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, rows.shape[0], chunk_tokens):
        end = start + chunk_tokens
        total = total + checkpoint(chunk_loss_sum, rows[start:end], head_weight, head_bias, targets[start:end],
                                   ignore_index, use_reentrant=False)
    return total, (targets != ignore_index).sum()


def chunked_causal_lm_loss(hidden: torch.Tensor, head_weight: torch.Tensor, labels: torch.Tensor,
                           chunk_tokens: int = CHUNK_TOKENS, ignore_index: int = IGNORE,
                           head_bias: torch.Tensor | None = None,
                           num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
    """The causal LM loss transformers computes from the logits (ForCausalLMLoss), without all of them at once: the
    mean over predicted tokens, or the sum over `num_items_in_batch` when given (gradient accumulation's
    normalisation). Like transformers' mean, a batch with no predicted token gives NaN (0/0)."""
    summed, predicted = next_token_loss_sum(hidden, head_weight, labels, chunk_tokens, ignore_index, head_bias)
    return summed / (predicted if num_items_in_batch is None else num_items_in_batch)


def final_hidden_states(model: Callable, inputs: Any) -> torch.Tensor:
    """The model's last hidden states (after its final norm), from its own forward with no logits: called through
    `model` as the step calls it (DDP, compile and the precision's hooks all see it). `logits_to_keep` as an empty
    tensor of positions keeps none; `output_hidden_states=-1` asks transformers 5 for the last layer's only (4.x
    reads any true value as all of them: the last is the same tensor, the others are kept anyway for backward)."""
    ids = inputs["input_ids"]
    outputs = model(**inputs, logits_to_keep=ids.new_empty(0), output_hidden_states=-1)
    return outputs.hidden_states[-1]


def chunked_lm_loss(model: Callable, inputs: Any, labels: torch.Tensor) -> torch.Tensor:
    """The training step's loss with the switch on: the model's own loss, its logits never whole. `model`: a
    transformers causal LM, or the Session's module around one (its attributes are the model's)."""
    head = model.get_output_embeddings()
    return chunked_causal_lm_loss(final_hidden_states(model, inputs), head.weight, labels, CHUNK_TOKENS,
                                  head_bias=head.bias)


def chunked_lm_loss_sum(model: Callable, inputs: Any, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Evaluation's (summed loss, predicted tokens) with the switch on: a run's peak memory stays the step's."""
    head = model.get_output_embeddings()
    return next_token_loss_sum(final_hidden_states(model, inputs), head.weight, labels, CHUNK_TOKENS,
                               head_bias=head.bias)


def effect(model: nn.Module | None) -> Effect:
    """It needs a causal LM whose forward can leave out its logits (transformers' `logits_to_keep`) and whose output
    layer it can read (`get_output_embeddings`)."""
    if model is None:
        return ACTS
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return Effect(False, "the model is no causal LM whose forward can leave out its logits (transformers' "
                             "logits_to_keep) with an output layer to read (get_output_embeddings)", applies=False)
    return ACTS


UNREACHABLE = ("a script computes its loss inside its model's forward (model(..., labels=labels).loss, or its "
               "own training step): trainfast cannot chunk it without patching the model")
# What a Session adopting a script's own loop says when asked for it (Session.unsupported()).
OWN_LOSS = ("the script's own loop computes its loss (model(..., labels=...).loss or its own criterion): trainfast "
            "cannot chunk it without patching the model")

SWITCHES = (
    # After the attention and padding rungs, with the language-model rungs: it changes what the step keeps in memory.
    # Not in the tune's speed stages (it buys memory, not time): `tune --memory-limit` tries it in its memory stage.
    Switch(("chunked_loss",),
           rungs=(RungSpec("chunked_loss", {"chunked_loss": True}, place=39, tasks=("lm",), tune_memory=1),),
           model_effect=effect,
           shrinks={"activations": "chunked_loss where the logits are the largest activation"},
           loss=LossSwitch("lm", chunked_lm_loss, chunked_lm_loss_sum, OWN_LOSS),
           unreachable={EVERY_ADAPTER: UNREACHABLE}),
)
