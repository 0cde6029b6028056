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

from typing import Any, Iterator

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
