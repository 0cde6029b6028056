"""Shared by the loops in this folder: the digits that ship with scikit-learn as 1x8x8 images, two small models."""
import torch
from torch import nn
from sklearn.datasets import load_digits

def digits(split=0.8):
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    x, y = x[perm], y[perm]
    n = int(len(x) * split)
    return (x[:n], y[:n]), (x[n:], y[n:])

class SmallCNN(nn.Module):
    def __init__(self, p=0.2):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU())
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(p), nn.Linear(32 * 4 * 4, 10))
    def forward(self, x):
        return self.head(self.features(x))

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
    def forward(self, x):
        return self.net(x)
