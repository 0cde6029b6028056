"""non_blocking + pin_memory (seeds 000, 003): the host->device copy of a batch from page-locked memory
runs asynchronously, so the host can queue the next kernels. On CPU there is no copy to overlap."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import torch

from .base import Effect, cuda_only

Prepare = Callable[[torch.Tensor], torch.Tensor]


def effect(device: torch.device) -> Effect:
    return cuda_only(device, "non_blocking copies from pinned memory")


def pin_memory_for(recipe, device: torch.device) -> bool:
    # Pinning on a CPU-only run allocates page-locked memory for nothing (and warns): pin only where it acts.
    # The prefetcher's side-stream copy is only asynchronous from pinned memory, so it implies pinning.
    return bool(recipe.pin_memory or recipe.prefetch) and device.type == "cuda"


class DeviceBatches:
    """Moves each (inputs, targets) batch to the device, then prepares the inputs there (normalize,
    memory format). The plain path: the copy is on the compute stream."""

    def __init__(self, loader: Iterable, device: torch.device, prepare: Prepare, non_blocking: bool = False) -> None:
        self.loader, self.device, self.prepare, self.non_blocking = loader, device, prepare, non_blocking

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for inputs, targets in self.loader:
            inputs = inputs.to(self.device, non_blocking=self.non_blocking)
            targets = targets.to(self.device, non_blocking=self.non_blocking)
            yield self.prepare(inputs), targets
