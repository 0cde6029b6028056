"""What aspect-ratio grouping buys a detector: padding saved and step time, grouped vs not, side by side.

Faster R-CNN pads every batch to its largest resized image (detection/batching.py); grouping batches by aspect
ratio shrinks that padding, and the backbone computes fewer zeros. This prints, for the built-in detection
data and a detection model, both ways:
  - padding: the share of the padded batch canvases that is padding over one epoch's batches, after the
    model's own resize (detection.batching.padding_fraction; 0 for SSD, which resizes to one fixed size);
  - step time: the median of `--steps` timed training steps after `--warmup` steps, each step read on its
    own (a Meter with log_every=1: one sync per step), with the built-in loop's train_one_epoch (the shared
    step, never a copy) on the built-in detection loader (build_detection_loader: grouped or shuffled).
Repeats are interleaved (grouped then plain, then plain then grouped, ...) so a slow spell of the machine hits
both; every repeat starts from the same seed, weights and data order. The ratio is the median over repeats of
plain / grouped step time (above 1: grouping is faster), with every repeat's ratio shown.

    PYTHONPATH=src python benchmarks/detection_grouping.py                    # Faster R-CNN, 5 repeats of 20 steps
    PYTHONPATH=src python benchmarks/detection_grouping.py --steps 2 --warmup 1 --repeats 1     # a quick check
"""
from __future__ import annotations

import argparse
import json
import statistics
from itertools import islice


def padding(model, dataset, batch_size: int, grouped: bool, seed: int) -> float:
    """Padding share over one epoch of the batches the loader would draw, as the model resizes them."""
    from trainfast.detection.batching import GroupedBatchSampler, padding_fraction, random_batches

    transform = model.transform
    if transform.fixed_size:                      # SSD: every image resized to one size, nothing padded
        return 0.0
    resize = (min(transform.min_size), transform.max_size)
    batches = (list(GroupedBatchSampler(dataset.sizes, batch_size, seed=seed)) if grouped
               else random_batches(len(dataset), batch_size, seed=seed))
    return padding_fraction(batches, dataset.sizes, resize=resize)


def run(model_name: str, grouped: bool, batch_size: int, warmup: int, steps: int, seed: int) -> dict:
    """One timed run: fresh model and state from `seed`, `warmup + steps` steps of the shared training step."""
    import torch

    from trainfast.detection import load_detection_data
    from trainfast.distributed import Dist
    from trainfast.engine import train_one_epoch
    from trainfast.measure import Meter
    from trainfast.session import build_state, seed_everything
    from trainfast.tasks.detection import Detection

    device = torch.device("cpu")
    task = Detection()
    recipe = Detection.default_recipe.replace(batch_size=batch_size, seed=seed, group_aspect_ratio=grouped)
    split = load_detection_data("synthetic")
    seed_everything(seed)
    model = task.build_model(model_name, split)
    state = build_state(model, recipe, device)
    dist = Dist(device)
    train_batches, _ = task.build_loaders(split, recipe, device, dist)
    task.apply_schedule(state, len(train_batches))
    dist.set_epoch(0)
    meter = Meter(device, log_every=1, score=task.score)
    stats = train_one_epoch(state, islice(train_batches, warmup + steps), task, meter)
    times = [w.seconds for w in stats.windows[warmup:]]
    images = sum(w.samples for w in stats.windows[warmup:])
    return {"grouped": grouped, "padding": padding(model, split.train, batch_size, grouped, seed),
            "step_s": statistics.median(times), "images_per_s": images / sum(times), "steps": len(times),
            "recipe": recipe.to_dict()}


def main() -> None:
    import torch

    from trainfast.detection.models import DEFAULT_DETECTION_MODEL, DETECTION_MODELS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_DETECTION_MODEL, choices=DETECTION_MODELS)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3,
                        help="steps run before the timed ones (first touch, allocator)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved (grouped, plain) pairs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write every run's numbers to this file")
    args = parser.parse_args()

    runs = []
    for repeat in range(args.repeats):
        order = (True, False) if repeat % 2 == 0 else (False, True)
        for grouped in order:
            result = run(args.model, grouped, args.batch_size, args.warmup, args.steps, args.seed)
            runs.append({"repeat": repeat, **result})
            print(f"repeat {repeat} {'grouped' if grouped else 'plain  '}: padding {result['padding']:.1%}, "
                  f"median step {result['step_s']:.3f} s, {result['images_per_s']:.2f} images/s", flush=True)
    by = {g: [r for r in runs if r["grouped"] == g] for g in (False, True)}
    ratios = [p["step_s"] / g["step_s"] for p, g in zip(by[False], by[True])]
    print(f"\n{args.model}, batch {args.batch_size}, {args.steps} timed steps x {args.repeats} repeats "
          f"(torch {torch.__version__}, {torch.get_num_threads()} threads)")
    print(f"{'':8} {'padding':>8} {'median step s':>14} {'images/s':>9}")
    for grouped, label in ((False, "plain"), (True, "grouped")):
        rows = by[grouped]
        print(f"{label:8} {rows[0]['padding']:>8.1%} {statistics.median(r['step_s'] for r in rows):>14.3f} "
              f"{statistics.median(r['images_per_s'] for r in rows):>9.2f}")
    print(f"plain / grouped step time: {statistics.median(ratios):.3f}x (median; per repeat: "
          f"{', '.join(f'{r:.3f}' for r in ratios)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "runs": runs, "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    main()
