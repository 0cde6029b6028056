"""The input-pipeline claim, end to end: build the photo folder (400 real photos at 500x375 from
scikit-learn's sample images, see make_photo_folder.py) if it is missing, then run `trainfast bench-data`
on it: trainfast's pipeline beside torchvision's default ImageFolder pipeline in the same run, batch 64,
2 workers, RandomResizedCrop(224) + flip, median images/s over alternating passes, and the ratio.

Then (--stages, on by default) where the time goes, per image on one core: each stage of both pipelines
timed alone over the same files, the stages alternating round by round, medians of the rounds. The sum
of torchvision's stages over the decode alone bounds what any pipeline that decodes every pixel with
libjpeg-turbo can gain on this machine, however cheap everything after the decode is made.

    python benchmarks/bench_input_pipeline.py [--folder /tmp/trainfast-photos] [--workers 2] [--passes 5]
                                              [--size 500x375] [--no-stages]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_photo_folder import make_photo_folder, parse_size  # noqa: E402

STAGE_FILES = 100      # images per round
STAGE_ROUNDS = 5       # rounds; each stage's result is the median of its rounds


def stage_times(folder: Path, size: int = 224) -> dict[str, float]:
    """ms per image of each stage, one thread, the same files for every stage."""
    import statistics
    import time

    import torch
    from PIL import Image
    from torchcodec.decoders import decode_jpeg
    from torchvision import transforms as T
    from torchvision.transforms.v2 import functional as TF

    from trainfast.data.datasets import normalize, stats_tensors
    from trainfast.data.imagefolder import TrainCrop

    torch.set_num_threads(1)      # what one DataLoader worker gets
    files = sorted(folder.rglob("*.jpg"))[:STAGE_FILES]
    pil = [Image.open(f).convert("RGB") for f in files]
    tensors = [decode_jpeg(str(f)) for f in files]
    crop = T.RandomResizedCrop(size)
    pil_crops = [crop(im) for im in pil]
    mean, std = stats_tensors((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    to_float = T.Compose([T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    batch = torch.stack([TrainCrop(size)(f) for f in files[:64]])
    out = torch.empty(batch.shape)        # the prefetcher normalizes into recycled buffers (HostBuffers)
    ours = TrainCrop(size)

    def uint8_crop(image: torch.Tensor) -> torch.Tensor:
        left, top, right, bottom, _ = ours.region(image.shape[-1], image.shape[-2])
        return TF.resize(image[:, top:bottom, left:right], [size, size], antialias=True)

    stages = {
        "torchvision: PIL open + decode + convert(RGB)": lambda: [Image.open(f).convert("RGB") for f in files],
        "torchvision: RandomResizedCrop + flip on PIL": lambda: [T.RandomHorizontalFlip()(crop(im)) for im in pil],
        "torchvision: ToTensor + Normalize (float32)": lambda: [to_float(im) for im in pil_crops],
        "trainfast: decode alone (torchcodec decode_jpeg)": lambda: [decode_jpeg(str(f)) for f in files],
        "trainfast: read + header + decode + crop + resize + flip": lambda: [ours(f) for f in files],
        "trainfast: uint8 crop + resize alone": lambda: [uint8_crop(t) for t in tensors],
        "trainfast: batched normalize (per image)": lambda: [normalize(batch, mean, std, out=out)
                                                             for _ in range(len(files) // 64 or 1)],
    }
    per_image = {name: len(files) for name in stages}
    per_image["trainfast: batched normalize (per image)"] = 64 * (len(files) // 64 or 1)
    rounds: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(STAGE_ROUNDS + 1):                   # the first round warms caches, not counted
        for name, run in stages.items():
            t0 = time.perf_counter()
            run()
            rounds[name].append((time.perf_counter() - t0) * 1e3 / per_image[name])
    return {name: statistics.median(times[1:]) for name, times in rounds.items()}


def print_stages(times: dict[str, float]) -> None:
    print("\nper image on one core (median of rounds):")
    for name, ms in times.items():
        print(f"  {name:<60} {ms:6.3f} ms")
    default = sum(ms for name, ms in times.items() if name.startswith("torchvision"))
    decode = times["trainfast: decode alone (torchcodec decode_jpeg)"]
    ours = (times["trainfast: read + header + decode + crop + resize + flip"]
            + times["trainfast: batched normalize (per image)"])
    print(f"  torchvision default, all stages: {default:.3f} ms; trainfast, all stages: {ours:.3f} ms "
          f"-> {default / ours:.2f}x on one core")
    print(f"  ceiling for a full-size libjpeg-turbo decode with everything after it free: "
          f"{default:.3f} / {decode:.3f} = {default / decode:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", default="/tmp/trainfast-photos")
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--workers", default="2")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--size", type=parse_size, default=(500, 375), help="photo size when making the folder")
    parser.add_argument("--no-stages", dest="stages", action="store_false", help="skip the per-stage timing")
    args = parser.parse_args()
    folder = Path(args.folder)
    if not folder.is_dir():
        make_photo_folder(folder, args.images, size=args.size)
    from trainfast.bench_data import bench_data

    workers = args.workers if args.workers == "auto" else int(args.workers)
    bench_data(f"imagefolder:{folder}", batch_size=args.batch_size, num_workers=workers, passes=args.passes)
    if args.stages:
        print_stages(stage_times(folder))


if __name__ == "__main__":
    main()
