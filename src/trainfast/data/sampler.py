"""Resumable data order: a training epoch that was interrupted continues at its next batch, with the
same permutation, without loading the batches it skips.

The permutation is the one DataLoader(shuffle=True, generator=g) draws (RandomSampler on the loader's
generator), so a trainfast run and a plain PyTorch loop see the same batches. To replay it we keep the
generator state at the moment the permutation is drawn (the start of this sampler's __iter__, which
runs after the DataLoader drew its worker base seed from the same generator) and restore it there.

What is not replayed: random transforms inside workers. Their streams start from base_seed + worker_id
and advance with every sample a worker processes, so a mid-epoch resume cannot continue them; datasets
that need that must seed per sample from (seed, epoch, index). The built-in datasets draw nothing.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch
from torch.utils.data import BatchSampler, Sampler


class ResumableBatchSampler(Sampler[list[int]]):
    def __init__(self, sampler: Sampler, batch_size: int, drop_last: bool, generator: torch.Generator,
                 persistent_iterator: bool) -> None:
        self.batches = BatchSampler(sampler, batch_size, drop_last)
        self.generator = generator
        # With persistent workers the DataLoader draws its base seed once, on the first epoch only; later
        # epochs draw the permutation straight from the generator's current state.
        self.persistent_iterator = persistent_iterator
        self.epoch_start_state: torch.Tensor | None = None
        self.pending_skip = 0
        self._pending_state: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.batches) - self.pending_skip

    def __iter__(self) -> Iterator[list[int]]:
        if self._pending_state is not None:
            self.generator.set_state(self._pending_state)
            self._pending_state = None
        self.epoch_start_state = self.generator.get_state()
        skip, self.pending_skip = self.pending_skip, 0
        for i, batch in enumerate(self.batches):
            if i >= skip:               # skipped batches cost their indices only, no data loading
                yield batch

    def state_dict(self, at_epoch_end: bool) -> dict[str, Any]:
        """Mid-epoch: where this epoch's permutation was drawn from. At an epoch end: the generator now,
        and (persistent workers) the state the next permutation will be drawn from, which a fresh
        iterator would otherwise shift by drawing a base seed first."""
        now = self.generator.get_state()
        if at_epoch_end:
            return {"generator": now, "permutation_from": now if self.persistent_iterator else None}
        return {"generator": now, "permutation_from": self.epoch_start_state}

    def load_state_dict(self, state: dict[str, Any], skip: int) -> None:
        self.generator.set_state(state["generator"])
        self._pending_state = state["permutation_from"]
        self.pending_skip = skip


class DealtBatches(Sampler[list[int]]):
    """Whole batches drawn from (seed, epoch) alone, dealt to the ranks: the base of the batch samplers that choose
    which samples share a batch (detection's aspect-ratio groups, a token budget). A subclass gives all_batches()
    (this epoch's batches over all ranks, in order) and, where it can count them without drawing them,
    total_batches().

    Under DDP (num_replicas > 1) every rank builds the same epoch's batches and takes every num_replicas-th one,
    starting at its rank. Whole batches are dealt, not indices: grouping per rank would leave each rank its own
    remainders, so the ranks would run different numbers of steps and the last all-reduce would hang. When the
    count does not divide, the first batches are dealt again to even it out (at most num_replicas - 1 repeated
    batches per epoch, as DistributedSampler repeats indices). Call set_epoch(epoch) before each epoch.

    The checkpointer's data-order interface (as ResumableBatchSampler's): an epoch's batches follow from (seed,
    epoch) and the loop sets the epoch, so a mid-epoch resume only needs to know how many batches to skip."""

    def __init__(self, seed: int = 0, num_replicas: int = 1, rank: int = 0) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got rank={rank}")
        self.seed, self.num_replicas, self.rank = seed, num_replicas, rank
        self.epoch = 0
        self.pending_skip = 0        # batches of this epoch a resumed run has already trained on

    def all_batches(self) -> Iterable[list[int]]:
        raise NotImplementedError

    def total_batches(self) -> int:
        """Batches per epoch over all ranks, before the repeats that even out the ranks."""
        return sum(1 for _ in self.all_batches())

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-self.total_batches() // self.num_replicas) - self.pending_skip

    def state_dict(self, at_epoch_end: bool) -> dict[str, Any]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any], skip: int) -> None:
        self.epoch, self.pending_skip = state["epoch"], skip

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.pending_skip = self.pending_skip, 0
        yield from self.rank_batches()[skip:]

    def rank_batches(self) -> list[list[int]]:
        """This rank's batches of the epoch."""
        batches = list(self.all_batches())
        if self.num_replicas == 1:
            return batches
        per_rank = -(-len(batches) // self.num_replicas)
        padded = (batches * per_rank)[:per_rank * self.num_replicas] if batches else []
        return padded[self.rank::self.num_replicas]
