"""Batches sized by tokens, not by documents (fairseq's --max-tokens, the token-based batching of most
pre-training and translation code): each training batch takes as many documents as fit in a budget of N tokens,
padding included (rows x the batch's longest document), drawn from documents of similar length.

With batches of `batch_size` documents, a batch of short documents computes a fraction of what a batch of long
ones does, and a batch that mixes them computes mostly padding. Under a token budget every step holds about the
same number of positions: short documents share a batch by the dozen, long ones go a few at a time, so the
padding left is what length sorting leaves (little) and the budget bounds every step's memory (a budget of
batch_size x the longest document is the padded run's worst batch). What it costs: the batches differ in size, so
each step's loss is a mean over another number of tokens, the documents sharing a step are no longer a uniform
draw, and a compiled model sees more shapes; it changes the trajectory and is judged on its time to target. It
needs the documents' lengths before the epoch: trainfast's own documents have them; a script's loader keeps its
own batches (said why)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..data.sampler import DealtBatches
from .switch import EVERY_ADAPTER, BatchSwitch, RungSpec, Switch, TrainBatches

SCRIPT = ("the script's loader draws batches of its own batch size: a token budget is drawn for trainfast's own "
          "documents, whose lengths it knows before the epoch")


class TokenBudgetBatches(DealtBatches):
    """Batches of document indices whose padded size (documents x the longest of them) stays within `tokens`; a
    document longer than the budget gets a batch of its own.

    Per epoch: the documents in an order drawn from (seed, epoch), sorted by length (longest first, ties in that
    random order), cut greedily into batches within the budget, and the batches shuffled, the one holding the
    longest document first (a run that will run out of memory does so on its first step). Call set_epoch(epoch)
    before each epoch, as with a DistributedSampler. Under DDP the batches are dealt whole to the ranks, and a
    mid-epoch resume skips what it trained on (data/sampler.py: DealtBatches)."""

    def __init__(self, lengths: Sequence[int], tokens: int, seed: int = 0, num_replicas: int = 1,
                 rank: int = 0) -> None:
        if tokens < 1:
            raise ValueError(f"a token budget must be >= 1, got {tokens}")
        super().__init__(seed, num_replicas, rank)
        self.lengths, self.tokens = np.asarray(lengths, dtype=np.int64), tokens

    def all_batches(self) -> list[list[int]]:
        """This epoch's batches over all ranks, in order."""
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(len(self.lengths))
        order = order[np.argsort(-self.lengths[order], kind="stable")]
        batches: list[list[int]] = []
        for index in order.tolist():
            # sorted longest first: a batch's first document is its longest
            if batches and int(self.lengths[batches[-1][0]]) * (len(batches[-1]) + 1) <= self.tokens:
                batches[-1].append(index)
            else:
                batches.append([index])
        batches = [batches[i] for i in rng.permutation(len(batches))]
        if batches:
            longest = max(range(len(batches)), key=lambda b: int(self.lengths[batches[b][0]]))
            batches[0], batches[longest] = batches[longest], batches[0]
        return batches


def budget_batches(batches: TrainBatches, value: Any) -> TokenBudgetBatches | None:
    """batch_tokens on trainfast's own documents: batches within the budget, re-drawn every epoch (registered with
    the run's process group for set_epoch, as its samplers are); a script's loader keeps its own, why said."""
    if batches.loader is not None or batches.lengths is None:
        batches.cannot["batch_tokens"] = SCRIPT
        return None
    dist = batches.dist
    sampler = TokenBudgetBatches(batches.lengths, int(value), seed=batches.seed,
                                 num_replicas=dist.world_size if dist is not None else 1,
                                 rank=dist.rank if dist is not None else 0)
    if dist is not None:
        dist.samplers.append(sampler)
    return sampler


def budget_refused(collate_fn: Any, value: Any) -> str | None:
    """A Session's loader (its collate function is the script's, or the counting collator around it)."""
    from ..text.batching import PackCollate, PadCollate

    return None if isinstance(collate_fn, (PadCollate, PackCollate)) else SCRIPT


# Not in any default ladder: name it with --switches. 4096 tokens is the default language-model run's worst padded
# batch (16 documents of up to 256 tokens): no step computes more positions than the padded baseline's largest.
SWITCHES = (
    Switch(("batch_tokens",),
           rungs=(RungSpec("token_budget", {"batch_tokens": 4096}, place=37, tasks=("lm",)),),
           data="documents",
           changes_math=True,              # batches of another size and make-up: another trajectory
           batch=BatchSwitch(batch_sampler=budget_batches, refuse=budget_refused),
           unreachable={EVERY_ADAPTER: "the framework's training loader draws batches of the script's batch size "
                                       "(neither the Trainer, Lightning nor Accelerate has a token budget)"}),
)
