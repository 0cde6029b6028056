"""Session overhead: a user's loop adopted with trainfast.Session against the same loop in plain PyTorch, side
by side in one run, with an A/A control.

Three contestants train the same architecture from the same initial weights on the same data (the default
resnet9 on the built-in digits, batch 64, fp32 with every technique off unless --precision says otherwise):
the plain loop, a second identical plain loop (the control: how far two identical loops drift apart on this
machine, the noise floor of the ratio), and the Session loop. Short rounds of a few steps rotate through the
three, so drift in machine speed hits all of them alike; the first rounds are warm-up (allocator, caches) and
excluded; every round ends with a device sync. Printed: each contestant's median and best step time, and the
medians of the paired per-round ratios Session/plain (the number the 2% target is about) and control/plain.

    python benchmarks/session_overhead.py [--rounds 30] [--steps 6] [--image-size 16] [--precision fp32|bf16]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
from typing import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainfast import Recipe, Session
from trainfast.data.datasets import load_digits, normalize, stats_tensors
from trainfast.measure import synchronize
from trainfast.models import build_model

WARMUP_ROUNDS = 2


def endless(loader: Iterable) -> Iterator:
    """Batches pass after pass (each pass a fresh iteration of the loader, as an epoch loop does)."""
    while True:
        yield from loader


def steps(n: int, model, optimizer, batches: Iterator, loss_fn, backward, autocast) -> None:
    """The loop every contestant runs; `backward` is loss.backward or tf.backward, `autocast` the plain loop's
    own context (none in fp32; the Session's model applies its precision itself). No per-step .item()."""
    model.train()
    for _ in range(n):
        inputs, targets = next(batches)
        optimizer.zero_grad()
        with autocast():
            loss = loss_fn(model(inputs), targets)
        backward(loss)
        optimizer.step()


def spread(ratios: list[float]) -> str:
    q = statistics.quantiles(ratios, n=4)
    return (f"{statistics.median(ratios):.4f} ({100 * (statistics.median(ratios) - 1):+.2f}%), "
            f"IQR {q[0]:.4f}..{q[2]:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (after 2 warm-up rounds)")
    parser.add_argument("--steps", type=int, default=6, help="steps per contestant per round")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    recipe = Recipe(precision=args.precision)
    tf = Session(recipe, device=args.device)
    device = tf.device
    split = load_digits(args.image_size)
    mean, std = stats_tensors(split.mean, split.std)
    data = TensorDataset(normalize(split.train.images, mean, std), split.train.labels)
    model = build_model("resnet9", split.num_classes, split.image_size)
    loss_fn = nn.CrossEntropyLoss()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.precision]

    def plain_autocast():         # what a plain loop writes: autocast only when it uses mixed precision
        return torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()

    def plain_contestant() -> Callable[[], None]:
        own = copy.deepcopy(model).to(device)
        optimizer = torch.optim.AdamW(own.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
        loader = DataLoader(data, batch_size=64, drop_last=True)
        batches = ((x.to(device), y.to(device)) for x, y in endless(loader))   # a plain loop's per-batch copy
        return lambda: steps(args.steps, own, optimizer, batches, loss_fn, torch.Tensor.backward, plain_autocast)

    def session_contestant() -> Callable[[], None]:
        optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
        wrapped, optimizer, loader = tf.setup(model, optimizer, DataLoader(data, batch_size=64, drop_last=True))
        batches = endless(loader)
        return lambda: steps(args.steps, wrapped, optimizer, batches, loss_fn, tf.backward, contextlib.nullcontext)

    contestants = {"plain": plain_contestant(), "control": plain_contestant(), "session": session_contestant()}
    times: dict[str, list[float]] = {name: [] for name in contestants}
    names = list(contestants)
    for i in range(WARMUP_ROUNDS + args.rounds):
        order = names[i % 3:] + names[:i % 3]           # rotate who goes first
        for name in order:
            synchronize(device)
            t0 = time.perf_counter()
            contestants[name]()
            synchronize(device)
            if i >= WARMUP_ROUNDS:
                times[name].append((time.perf_counter() - t0) / args.steps)
    session_ratio = [s / p for s, p in zip(times["session"], times["plain"])]
    control_ratio = [c / p for c, p in zip(times["control"], times["plain"])]
    print(f"session overhead — resnet9, digits {args.image_size}px, batch 64, {args.precision}, {args.rounds} rounds "
          f"(+{WARMUP_ROUNDS} warm-up) of {args.steps} steps per contestant, rotating; torch {torch.__version__}, "
          f"{device}, {torch.get_num_threads()} threads")
    for name, label in (("plain", "plain loop        "), ("control", "plain loop, again "),
                        ("session", "Session loop      ")):
        t = times[name]
        print(f"  {label}: {1e3 * statistics.median(t):7.2f} ms/step median, {1e3 * min(t):7.2f} best")
    print(f"  Session / plain, paired rounds : {spread(session_ratio)}; best/best "
          f"{min(times['session']) / min(times['plain']):.4f}")
    print(f"  control / plain (noise floor)  : {spread(control_ratio)}; best/best "
          f"{min(times['control']) / min(times['plain']):.4f}")


if __name__ == "__main__":
    main()
