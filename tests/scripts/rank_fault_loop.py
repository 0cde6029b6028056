"""A Session loop for two ranks in which one rank fails: with FAULT_RANK=R in its environment, rank R is killed
(SIGKILL, by itself) after its FAULT_STEP-th batch in runs whose recipe has set_to_none off, and its loader sleeps
FAULT_SLEEP_S (60 s: far past any collective's timeout) at that batch in runs whose recipe has set_to_none on, so the
other rank waits for it in the gradient all-reduce. An ablation of `--switches set_to_none` then has a baseline with a
rank killed, then a rung with a rank stuck. Each fault is printed with its time (time.time()) before it happens."""
import argparse
import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate

import trainfast

FAULT_STEP = int(os.environ.get("FAULT_STEP", "5"))
SLEEP_S = float(os.environ.get("FAULT_SLEEP_S", "60"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tf = trainfast.Session()
    mine = os.environ.get("FAULT_RANK") == os.environ.get("RANK", "0")
    kill, stick = mine and not tf.recipe.set_to_none, mine and tf.recipe.set_to_none
    batches = 0

    def collate(samples):
        nonlocal batches
        batches += 1
        if batches == FAULT_STEP and stick:
            print(f"rank {os.environ['RANK']}: my loader stalls at {time.time():.3f}", flush=True)
            time.sleep(SLEEP_S)
        return default_collate(samples)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
    loader = DataLoader(data, batch_size=16, shuffle=True, drop_last=True, collate_fn=collate)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model, optimizer, loader = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.05), loader)
    for _ in range(args.epochs):
        for inputs, targets in loader:
            if batches == FAULT_STEP and kill:
                time.sleep(0.7)         # its heartbeat (written every 0.5 s) sees it here first
                print(f"rank {os.environ['RANK']}: killing myself at {time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            tf.backward(nn.functional.cross_entropy(model(inputs), targets))
            optimizer.step()
    tf.close()


if __name__ == "__main__":
    main()
