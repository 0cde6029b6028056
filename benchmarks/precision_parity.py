"""Accuracy parity of the precision levels: train the default model on the built-in
digits data for the same epochs, over several seeds per level, with the shared engine (trainfast.train), and
compare each level's held-out accuracy with fp32's.

Band: a level is "within band" when |mean(level) - mean(fp32)| <= scoring.metric_band(mean(fp32), n_val),
the same noise band the ablation report flags rungs with (two binomial standard errors of a difference of two
accuracies on the same n held-out images). Averaging over seeds only shrinks the real noise, so the band is
conservative.

    PYTHONPATH=src python benchmarks/precision_parity.py --seeds 3 --epochs 1
    PYTHONPATH=src python benchmarks/precision_parity.py --levels fp32,master-fp16 --seeds 5
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

from trainfast import train
from trainfast.ablation.ladders import RUNG_ALIASES
from trainfast.ablation.scoring import metric_band
from trainfast.data.loading import load_data
from trainfast.measure import NonFiniteLossError
from trainfast.models import DEFAULT_MODEL, build_model
from trainfast.recipe import Recipe, resolve_device, validate_for_device
from trainfast.techniques.precision import LEVEL_RUNGS

DEFAULT_LEVELS = "fp32,autocast-bf16,master-bf16,pure-bf16,autocast-fp16,master-fp16,pure-fp16"


def level_recipe(name: str, base: Recipe) -> Recipe:
    if RUNG_ALIASES.get(name, name) == "baseline":
        return base
    if name not in LEVEL_RUNGS:
        raise SystemExit(f"--levels: {name!r} is not fp32 or one of {', '.join(LEVEL_RUNGS)}")
    return base.replace(**LEVEL_RUNGS[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default=DEFAULT_LEVELS)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--image-size", type=int, default=32, help="digits resolution (default 32: the README table)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    device = resolve_device(args.device)
    split = load_data("digits", args.image_size)
    base = Recipe(epochs=args.epochs)
    levels = [name.strip() for name in args.levels.split(",") if name.strip()]
    recipes = {name: level_recipe(name, base) for name in levels}
    for name, recipe in recipes.items():
        validate_for_device(recipe, device)           # refuse an unsupported level before any training
    n_val = len(split.val)
    print(f"model={args.model} data=digits@{split.image_size}px (val n={n_val}) epochs={args.epochs} "
          f"seeds={args.seeds} device={device}")

    results: dict[str, list] = {}
    for name, recipe in recipes.items():
        accs = []
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    run = train(lambda: build_model(args.model, split.num_classes, split.image_size), split,
                                recipe=recipe.replace(seed=seed), device=device)
                acc = run.history[-1]["val_accuracy"]
                extra = {k: run.history[-1][k] for k in ("loss_scale", "skipped_steps") if k in run.history[-1]}
            except NonFiniteLossError as exc:
                acc, extra = None, {"failed": str(exc)[:60]}
            accs.append(acc)
            print(f"  {name:14s} seed {seed}: accuracy {acc if acc is None else f'{acc:.4f}'}  "
                  f"({time.perf_counter() - t0:.0f} s) {extra or ''}", flush=True)
        results[name] = accs

    ref = [a for a in results.get("fp32", []) if a is not None]
    ref_mean = statistics.mean(ref) if ref else None
    band = metric_band(ref_mean, n_val) if ref_mean is not None else None
    print()
    print(f"{'level':16s} {'accuracy mean ± std':>22s} {'delta vs fp32':>14s}  within band (±{band:.3f})" if band
          else f"{'level':16s} {'accuracy mean ± std':>22s}")
    for name, accs in results.items():
        ok = [a for a in accs if a is not None]
        if not ok:
            print(f"{name:16s} {'all runs diverged':>22s}")
            continue
        mean = statistics.mean(ok)
        std = statistics.stdev(ok) if len(ok) > 1 else 0.0
        line = f"{name:16s} {mean:>13.4f} ± {std:.4f}"
        if ref_mean is not None:
            delta = mean - ref_mean
            line += f" {delta:>+14.4f}  {'yes' if abs(delta) <= band else 'NO'}"
        if len(ok) < len(accs):
            line += f"  ({len(accs) - len(ok)} of {len(accs)} runs diverged)"
        print(line)


if __name__ == "__main__":
    main()
