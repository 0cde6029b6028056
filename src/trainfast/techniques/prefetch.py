"""The prefetcher (the "fast data prefetcher" of NVIDIA Apex's ImageNet example): batches travel as
uint8 (4x fewer bytes than float32), batch i+1 is copied on a side stream while batch i computes, and
float conversion + normalization run on the device instead of per sample in the workers.

On CUDA: copy from pinned memory with non_blocking on a side stream; the compute stream waits for that
stream before using the batch, and `record_stream` tells the caching allocator the tensors are used on
the compute stream, so their memory is not reused while kernels still read it.
On CPU there is no stream to overlap; uint8 transport and batched normalization still act.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterable, Iterator

import torch

from .base import ACTS, Effect
from .switch import EVERY_ADAPTER, RungSpec, Switch
from .transfer import Prepare, no_arrival, tensors_in, to_device


def effect(device: torch.device) -> Effect:
    if device.type == "cuda":
        return ACTS
    return Effect(True, "side-stream copy acts on CUDA only; uint8 transport and on-device normalization act here")


class Prefetcher:
    """Any batch structure (techniques/transfer.map_tensors): every tensor in it is copied on the side stream.
    `on_fetched` as on DeviceBatches: called as a batch leaves the host loader (here the next one, fetched while
    the current one is handed out, so a step's wait for input covers the fetch that holds it up)."""

    on_fetched: Callable[[], None] = staticmethod(no_arrival)

    def __init__(self, loader: Iterable, device: torch.device, prepare: Prepare) -> None:
        self.loader, self.device, self.prepare = loader, device, prepare
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __len__(self) -> int:
        return len(self.loader)

    def _stream_context(self) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def _load(self, iterator: Iterator) -> tuple[Any] | None:
        try:
            batch = next(iterator)
        except StopIteration:
            return None
        self.on_fetched()
        with self._stream_context():
            batch = self.prepare(to_device(batch, self.device, non_blocking=self.stream is not None))
        return (batch,)          # a box: a batch may itself be None-like or empty

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.loader)
        upcoming = self._load(iterator)
        while upcoming is not None:
            if self.stream is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(self.stream)
                for tensor in tensors_in(upcoming[0]):
                    tensor.record_stream(current)
            (batch,) = upcoming
            upcoming = self._load(iterator)   # queue the next copy before the caller computes on `batch`
            yield batch


class HostBuffers:
    """Recycled float32 output buffers for normalizing batches on the CPU. A fresh batch-sized tensor
    (38 MB for 64 x 3 x 224 x 224) costs more in page faults than in arithmetic: measured on the 2-core
    dev machine, normalizing into a recycled buffer takes 48 ms instead of 115 ms. On CUDA the caching
    allocator already recycles memory, so `take` returns None there (normalize allocates).

    A buffer is handed out again only when nothing else holds it: no Python reference but the pool's
    and no C++ one (a view of it, a tensor autograd saved for backward). The engine holds at most three
    batches at once (in the step, yielded, being prepared); the pool keeps up to `max_buffers` per run
    (memory: max_buffers x one float32 batch) and allocates normally beyond that."""

    def __init__(self, device: torch.device, max_buffers: int = 4) -> None:
        self.active = device.type == "cpu"
        self.max_buffers = max_buffers
        self.buffers: list[torch.Tensor] = [torch.empty(0)]
        # What sys.getrefcount reports for a buffer only the pool holds, measured through the same code
        # path rather than assumed (it differs between Python versions).
        self.unused_refs = self._refs_in_loop()
        self.buffers.clear()

    def _refs_in_loop(self) -> int:
        for buffer in self.buffers:
            return sys.getrefcount(buffer)
        return 0

    def take(self, shape: torch.Size) -> torch.Tensor | None:
        if not self.active:
            return None
        for buffer in self.buffers:
            # Free: no Python name but the pool's list and this loop, no C++ holder (view, autograd).
            if buffer.shape == shape and sys.getrefcount(buffer) <= self.unused_refs and buffer._use_count() == 1:
                return buffer
        with torch.inference_mode(False):     # a normal tensor even when first taken inside evaluate()
            buffer = torch.empty(shape, dtype=torch.float32)
        if len(self.buffers) < self.max_buffers:
            self.buffers.append(buffer)
        return buffer


SWITCHES = (
    Switch(("prefetch",),
           rungs=(RungSpec("prefetch", {"prefetch": True}, place=40, default_in=("classification",), tune=6,
                           held_note=(5, "the prefetcher (--prefetch)")),),
           device_effect=effect, data="stacked",      # its buffers are recycled at one batch shape
           unreachable={EVERY_ADAPTER: "trainfast's device-side prefetcher works on trainfast's own loaders; the "
                                       "script's loader is the framework's"}),
)
