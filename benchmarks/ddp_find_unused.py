"""What DDP's find_unused_parameters=True costs, side by side in one run: the same small deep MLP trained
by the shared engine (trainfast.train) as 2 gloo processes on this CPU, with the flag off and on,
alternating, several trials; prints median steady-state throughput and the ratio.

    PYTHONPATH=src python benchmarks/ddp_find_unused.py [--trials 3] [--depth 24]

The flag makes DDP traverse the autograd graph after every forward to find parameters that will get no
gradient; trainfast turns it on only when its first-step probe finds such parameters."""
from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn


def build_model(depth: int) -> nn.Module:
    layers = [nn.Flatten(), nn.Linear(3 * 16 * 16, 128), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(128, 128), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(128, 10))


def worker(find_unused: bool, depth: int) -> float:
    from trainfast import Recipe, train
    from trainfast.data.datasets import load_synthetic
    from trainfast.measure import Timing

    steps = []
    recipe = Recipe(optimizer="sgd", lr=0.01, batch_size=32, log_every=10, find_unused_parameters=find_unused)
    result = train(lambda: build_model(depth), load_synthetic(16, n=1024), recipe=recipe, device="cpu",
                   on_window=lambda step, stats: steps.__setitem__(slice(None), stats.steps))
    del result
    return Timing.from_steps(steps).throughput   # rank 0's samples/s after warm-up (ranks run in lockstep)


def main() -> None:
    from trainfast.distributed import launch_local

    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--depth", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rates = {False: [], True: []}
    for trial in range(args.trials):
        for flag in (False, True):
            rate = launch_local(worker, (flag, args.depth), nproc=2, run_id=f"bench-{trial}-{flag}")
            rates[flag].append(rate)
            print(f"trial {trial} find_unused_parameters={flag}: {rate:.0f} samples/s per rank")
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"median off {off:.0f}, on {on:.0f} samples/s per rank; on/off = {on / off:.3f}")


if __name__ == "__main__":
    main()
