"""Write an image folder of photo-like JPEGs for GPU workloads, in parallel on every core: ROOT/train and
ROOT/val, 10 classes, each image a smooth colour field (a bicubic upscale of an 8x8 random grid, the class
tinting one channel) with pixel noise, 320x256 by default, saved at quality 90. Decoding such a file costs about
what a photo of its size costs (the noise keeps it from compressing to nothing); nothing is downloaded.

    python benchmarks/make_jpeg_folder.py ROOT [--train 19200] [--val 640] [--height 256]
"""
from __future__ import annotations

import argparse
import os
from multiprocessing import Pool
from pathlib import Path

CLASSES = 10


def write_one(job: tuple[str, str, int, int]) -> None:
    import numpy as np
    from PIL import Image

    root, split, index, height = job
    label = index % CLASSES
    rng = np.random.default_rng(index * 7 + (split == "val"))
    low = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
    channel = label % 3
    low[..., channel] = np.clip(low[..., channel].astype(int) + 40 * (label // 3), 0, 255)
    field = np.asarray(Image.fromarray(low).resize((height + 64, height), Image.BICUBIC)).astype(np.int16)
    pixels = np.clip(field + rng.integers(-12, 12, field.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(Path(root, split, f"c{label}", f"{index}.jpg"), quality=90)


def make_jpeg_folder(root: str | Path, train: int = 19200, val: int = 640, height: int = 256) -> Path:
    root = Path(root)
    for split in ("train", "val"):
        for label in range(CLASSES):
            (root / split / f"c{label}").mkdir(parents=True, exist_ok=True)
    jobs = [(str(root), "train", i, height) for i in range(train)] + [(str(root), "val", i, height) for i in range(val)]
    with Pool(os.cpu_count()) as pool:
        pool.map(write_one, jobs, chunksize=64)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--train", type=int, default=19200)
    parser.add_argument("--val", type=int, default=640)
    parser.add_argument("--height", type=int, default=256, help="image height; the width is 64 more")
    args = parser.parse_args()
    make_jpeg_folder(args.root, args.train, args.val, args.height)
    print(f"wrote {args.train} train + {args.val} val JPEGs of {args.height + 64}x{args.height} to {args.root}")


if __name__ == "__main__":
    main()
