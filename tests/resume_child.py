"""Child process for tests/test_resume.py: trains a tiny model on synthetic data into a run folder with
resume="auto", appends every step's loss to a file, and SIGKILLs itself once at each of the given steps."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

from trainfast import Recipe, train
from trainfast.data.datasets import load_synthetic


def tiny_model() -> nn.Module:
    # Dropout draws from torch's global RNG every step: a resume that lost the RNG state would diverge.
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(8, 10))


def main(out: str, recipe_json: str, kill_steps: set[int]) -> None:
    torch.set_num_threads(1)
    recipe = Recipe.from_dict(json.loads(recipe_json))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    losses = open(out_dir / "losses.jsonl", "a", buffering=1)
    def on_window(step, stats):
        losses.write(json.dumps({"step": step, "loss": stats.losses[-1]}) + "\n")
        marker = out_dir / f"killed-at-{step}"
        if step in kill_steps and not marker.exists():
            marker.touch()
            losses.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    split = load_synthetic(image_size=8, n=400)          # 320 training images: 20 steps of 16 per epoch
    train(tiny_model, split, recipe=recipe, device="cpu", out=out_dir, on_window=on_window, resume="auto")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], {int(s) for s in sys.argv[3].split(",") if s})
