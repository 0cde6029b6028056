"""Session overhead: a user's loop adopted with trainfast.Session against the same loop in plain PyTorch, side
by side in one run.

Both train the same architecture from the same initial weights on the same data (the default resnet9 on the
built-in digits, batch 64, fp32 with every technique off unless --precision says otherwise), each through its
own DataLoader over the same tensors. Rounds of one epoch alternate A/B/B/A... so drift in machine speed hits
both equally; the first round of each is warm-up (allocator, caches) and excluded; every round ends with a
device sync. Printed: the median step time of each over the remaining rounds, and the median of the paired
per-round ratios (Session / plain), the number the 2% target is about.

    python benchmarks/session_overhead.py [--rounds 9] [--image-size 16] [--precision fp32|bf16]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainfast import Recipe, Session
from trainfast.data.datasets import load_digits, normalize, stats_tensors
from trainfast.measure import synchronize
from trainfast.models import build_model


def epoch(model, optimizer, loader, loss_fn, backward, autocast) -> int:
    """The loop both sides run; `backward` is loss.backward or tf.backward. No per-step .item()."""
    steps = 0
    model.train()
    for inputs, targets in loader:
        optimizer.zero_grad()
        with autocast():
            loss = loss_fn(model(inputs), targets)
        backward(loss)
        optimizer.step()
        steps += 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds of each (after one warm-up round)")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    recipe = Recipe(precision=args.precision)
    tf = Session(recipe, device=args.device)
    device = tf.device
    split = load_digits(args.image_size)
    mean, std = stats_tensors(split.mean, split.std)
    images = normalize(split.train.images, mean, std)
    data = TensorDataset(images, split.train.labels)
    model = build_model("resnet9", split.num_classes, split.image_size)
    plain_model = copy.deepcopy(model).to(device)
    plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    plain_loader = DataLoader(data, batch_size=64, drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    model, optimizer, loader = tf.setup(model, optimizer, DataLoader(data, batch_size=64, drop_last=True))
    loss_fn = nn.CrossEntropyLoss()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.precision]

    def plain_autocast():
        return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def timed(fn) -> float:
        synchronize(device)
        t0 = time.perf_counter()
        steps = fn()
        synchronize(device)
        return (time.perf_counter() - t0) / steps

    def run_session() -> float:
        return timed(lambda: epoch(model, optimizer, loader, loss_fn, tf.backward, tf.autocast))

    def run_plain() -> float:
        batches = ((x.to(device), y.to(device)) for x, y in plain_loader)     # what a plain loop does per batch
        return timed(lambda: epoch(plain_model, plain_opt, batches, loss_fn, torch.Tensor.backward, plain_autocast))

    session_times, plain_times, ratios = [], [], []
    for i in range(args.rounds + 1):
        order = (run_session, run_plain) if i % 2 == 0 else (run_plain, run_session)
        pair = {fn: fn() for fn in order}
        if i:   # round 0 is warm-up
            session_times.append(pair[run_session])
            plain_times.append(pair[run_plain])
            ratios.append(pair[run_session] / pair[run_plain])
    s, p, r = statistics.median(session_times), statistics.median(plain_times), statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [min(ratios), r, max(ratios)]
    print(f"session overhead — resnet9, digits {args.image_size}px, batch 64, {args.precision}, {len(loader)} steps "
          f"per round, {args.rounds} rounds + 1 warm-up, alternating; torch {torch.__version__}, {device}, "
          f"{torch.get_num_threads()} threads")
    print(f"  plain loop   : {1e3 * p:7.2f} ms/step (min {1e3 * min(plain_times):.2f}, max {1e3 * max(plain_times):.2f})")
    print(f"  Session loop : {1e3 * s:7.2f} ms/step (min {1e3 * min(session_times):.2f}, "
          f"max {1e3 * max(session_times):.2f})")
    print(f"  ratio Session/plain: median of paired rounds {r:.4f} ({100 * (r - 1):+.2f}%), interquartile "
          f"{q[0]:.4f}..{q[-1]:.4f}; ratio of medians {s / p:.4f}")


if __name__ == "__main__":
    main()
