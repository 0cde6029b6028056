"""Engine overhead: trainfast's train_one_epoch versus a plain hand-written loop, side by side in one run.

Both train the same architecture from the same initial weights on the same batches (the default resnet9
on the built-in digits, batch 64), with the same settings. Epochs alternate A/B/B/A... so drift in machine
speed hits both equally; the first round is warm-up and excluded; the result is the median step time of
each over the remaining rounds and their ratio.

    python benchmarks/engine_overhead.py [--rounds 7] [--precision fp32|bf16]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn

from trainfast import Recipe
from trainfast.data.datasets import load_digits
from trainfast.engine import train_one_epoch
from trainfast.measure import Meter
from trainfast.models import build_model
from trainfast.trainer import build_batches, build_state, seed_everything


def plain_epoch(model, optimizer, batches, loss_fn, autocast_dtype) -> int:
    """What a user writes by hand. No per-step .item(): the fairest (fastest) plain loop."""
    steps = 0
    model.train()
    for inputs, targets in batches:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype != torch.float32):
            loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        steps += 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()

    device = torch.device("cpu")
    recipe = Recipe(precision=args.precision, log_every=10)
    split = load_digits(32)
    seed_everything(recipe.seed)
    model = build_model("resnet9", split.num_classes)
    plain_model = copy.deepcopy(model)
    state = build_state(model, recipe, device)
    plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    batches = build_batches(split.train, split, recipe, device, train=True)
    loss_fn = nn.CrossEntropyLoss()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.precision]

    def run_engine() -> float:
        t0 = time.perf_counter()
        stats = train_one_epoch(state, batches, loss_fn, Meter(device, recipe.log_every, first_step=state.step))
        return (time.perf_counter() - t0) / len(stats.losses)

    def run_plain() -> float:
        t0 = time.perf_counter()
        steps = plain_epoch(plain_model, plain_opt, batches, loss_fn, dtype)
        return (time.perf_counter() - t0) / steps

    engine_times, plain_times = [], []
    for i in range(args.rounds + 1):
        order = (run_engine, run_plain) if i % 2 == 0 else (run_plain, run_engine)
        for fn in order:
            t = fn()
            if i:   # round 0 is warm-up
                (engine_times if fn is run_engine else plain_times).append(t)
    e, p = statistics.median(engine_times), statistics.median(plain_times)
    print(f"engine overhead benchmark — resnet9, digits 32px, batch {recipe.batch_size}, {args.precision}, "
          f"{args.rounds} rounds, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"  plain loop : {1e3 * p:7.2f} ms/step (min {1e3 * min(plain_times):.2f}, max {1e3 * max(plain_times):.2f})")
    print(f"  engine     : {1e3 * e:7.2f} ms/step (min {1e3 * min(engine_times):.2f}, max {1e3 * max(engine_times):.2f})")
    print(f"  ratio engine/plain: {e / p:.4f}  ({100 * (e / p - 1):+.2f}%)")


if __name__ == "__main__":
    main()
