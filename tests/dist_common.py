"""Tiny data and model shared by the distributed tests and their torchrun worker."""
from __future__ import annotations

import torch
from torch import nn

from trainfast.data.datasets import Split, TensorImages

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def make_split(n: int = 320, size: int = 8, classes: int = 4) -> Split:
    g = torch.Generator().manual_seed(123)
    images = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, classes, (n,), generator=g)
    val = TensorImages(images[:37], labels[:37])
    return Split(TensorImages(images, labels), val, classes, MEAN, STD, size, "tiny")


class TinyNet(nn.Module):
    """BN-free on purpose: DDP does not synchronize BatchNorm statistics (each rank normalizes with its
    own batch), so a BN model on 2 x B differs from 1 x 2B by design; SyncBatchNorm would be the fix."""

    def __init__(self, unused: bool = False, classes: int = 4, size: int = 8) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * size * size, 32), nn.ReLU())
        self.head = nn.Linear(32, classes)
        self.spare = nn.Linear(32, classes) if unused else None   # never called: an unused parameter

    def forward(self, x):
        return self.head(self.body(x))


def make_model(unused: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return TinyNet(unused)
