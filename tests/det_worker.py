"""Worker for tests/test_detection_task.py, started as 2 ranks with torchrun's variables (or by torchrun itself:
`python -m torch.distributed.run --nproc-per-node 2 tests/det_worker.py OUT SCENARIO[,SCENARIO...]`). Each scenario
trains a tiny loss-dict model on tiny images through trainfast.train's detection task and writes
OUT/SCENARIO/rank{R}.json: its epoch record, or the error that stopped it."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from trainfast import Recipe, train
from trainfast.detection.data import DetectionSplit
from trainfast.detection.metrics import empty_prediction
from trainfast.distributed import drain_collectives
from trainfast.measure import LossTermsError, NonFiniteLossError


class TinyDetector(nn.Module):
    """A detector's interface at a fraction of a real one's cost: train mode takes (images, targets) and returns a
    dict of losses, eval mode predicts nothing. `extra` adds a loss term on rank 1 only; `nan_at` makes rank 1's
    loss_b NaN at that training call (1-based)."""

    def __init__(self, extra: bool = False, nan_at: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.rank = int(os.environ["RANK"])
        self.extra, self.nan_at, self.calls = extra, nan_at, 0

    def forward(self, images, targets=None):
        if not self.training:
            return [empty_prediction(images[0].device) for _ in images]
        self.calls += 1
        features = torch.stack([self.conv(image[None]).mean() for image in images])
        boxes = torch.stack([t["boxes"].float().mean() / 100 for t in targets])
        losses = {"loss_a": ((features - boxes) ** 2).mean(), "loss_b": features.abs().mean() * (1 + self.rank)}
        if self.rank == 1 and self.extra:
            losses["loss_extra"] = features.mean() ** 2
        if self.rank == 1 and self.calls == self.nan_at:
            losses["loss_b"] = losses["loss_b"] * float("nan")
        return losses


class TinyBoxes(Dataset):
    """`length` seeded 32x48 images with two boxes each: what the scenarios need of detection data (the built-in
    synthetic images are composed on photos scikit-learn ships, seconds of imports and decoding in each rank)."""

    def __init__(self, length: int, seed: int) -> None:
        self.length, self.seed = length, seed
        self.sizes = [(32, 48)] * length              # (height, width), as every detection dataset has them

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        rng = torch.Generator().manual_seed(self.seed * 1000 + index)
        corners = torch.randint(0, 16, (2, 2), generator=rng).float()
        boxes = torch.cat([corners, corners + torch.randint(4, 17, (2, 2), generator=rng)], 1)
        image = torch.randint(0, 256, (3, 32, 48), dtype=torch.uint8, generator=rng)
        return image, {"boxes": boxes, "labels": torch.tensor([1, 2]), "image_id": index}


SCENARIOS = {"ok": {}, "keys": {"extra": True}, "nan": {"nan_at": 3}}


def run(scenario: str) -> dict:
    split = DetectionSplit(TinyBoxes(16, seed=1), TinyBoxes(4, seed=2), ("a", "b", "c"), "tiny")
    recipe = Recipe(epochs=1, batch_size=2, log_every=2, lr=1e-3)    # 16 images, 2 ranks x 2: 4 steps per rank
    try:
        result = train(lambda: TinyDetector(**SCENARIOS[scenario]), split, recipe=recipe, device="cpu")
    except (LossTermsError, NonFiniteLossError) as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"record": result.history[-1]}


def main() -> None:
    out, scenarios = Path(sys.argv[1]), sys.argv[2].split(",")
    torch.set_num_threads(1)
    # The scenarios share one process group, opened here: a Session uses a caller's group as it is and leaves it
    # open, where a group it opened itself would be closed at the end of each train().
    torch.distributed.init_process_group("gloo")
    for scenario in scenarios:
        report = run(scenario)
        (out / scenario).mkdir(parents=True, exist_ok=True)
        (out / scenario / f"rank{os.environ['RANK']}.json").write_text(json.dumps(report))
    # Both ranks leave together and close the group: a rank that exits with gloo's threads still running aborts
    # in C++ ("terminate called without an active exception"), which torchrun reports as a failed launch.
    torch.distributed.barrier()
    drain_collectives()         # the barrier's own work object is freed by a gloo thread that needs the GIL
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
