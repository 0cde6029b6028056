"""tf.log: scalars kept on the device and read in windows (LogBuffer)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..distributed import Dist


class LogBuffer:
    """tf.log: values stay on the device (a detached copy each, no sync). When a key already holds
    `every` values, every pending key is read at once (one sync), averaged, averaged again over ranks (one
    gloo all-reduce), and appended to `records` as {"step": values of a key logged so far, key: mean}: with
    one tf.log per step, the step the window ends at. Every rank must log the same keys as often (lockstep,
    like the training step itself), since each read is a collective."""

    def __init__(self, every: int, device: torch.device, dist: Dist) -> None:
        self.every, self.device, self.dist = every, device, dist
        self.pending: dict[str, list[torch.Tensor]] = {}
        self.counts: dict[str, int] = {}
        self.records: list[dict[str, float]] = []

    def add(self, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            if len(self.pending.get(name, ())) >= self.every:
                self.flush()
            self.pending.setdefault(name, []).append(self.as_scalar(value))
            self.counts[name] = self.counts.get(name, 0) + 1

    def as_scalar(self, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            value = value.detach().to(self.device, torch.float32, non_blocking=True)
            return value if value.numel() == 1 else value.mean()
        return torch.tensor(float(value), device=self.device)

    def flush(self) -> None:
        if not self.pending:
            return
        names = sorted(self.pending)
        means = torch.stack([torch.stack([v.reshape(()) for v in self.pending[n]]).mean() for n in names]).tolist()
        self.pending = {}
        means = [m / self.dist.world_size for m in self.dist.sum(means)]
        self.records.append({"step": max(self.counts[n] for n in names), **dict(zip(names, means))})
