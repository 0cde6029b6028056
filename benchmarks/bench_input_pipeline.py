"""The input-pipeline claim, end to end: build the photo folder (400 real photos at 500x375 from
scikit-learn's sample images, see make_photo_folder.py) if it is missing, then run `trainfast bench-data`
on it: trainfast's pipeline beside torchvision's default ImageFolder pipeline in the same run, batch 64,
2 workers, RandomResizedCrop(224) + flip, median images/s over alternating passes, and the ratio.

    python benchmarks/bench_input_pipeline.py [--folder /tmp/trainfast-photos] [--workers 2] [--passes 5]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_photo_folder import make_photo_folder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", default="/tmp/trainfast-photos")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--workers", default="2")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    folder = Path(args.folder)
    if not folder.is_dir():
        make_photo_folder(folder, args.images)
    from trainfast.bench_data import bench_data

    workers = args.workers if args.workers == "auto" else int(args.workers)
    bench_data(f"imagefolder:{folder}", batch_size=args.batch_size, num_workers=workers, passes=args.passes)


if __name__ == "__main__":
    main()
