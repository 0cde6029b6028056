"""`trainfast bench-data --data imagefolder:PATH`: images/s of the input pipeline alone, ours beside
torchvision's default, in the same run.

- trainfast: bytes -> libjpeg-turbo decode -> uint8 RandomResizedCrop + flip in the workers -> uint8
  collate -> the prefetcher (copy to the device, float conversion + normalization there). Built with the
  same `build_batches` the training run uses: what is measured is what trains.
- trainfast + decode_cache: the same pipeline reading each image's uint8 pixels from the decode cache
  (data/decoded_cache.py) instead of decoding the JPEG: the same crops, bit for bit. The cache is built
  (or found) before any timing; its one-off build time is printed separately.
- torchvision default: `datasets.ImageFolder` (PIL decode) -> RandomResizedCrop -> RandomHorizontalFlip
  -> ToTensor -> Normalize in the workers, float32 through collate, then copied to the device.

Both read the same files with the same batch size, worker count and crop size. Each pipeline keeps its
workers alive (persistent_workers) and the two alternate pass by pass, so load from other processes
hits both alike; the first pass of each (worker start-up) is not counted. The result is the median
images/s over the timed passes, with the spread, and the ratio.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from .data.imagefolder import default_decoder
from .defaults import usable_cpus

OURS = "trainfast (uint8, default decoder, normalized on device)"
CACHED = "trainfast + decode_cache (uint8 pixels, no decode)"
THEIRS = "torchvision default (PIL, float32 in workers)"


@dataclass
class BenchResult:
    name: str
    rates: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        return (max(self.rates) - min(self.rates)) / 2 if len(self.rates) > 1 else 0.0


def time_pass(batches: Iterable, device: torch.device) -> float:
    """Images/s of one full pass; the inputs are touched on the device so the last copy is counted."""
    from .measure import synchronize

    t0, images = time.perf_counter(), 0
    for inputs, _ in batches:
        images += inputs.shape[0]
    synchronize(device)
    return images / (time.perf_counter() - t0)


def folder_split(root: Path, image_size: int, decoder: str | None = None):
    """Every image of the folder, with the training transforms (the benchmark reads, it does not score);
    `decoder`: which library decodes whole files (data/imagefolder.py's default when None)."""
    from .data.datasets import Split
    from .data.imagefolder import ImageFiles, scan_folder

    samples, classes = scan_folder(root)
    dataset = ImageFiles(samples, image_size, train=True, decoder=decoder)
    return Split(dataset, dataset, len(classes), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), image_size, str(root))


class ToDevice:
    def __init__(self, loader: Iterable, device: torch.device) -> None:
        self.loader, self.device = loader, device

    def __iter__(self):
        for inputs, targets in self.loader:
            yield inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)


def build_torchvision_pipeline(root: Path, recipe, device: torch.device, image_size: int) -> ToDevice:
    from torch.utils.data import DataLoader
    from torchvision import datasets
    from torchvision import transforms as T

    transform = T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    loader = DataLoader(datasets.ImageFolder(str(root), transform=transform), batch_size=recipe.batch_size,
                        shuffle=True, drop_last=True, num_workers=recipe.num_workers,
                        pin_memory=device.type == "cuda", persistent_workers=recipe.num_workers > 0)
    return ToDevice(loader, device)


def bench_data(data: str, batch_size: int = 64, num_workers: int | str = 2, image_size: int = 224,
               passes: int = 5, device: str = "auto", print_fn=print,
               cache: bool = True) -> dict[str, BenchResult]:
    from .data.datasets import DataError
    from .data.loading import parse_data_spec
    from .recipe import Recipe, resolve_device
    from .run import prepare_data

    kind, arg = parse_data_spec(data)
    if kind != "imagefolder":
        raise DataError(f"bench-data --data {data!r}: needs imagefolder:PATH (the pipeline decodes image files)")
    root = Path(arg)
    root = root / "train" if (root / "train").is_dir() and (root / "val").is_dir() else root
    dev = resolve_device(device)
    recipe = Recipe(batch_size=batch_size, num_workers=num_workers, prefetch=True, persistent_workers=num_workers != 0)
    split = folder_split(root, image_size)
    split, recipe = prepare_data(split, recipe, dev)       # as the run prepares its data: workers resolved
    # No oversubscription: the main process gets the cores the workers leave (at least one). Its intra-op
    # threads would otherwise spin beside busy workers: on the 2-core dev machine with 2 workers, 2 main
    # threads cost the cached pipeline a third of its rate. Both pipelines run under the same setting.
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(max(1, usable_cpus() - recipe.num_workers))
    print_fn(f"bench-data: {root} on {dev}, batch {batch_size}, {recipe.num_workers} workers, "
             f"{torch.get_num_threads()} main-process thread(s), RandomResizedCrop({image_size}) + flip, "
             f"{passes} timed passes after 1 warm-up pass each; images decoded by {default_decoder()}")
    try:
        return _run_passes(pipelines_for(split, recipe, dev, root, image_size, cache, print_fn), passes,
                           dev, print_fn)
    finally:
        torch.set_num_threads(threads)


def pipelines_for(split, recipe, dev: torch.device, root: Path, image_size: int, cache: bool,
                  print_fn) -> dict:
    from .data.decoded_cache import cached_split
    from .data.pipeline import build_batches

    ours = build_batches(split.train, split, recipe, dev, train=True)
    pipelines = {OURS: ours, THEIRS: build_torchvision_pipeline(root, recipe, dev, image_size),
                 # The same loader without the prefetcher: how much of the time normalization takes on
                 # this device (on a CPU-only run it is host work too, unlike on a GPU).
                 "  trainfast loader alone (uint8, not normalized)": ToDevice(ours.loader, dev)}
    # The other decoder for whole files (TorchCodec's or torchvision.io's), same pipeline otherwise: what the
    # default decoder buys, measured here rather than assumed.
    other = "torchvision" if default_decoder() == "torchcodec" else None
    if other is not None:
        alt = folder_split(root, image_size, other)
        pipelines[f"  trainfast with {other} decoding whole files"] = build_batches(alt.train, alt, recipe, dev,
                                                                                   train=True)
    if cache:
        t0 = time.perf_counter()
        cached = cached_split(split, log=lambda m: print_fn(f"  {m}"))
        print_fn(f"  decode cache ready in {time.perf_counter() - t0:.1f} s (one-off; found, or built)")
        pipelines[CACHED] = build_batches(cached.train, cached, recipe, dev, train=True)
    return pipelines


def _run_passes(pipelines: dict, passes: int, dev: torch.device, print_fn) -> dict[str, BenchResult]:
    results = {name: BenchResult(name, []) for name in pipelines}
    for i in range(passes + 1):
        for name, batches in pipelines.items():
            rate = time_pass(batches, dev)
            if i:
                results[name].rates.append(rate)
    for r in results.values():
        print_fn(f"  {r.name:<56} {r.median:8,.0f} images/s  (± {r.spread:,.0f}, median of {len(r.rates)})")
    for name in (OURS, CACHED):
        if name in results:
            print_fn(f"  ratio {name.split(' (')[0]} / torchvision default: "
                     f"{results[name].median / results[THEIRS].median:.2f}x")
    return results
