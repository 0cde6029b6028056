"""What the doctor's corpus of loops shares: tiny data, a tiny model, and the mistakes one can plant.

Every loop in this folder trains the same small conv net on the same random 1x16x16 images for a few short
epochs (24 steps each) and evaluates at the end of each epoch, as most scripts do. `--plant NAME` writes one
mistake into it (`--plant A,B`: several); without it (or `--plant clean`) it is the clean twin: zero_grad frees
the gradients every step, evaluation runs under no_grad/inference_mode after model.eval(), dropout is an
nn.Dropout, the loss is read once per log window or epoch, and the loader's batches are ready at once. Each
file runs as a script (`python engine_loop.py --plant no_zero_grad`) or in-process (`main(["--plant", ...])`).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# the mistake planted -> the doctor finding that must say "problem" for it (and nowhere else)
PLANTS = {
    "no_zero_grad": "zero_grad without set_to_none",             # zero_grad never called
    "zero_grad_in_place": "zero_grad without set_to_none",       # zero_grad(set_to_none=False)
    "eval_with_grad": "evaluation builds an autograd graph",     # model.eval(), but no no_grad/inference_mode
    "eval_in_train_mode": "evaluation without model.eval()",     # no_grad, but model.eval() never called
    "functional_dropout": "dropout active in eval mode",         # F.dropout(x, p) without training=
    "item_per_step": "host-device syncs per step",               # loss.item() every step
    "slow_loader": "num_workers=0",                              # a slow dataset read in the training process
}
BATCH, STEPS_PER_EPOCH, VAL_BATCHES = 16, 24, 4
DELAY_S = 0.002          # the slow dataset's per-sample cost: 32 ms a batch, about 3x the model's step here


class Net(nn.Module):
    """Two convs and a linear head. `functional_dropout`: F.dropout without training= (it drops in eval() too)
    instead of the nn.Dropout module (which follows train()/eval())."""

    def __init__(self, functional_dropout: bool = False) -> None:
        super().__init__()
        self.functional_dropout = functional_dropout
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.dropout = nn.Dropout(0.25)
        self.fc = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x):
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = torch.flatten(x, 1)
        x = F.dropout(x, 0.25) if self.functional_dropout else self.dropout(x)
        return self.fc(x)


class SlowImages(TensorDataset):
    """Each sample costs DELAY_S to read (a decode from disk, say)."""

    def __getitem__(self, index):
        time.sleep(DELAY_S)
        return super().__getitem__(index)


def datasets(slow: bool) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(0)
    n_train, n_val = BATCH * STEPS_PER_EPOCH, BATCH * VAL_BATCHES
    images = torch.randn(n_train + n_val, 1, 16, 16, generator=g)
    labels = torch.randint(0, 10, (n_train + n_val,), generator=g)
    train = (SlowImages if slow else TensorDataset)(images[:n_train], labels[:n_train])
    return train, TensorDataset(images[n_train:], labels[n_train:])


def parse(argv: list[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--plant", type=plants, default=frozenset(), metavar="NAME[,NAME...]",
                        help=f"the mistakes to plant: {', '.join(PLANTS)}; clean (the default): none")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--log-interval", type=int, default=10)
    return parser.parse_args(argv)


def plants(text: str) -> frozenset[str]:
    names = frozenset(text.split(",")) - {"clean"}
    unknown = names - set(PLANTS)
    if unknown:
        raise argparse.ArgumentTypeError(f"no such mistake: {', '.join(sorted(unknown))}")
    return names


def build(args: argparse.Namespace) -> tuple[nn.Module, DataLoader, DataLoader]:
    torch.manual_seed(0)
    train_set, val_set = datasets(slow="slow_loader" in args.plant)
    train_loader = DataLoader(train_set, batch_size=BATCH, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=BATCH)
    return Net(functional_dropout="functional_dropout" in args.plant), train_loader, val_loader
