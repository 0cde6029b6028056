"""What Session.setup() returns for a loader (SessionLoader): a DataLoader's passes, epoch by epoch, on the
device."""
from __future__ import annotations

from typing import Any, Iterable, Iterator

from ..data.adopt import adopt_loader, epoch_sampler, loader_generators
from ..data.device import build_device_batches
from .state import TrainState


def adopt(loader: Iterable, recipe, dist, state: TrainState, marks_last: bool, mean=None, std=None) -> "SessionLoader":
    """A script's loader as setup() returns it: the recipe's loader switches on it (data/adopt.py), its batches on
    the run's device (data/device.py); `marks_last`: the training loader (the first given to setup)."""
    adopted = adopt_loader(loader, recipe, dist.device, dist, mean, std, train=marks_last)
    batches = build_device_batches(adopted, recipe, dist.device, mean, std)
    return SessionLoader(adopted, batches, state, marks_last)


class SessionLoader:
    """What setup() returns for a loader: every pass sets the epoch on a DistributedSampler (a new shuffle per
    epoch, the same on every rank), moves the batches to the device and prepares them (data/device.py), and
    for the training loader (the first one given to setup) marks the epoch's last batch for accumulation.
    Attributes it lacks (dataset, batch_size, sampler...) are the DataLoader's."""

    def __init__(self, loader: Iterable, batches: Iterable, state: TrainState, marks_last: bool) -> None:
        self.loader, self.batches, self.train_state, self.marks_last = loader, batches, state, marks_last
        self.epoch = 0                        # passes started; saved by Session.save

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator:
        sampler = epoch_sampler(self.loader)
        if sampler is not None:
            sampler.set_epoch(self.epoch)
        self.epoch += 1
        return self.train_state.batches(self.batches) if self.marks_last else iter(self.batches)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "generators": [g.get_state() for g in loader_generators(self.loader)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        for generator, saved in zip(loader_generators(self.loader), state["generators"]):
            generator.set_state(saved)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "batches", "train_state", "marks_last"):
            raise AttributeError(name)
        return getattr(self.loader, name)
