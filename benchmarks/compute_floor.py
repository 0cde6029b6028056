"""How much faster than a peer any recipe could be: the compute floor of an epoch.

For a peers.py workload (model, image size, batch size, training photos), the time of one training step with
the data already in memory, nothing else in the step (no loader, no evaluation, no checkpoint, no logging):
forward, backward and the AdamW update, in each way the step's arithmetic can be made cheaper without
changing the optimization: bf16 autocast (what the peers run), + channels_last, + torch.compile, and bf16
weights and optimizer state throughout (cheaper than any mixed-precision level that keeps fp32 master
weights, so a lower bound for them), and each of those with freed memory kept mapped for the next step
(`+reuse_memory`: glibc's malloc set by trainfast's switch, so a step does not page-fault its activations anew). The
fastest of these, times the epoch's steps, is the epoch's compute floor; a peer's measured epoch divided by it is the
largest speed-up any tool could give at the same model, batch size and epoch length. If that ratio is below a target
(1.3x), no recipe can reach it here: the remaining cost is the arithmetic itself.

Variants alternate in rounds (every variant once, then again, in a rotated order), so a slow spell of the
machine hits all alike; the first steps of each variant (compilation, allocator) are excluded; the floor is
the median over rounds of each round's median step.

    PYTHONPATH=src python benchmarks/compute_floor.py --workloads r18-128,vit-224 [--rounds 5] [--out FILE]

Nothing else may run on the machine meanwhile: these are wall-clock timings.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
from peers import WORKLOADS
from torch import nn

from trainfast.techniques import memory_reuse

VARIANTS = ("bf16", "bf16+channels_last", "bf16+compile", "bf16+channels_last+compile", "bf16-weights",
            "bf16-weights+compile", "bf16+channels_last+reuse_memory", "bf16+channels_last+compile+reuse_memory",
            "bf16-weights+reuse_memory")


class Step:
    """One variant's training step on a fixed batch: model, fused AdamW, loss, in the variant's precision."""

    def __init__(self, model_name: str, size: int, batch: int, variant: str, classes: int = 4) -> None:
        import timm

        torch.manual_seed(0)
        self.model = timm.create_model(model_name, pretrained=False, num_classes=classes)
        self.inputs = torch.randn(batch, 3, size, size)
        self.targets = torch.randint(0, classes, (batch,))
        self.autocast = "bf16-weights" not in variant
        if not self.autocast:
            self.model = self.model.to(torch.bfloat16)
            self.inputs = self.inputs.to(torch.bfloat16)
        if "channels_last" in variant:
            self.model = self.model.to(memory_format=torch.channels_last)
            self.inputs = self.inputs.contiguous(memory_format=torch.channels_last)
        self.forward = torch.compile(self.model) if "compile" in variant else self.model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3, fused=True)
        self.loss_fn = nn.CrossEntropyLoss()
        self.model.train()
        self.malloc = "reuse_memory" in variant

    def __call__(self) -> float:
        memory_reuse.apply(self.malloc)          # this variant's malloc setting (the variants share one process)
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            loss = self.loss_fn(self.forward(self.inputs).float(), self.targets)
        loss.backward()
        self.optimizer.step()
        return time.perf_counter() - start


def measure(workload: str, variants: list[str], rounds: int, steps: int, warmup: int) -> dict:
    model_name, size, batch, photos = WORKLOADS[workload]
    built = {v: Step(model_name, size, batch, v) for v in variants}
    for v, step in built.items():           # compilation and first-touch allocations, before any timing
        for _ in range(warmup):
            step()
        print(f"{workload} {v}: warmed up", flush=True)
    per_round: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for v in order:
            per_round[v].append(statistics.median(built[v]() for _ in range(steps)))
        print(f"{workload} round {r + 1}/{rounds}: " + ", ".join(f"{v} {per_round[v][-1]:.3f} s" for v in variants),
              flush=True)
    step_s = {v: statistics.median(t) for v, t in per_round.items()}
    fastest = min(step_s, key=step_s.get)
    steps_per_epoch = photos // batch           # the peers drop the last partial batch
    return {"model": model_name, "image_size": size, "batch_size": batch, "steps_per_epoch": steps_per_epoch,
            "step_s": step_s, "step_s_rounds": per_round, "fastest": fastest,
            "epoch_floor_s": step_s[fastest] * steps_per_epoch,
            "eager_bf16_epoch_s": step_s.get("bf16", math.nan) * steps_per_epoch}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="r18-128,vit-224")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant per round (their median)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args()
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS] + [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if bad:
        raise SystemExit(f"unknown variant/workload: {', '.join(bad)}")

    from trainfast.envcheck import cpu_name

    results = {"machine": cpu_name(), "threads": torch.get_num_threads(), "workloads": {}}
    for workload in args.workloads.split(","):
        results["workloads"][workload] = found = measure(workload, variants, args.rounds, args.steps, args.warmup)
        print(f"\n{workload} on {results['machine']} ({results['threads']} threads), seconds per step "
              f"(median of {args.rounds} rounds x {args.steps} steps):")
        base = found["step_s"].get("bf16")
        for v, s in sorted(found["step_s"].items(), key=lambda kv: kv[1]):
            print(f"  {v:28s} {s:.3f} s" + (f"  ({base / s:.2f}x bf16 eager)" if base else ""))
        print(f"  epoch compute floor: {found['steps_per_epoch']} steps x {found['step_s'][found['fastest']]:.3f} s = "
              f"{found['epoch_floor_s']:.1f} s ({found['fastest']})\n", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
