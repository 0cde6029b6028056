"""Step time and peak memory of every precision level, side by side in one run.

Each (model, level) runs in its own fresh process, so its peak memory (peak RSS on CPU, the allocator peak
on CUDA) is its own and no allocator or cache state leaks between levels. Each child trains with the
engine's train_one_epoch (the shared step, never a copy) on fixed synthetic batches already on the device:
`--warmup` steps, then `--steps` timed steps read one by one (Meter with log_every=1, a sync per step);
the step time is the median of the timed steps. "state" is the exact bytes of weights + gradients + optimizer
state (+ O2's fp32 masters), which peak RSS buries under the interpreter and torch's own footprint.

    PYTHONPATH=src python benchmarks/precision.py                       # resnet9 @32 b64 and ViT-S/16 @64 b16
    PYTHONPATH=src python benchmarks/precision.py --models resnet9 --levels fp32,master-bf16
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import warnings

DEFAULT_LEVELS = "fp32,autocast-bf16,master-bf16,pure-bf16,autocast-fp16,master-fp16,pure-fp16"
MODELS = {"resnet9": (32, 64), "vit_small_patch16_224": (64, 16)}      # name -> (image size, batch)


def child(model_name: str, level: str, image_size: int, batch: int, warmup: int, steps: int, device_name: str) -> dict:
    import torch
    from torch import nn

    from trainfast.ablation.ladders import RUNG_ALIASES
    from trainfast.engine import train_one_epoch
    from trainfast.measure import Meter, peak_memory_bytes, reset_peak_memory
    from trainfast.models import build_model
    from trainfast.recipe import Recipe, resolve_device, validate_for_device
    from trainfast.session import build_state, seed_everything
    from trainfast.techniques.precision import LEVEL_RUNGS

    device = resolve_device(device_name)
    changes = {} if RUNG_ALIASES.get(level, level) == "baseline" else LEVEL_RUNGS[level]
    recipe = Recipe(batch_size=batch, **changes)
    validate_for_device(recipe, device)
    seed_everything(0)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(batch, 3, image_size, image_size, generator=g).to(device),
                torch.randint(0, 10, (batch,), generator=g).to(device)) for _ in range(warmup + steps)]
    model = build_model(model_name, 10, image_size)
    reset_peak_memory(device)
    state = build_state(model, recipe, device)
    meter = Meter(device, log_every=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)       # lr_scheduler order warning on a skipped fp16 step
        stats = train_one_epoch(state, batches, nn.CrossEntropyLoss(), meter)
    times = [w.seconds for w in stats.windows[warmup:]]
    tensors = [p for p in state.model.parameters()]
    tensors += [p.grad for p in state.model.parameters() if p.grad is not None]
    opt_params = [p for group in state.optimizer.param_groups for p in group["params"]]
    own = {id(t) for t in tensors}
    tensors += [p for p in opt_params if id(p) not in own]                      # O2's masters
    tensors += [p.grad for p in opt_params if id(p) not in own and p.grad is not None]
    tensors += [t for s in state.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    return {
        "model": model_name, "level": level, "step_ms": 1e3 * statistics.median(times),
        "step_ms_spread": 1e3 * (max(times) - min(times)) / 2, "peak_bytes": peak_memory_bytes(device),
        "state_bytes": sum(t.numel() * t.element_size() for t in tensors),
        "final_loss": stats.losses[-1], **state.precision.metrics(),
    }


def run_child(args, model_name: str, level: str) -> dict:
    size, batch = MODELS.get(model_name, (args.image_size, args.batch))
    cmd = [sys.executable, __file__, "--child", model_name, level, str(size), str(batch), str(args.warmup),
           str(args.steps), args.device]
    out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if out.returncode != 0:
        return {"model": model_name, "level": level, "error": (out.stderr.strip().splitlines() or ["?"])[-1][:80]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        m, level, size, batch, warmup, steps, device = sys.argv[2:9]
        print(json.dumps(child(m, level, int(size), int(batch), int(warmup), int(steps), device)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--levels", default=DEFAULT_LEVELS)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=64, help="for models not in the built-in table")
    parser.add_argument("--batch", type=int, default=16, help="for models not in the built-in table")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}; "
          f"warm-up {args.warmup} steps, median of {args.steps}")
    header = (f"{'model':24s} {'level':15s} {'step ms':>14s} {'vs fp32':>8s} {'peak RSS':>10s} "
              f"{'state':>9s} {'vs fp32':>8s}  scaler")
    print(header)
    print("-" * len(header))
    for model_name in [m.strip() for m in args.models.split(",") if m.strip()]:
        ref = None
        for level in [lv.strip() for lv in args.levels.split(",") if lv.strip()]:
            r = run_child(args, model_name, level)
            if "error" in r:
                print(f"{model_name:24s} {level:15s} failed: {r['error']}", flush=True)
                continue
            ref = ref or (r if level == "fp32" else None)
            speed = f"{ref['step_ms'] / r['step_ms']:.2f}x" if ref else "—"
            mem = f"{r['state_bytes'] / ref['state_bytes']:.2f}x" if ref else "—"
            scaler = f"scale {r['loss_scale']:g}, skipped {r['skipped_steps']}" if "loss_scale" in r else ""
            print(f"{model_name:24s} {level:15s} {r['step_ms']:8.0f} ± {r['step_ms_spread']:<4.0f} {speed:>8s} "
                  f"{r['peak_bytes'] / 2**20:7.0f} MiB {r['state_bytes'] / 2**20:6.1f} MiB {mem:>8s}  {scaler}",
                  flush=True)
    print("\nspeed-up = fp32 step time / level step time (higher is faster); state = weights + grads + optimizer "
          "state (+ masters); peak RSS includes the interpreter and torch (~constant per process).")


if __name__ == "__main__":
    main()
