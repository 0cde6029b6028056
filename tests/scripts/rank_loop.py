"""A Session loop for two ranks in which one rank can be made slow or faulty: with PLANT_RANK=R in its environment,
PLANT says what rank R does:
  straggler  its loader sleeps PLANT_SLEEP_S (30 ms) for each batch;
  kill       it kills itself (SIGKILL) after its PLANT_STEP-th (5th) batch;
  stuck      its loader sleeps 60 s at that batch (far past any collective's timeout), so the other rank waits for it
             in the gradient all-reduce.
Without them nothing is planted. An ablation's rungs plant each (`--rung killed='PLANT=kill'`, one run each) beside
a baseline with nothing planted. Each fault is printed with its time (time.time()) before it happens."""
import argparse
import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate

import trainfast

PLANTS = ("straggler", "kill", "stuck")
STEP = int(os.environ.get("PLANT_STEP", "5"))
SLEEP_S = {"straggler": float(os.environ.get("PLANT_SLEEP_S", "0.03")), "stuck": 60.0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()
    plant = os.environ.get("PLANT") if os.environ.get("PLANT_RANK") == os.environ.get("RANK", "0") else None
    assert plant in (None, *PLANTS), f"PLANT={plant}: one of {', '.join(PLANTS)}"
    torch.set_num_threads(1)
    tf = trainfast.Session()
    batches = 0

    def collate(samples):
        nonlocal batches
        batches += 1
        if plant == "straggler":
            time.sleep(SLEEP_S[plant])
        elif plant == "stuck" and batches == STEP:
            print(f"rank {os.environ['RANK']}: my loader stalls at {time.time():.3f}", flush=True)
            time.sleep(SLEEP_S[plant])
        return default_collate(samples)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
    loader = DataLoader(data, batch_size=16, shuffle=True, drop_last=True, collate_fn=collate)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model, optimizer, loader = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.05), loader)
    for _ in range(args.epochs):
        for inputs, targets in loader:
            if plant == "kill" and batches == STEP:
                time.sleep(0.7)         # its heartbeat (written every 0.5 s) sees it here first
                print(f"rank {os.environ['RANK']}: killing myself at {time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            tf.backward(nn.functional.cross_entropy(model(inputs), targets))
            optimizer.step()
    tf.close()


if __name__ == "__main__":
    main()
