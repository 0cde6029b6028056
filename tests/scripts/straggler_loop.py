"""A Session loop for two ranks in which one rank can be made a straggler: with STRAGGLER_RANK=R in its environment,
rank R's loader sleeps STRAGGLER_SLEEP_S (30 ms) for each batch, but only in runs whose recipe has set_to_none on.
An ablation of `--switches set_to_none` then has both cases in one ladder: its baseline with nothing planted, its
set_to_none rung with rank R slow in its data."""
import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate

import trainfast

SLEEP_S = float(os.environ.get("STRAGGLER_SLEEP_S", "0.03"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tf = trainfast.Session()
    planted = tf.recipe.set_to_none and os.environ.get("STRAGGLER_RANK") == os.environ.get("RANK", "0")

    def collate(samples):
        if planted:
            time.sleep(SLEEP_S)
        return default_collate(samples)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
    loader = DataLoader(data, batch_size=16, shuffle=True, drop_last=True, collate_fn=collate)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model, optimizer, loader = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.05), loader)
    for _ in range(args.epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            tf.backward(nn.functional.cross_entropy(model(inputs), targets))
            optimizer.step()
    tf.close()


if __name__ == "__main__":
    main()
