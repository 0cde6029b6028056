"""Engine overhead: trainfast's train_one_epoch versus a plain hand-written loop, side by side in one run.

Both train the same architecture from the same initial weights on the same batches, with the same settings:
by default the resnet9 on the built-in digits (batch 64); with --model (a timm name, e.g. resnet18) a few
random batches of --image-size held in memory, so the loop alone is timed, not the input pipeline (which
is how the peers benchmark's ResNet-18 128 workload separates the step from decoding). A third contestant is
the engine with set_to_none, the zero_grad a plain loop gets by default. Rounds rotate the contestants so
drift in machine speed hits all alike; the first round is warm-up and excluded; the result is each one's
median step time and the median of its per-round ratios to the plain loop.

    python benchmarks/engine_overhead.py [--rounds 7] [--precision fp32|bf16]
    python benchmarks/engine_overhead.py --model resnet18 --image-size 128 --batch-size 128 --precision bf16
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Callable

import torch
from torch import nn

from trainfast import Recipe
from trainfast.data.datasets import load_digits
from trainfast.data.pipeline import build_batches
from trainfast.engine import train_one_epoch
from trainfast.measure import Meter
from trainfast.models import build_model
from trainfast.session import build_state, seed_everything


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
    parser.add_argument("--model", default="resnet9", help="resnet9 on the digits, or a timm name on random batches")
    parser.add_argument("--image-size", type=int, default=128, help="with a timm --model")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the recipe's (64)")
    parser.add_argument("--batches", type=int, default=3, help="random batches per round, with a timm --model")
    args = parser.parse_args()

    device = torch.device("cpu")
    recipe = Recipe(precision=args.precision, log_every=10, batch_size=args.batch_size or Recipe().batch_size)
    seed_everything(recipe.seed)
    if args.model == "resnet9":
        split = load_digits(32)
        model = build_model("resnet9", split.num_classes)
        batches = list(build_batches(split.train, split, recipe, device, train=True))
        what = f"resnet9, digits 32px, batch {recipe.batch_size}"
    else:
        model = build_model(args.model, 10, args.image_size)
        g = torch.Generator().manual_seed(0)
        batches = [(torch.randn(recipe.batch_size, 3, args.image_size, args.image_size, generator=g),
                    torch.randint(0, 10, (recipe.batch_size,), generator=g)) for _ in range(args.batches)]
        what = f"{args.model}, random {args.image_size}px batches held in memory, batch {recipe.batch_size}"
    plain_model = copy.deepcopy(model)
    states = {"engine": build_state(copy.deepcopy(model), recipe, device),
              "engine + set_to_none": build_state(model, recipe.replace(set_to_none=True), device)}
    plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.precision]

    def engine(state) -> Callable[[], float]:
        def run() -> float:
            t0 = time.perf_counter()
            stats = train_one_epoch(state, batches, loss_fn, Meter(device, recipe.log_every, first_step=state.step))
            return (time.perf_counter() - t0) / len(stats.losses)
        return run

    def run_plain() -> float:
        t0 = time.perf_counter()
        steps = plain_epoch(plain_model, plain_opt, batches, loss_fn, dtype)
        return (time.perf_counter() - t0) / steps

    contestants = {"plain loop": run_plain, **{name: engine(state) for name, state in states.items()}}
    names = list(contestants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(args.rounds + 1):
        for name in names[i % len(names):] + names[:i % len(names)]:     # rotated: drift hits all alike
            t = contestants[name]()
            if i:   # round 0 is warm-up
                times[name].append(t)
    print(f"engine overhead benchmark — {what}, {args.precision}, {args.rounds} rounds, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    for name in names:
        ratios = [a / b for a, b in zip(times[name], times["plain loop"])]
        print(f"  {name:21s}: {1e3 * statistics.median(times[name]):8.2f} ms/step (min {1e3 * min(times[name]):.2f}, "
              f"max {1e3 * max(times[name]):.2f})  /plain, median of rounds {statistics.median(ratios):.4f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
