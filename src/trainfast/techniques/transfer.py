"""non_blocking + pin_memory: the host->device copy of a batch from page-locked memory
runs asynchronously, so the host can queue the next kernels. On CPU there is no copy to overlap.

Batches may have any structure (a tensor, tuples, lists, namedtuples, dicts, nested: detection targets
are lists of dicts); `map_tensors` walks it, so the same transfer serves (inputs, targets) pairs and a
user's own batches."""
from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator

import torch

from .base import Effect, cuda_only
from .switch import RungSpec, Switch

Prepare = Callable[[Any], Any]


def effect(device: torch.device) -> Effect:
    return cuda_only(device, "non_blocking copies from pinned memory")


def pin_memory_for(recipe, device: torch.device) -> bool:
    # Pinning on a CPU-only run allocates page-locked memory for nothing (and warns): pin only where it acts.
    # The prefetcher's side-stream copy is only asynchronous from pinned memory, so it implies pinning.
    return bool(recipe.pin_memory or recipe.prefetch) and device.type == "cuda"


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """`obj` with `fn` applied to every tensor in it; everything else passes through. Namedtuples and
    mappings keep their type; other tuple subclasses (e.g. data.badfiles.Batch, whose constructor takes
    more than its items) become plain tuples."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        items = [map_tensors(fn, o) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, list):
        return [map_tensors(fn, o) for o in obj]
    if isinstance(obj, Mapping):
        mapped = {k: map_tensors(fn, v) for k, v in obj.items()}
        try:                      # dict subclasses (OrderedDict, a tokenizer's BatchEncoding) keep their type
            clone = copy.copy(obj)
        except (TypeError, AttributeError):
            return mapped
        try:
            clone.update(mapped)
        except Exception:         # transformers' ModelOutput refuses update() (a plain Exception) but takes items
            try:
                for key, value in mapped.items():
                    clone[key] = value
            except Exception:
                return mapped
        return clone
    return obj


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor of a (nested) batch, in order."""
    found: list[torch.Tensor] = []
    map_tensors(found.append, obj)
    return found


def no_arrival() -> None:
    """A device-batch object's default `on_fetched`: nobody times its batches' arrival."""


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    return map_tensors(lambda t: t.to(device, non_blocking=non_blocking), batch)


class DeviceBatches:
    """Moves each batch to the device, then prepares it there (normalize, memory format). The plain path:
    the copy is on the compute stream. `on_fetched` is called as each batch leaves the host loader, before its
    copy: the step clock's mark between waiting for input and moving it (measure.InputSpan)."""

    on_fetched: Callable[[], None] = staticmethod(no_arrival)

    def __init__(self, loader: Iterable, device: torch.device, prepare: Prepare, non_blocking: bool = False) -> None:
        self.loader, self.device, self.prepare, self.non_blocking = loader, device, prepare, non_blocking

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            self.on_fetched()
            yield self.prepare(to_device(batch, self.device, self.non_blocking))


# Two declarations: the frameworks copy batches themselves (non_blocking is theirs, or Accelerate's setting),
# while pinning is a setting of the loader they are handed.
SWITCHES = (
    Switch(("non_blocking",),
           rungs=(RungSpec("non_blocking", {"non_blocking": True, "pin_memory": True}, place=30,
                           held_note=(4, "pinned copies (--pin-memory --non-blocking)"),
                           default_in=("classification",)),),
           device_effect=effect,
           frameworks={"accelerate": "DataLoaderConfiguration(non_blocking=...)"},
           unreachable={"transformers": "the Trainer moves batches itself (its accelerator_config.non_blocking)",
                        "lightning": "Lightning moves each batch to the device itself"}),
    Switch(("pin_memory",), device_effect=effect,
           frameworks={"transformers": "TrainingArguments.dataloader_pin_memory",
                       "lightning": "the training DataLoader, rebuilt",
                       "accelerate": "the training DataLoader, rebuilt before prepare()"}),
)
