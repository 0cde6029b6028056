"""`decode_cache`: decode a folder's images once, then read uint8 pixels instead of JPEGs every epoch.

On a machine with few cores the JPEG decode is the floor of the input pipeline (libjpeg-turbo spends
~0.8 ms on a 500x375 photo here, most of the ~1.1 ms our whole per-image path costs). Training runs
many epochs over the same files, so the decode can be paid once: every image is decoded to uint8 HWC
(exactly the decoder's pixels, upright: data/imagefolder.py) into one file, memory-mapped by the workers;
each epoch then only crops and resizes. What it costs: disk, about 3 bytes per pixel (~0.56 MB for a
500x375 photo, 5-10x the JPEG), checked against the free space before anything is written, and one
decoding pass, done in parallel the first time.

The crops are bit-identical to decoding the file every epoch without a DCT reduction (same pixels,
same random draws, same resize kernel), so the switch changes speed, never the data. Files that are
large enough for a reduced decode (see imagefolder.py) are cached at full size too: the cache then
gives the exact full-resolution crop, not the DCT-reduced approximation.

Layout, under $TRAINFAST_CACHE (default ~/.cache/trainfast)/decoded/<key>/: `pixels.u8` (every image,
back to back) and `index.npz` (offsets, shapes, which images are cached, the fingerprint). The key
hashes every file's path, size and modification time, so a changed folder gets a new cache instead
of stale pixels. Writes go to `.partial` names and are renamed only once complete: an interrupted build
leaves nothing that is ever read. A file that cannot be decoded is not cached; reading it falls back
to the file, which the bad-file tally skips and counts as usual.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..defaults import usable_cpus
from ..errors import DataError
from .datasets import Split
from .imagefolder import ImageFiles, decode_bytes, read_bytes, upright_size

CACHE_FORMAT = 3     # 2: HWC pixel order; 3: upright (EXIF orientation applied by every decoder)
HEADROOM = 1.05          # free space required: the pixels plus 5%
SMALL_FOLDER = 256       # fewer images than this decode in the calling process


def cache_root() -> Path:
    return Path(os.environ.get("TRAINFAST_CACHE") or Path.home() / ".cache" / "trainfast") / "decoded"


def fingerprint(paths: list[Path]) -> str:
    """Changes when any file is added, removed, renamed, resized or touched."""
    digest = hashlib.sha256(f"trainfast decoded cache v{CACHE_FORMAT}\n".encode())
    for path in paths:
        stat = path.stat()
        digest.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def image_size(path: Path) -> tuple[int, int] | None:
    """(width, height) of the decoded (upright) pixels, from the header only; None when the header cannot be
    read (not cached)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return upright_size(image)
    except Exception:                       # noqa: BLE001 - any unreadable header: decoded at read time
        return None


class _DecodeInto(Dataset):
    """Item i: decode file i and write its pixels at its offset of the data file (opened per process)."""

    def __init__(self, paths: list[Path], data_file: Path, offsets: np.ndarray, shapes: np.ndarray) -> None:
        self.paths, self.data_file, self.offsets, self.shapes = paths, data_file, offsets, shapes
        self.array = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, bool]:
        height, width = self.shapes[index]
        if height == 0:
            return index, False
        try:
            pixels = decode_bytes(read_bytes(self.paths[index]), self.paths[index])
        except Exception:                   # noqa: BLE001 - the tally reports it when training reads it
            return index, False
        if tuple(pixels.shape) != (3, height, width):
            return index, False
        if self.array is None:
            self.array = np.memmap(self.data_file, dtype=np.uint8, mode="r+")
        start = int(self.offsets[index])
        # HWC order, as the decoders produce it: torch's uint8 antialiased resize is fastest on that layout
        # (0.33 ms against 0.56 ms for CHW per 224 crop here), with the same output bytes.
        self.array[start:start + pixels.numel()] = pixels.permute(1, 2, 0).reshape(-1).numpy()
        return index, True


class DecodedPixels:
    """The cached pixels of one list of files: `get(i)` -> uint8 [3, H, W] (a view of HWC memory) or None
    (not cached)."""

    def __init__(self, folder: Path, offsets: np.ndarray, shapes: np.ndarray, cached: np.ndarray) -> None:
        self.folder, self.offsets, self.shapes, self.cached = folder, offsets, shapes, cached
        self.array = None                     # memory-mapped lazily, in each worker process

    def __getstate__(self) -> dict:
        return {**self.__dict__, "array": None}

    @property
    def count(self) -> int:
        return int(self.cached.sum())

    def get(self, index: int) -> torch.Tensor | None:
        if not self.cached[index]:
            return None
        if self.array is None:
            # Copy-on-write: a writable view for torch.from_numpy (no warning), pages shared until written,
            # and nothing here ever writes.
            self.array = np.memmap(self.folder / "pixels.u8", dtype=np.uint8, mode="c")
        height, width = (int(v) for v in self.shapes[index])
        start = int(self.offsets[index])
        return torch.from_numpy(self.array[start:start + 3 * height * width]).view(height, width, 3).permute(2, 0, 1)


def load_index(folder: Path, key: str) -> DecodedPixels | None:
    index_file = folder / "index.npz"
    if not (index_file.is_file() and (folder / "pixels.u8").is_file()):
        return None
    with np.load(index_file) as index:
        if str(index["fingerprint"]) != key:
            return None
        return DecodedPixels(folder, index["offsets"], index["shapes"], index["cached"])


def build_workers(count: int) -> int:
    """Decoding is embarrassingly parallel: every CPU this process may use (up to 8), whatever the run's
    num_workers; a small folder decodes in this process (starting workers would cost more)."""
    return 0 if count < SMALL_FOLDER else min(8, usable_cpus())


def open_or_build(paths: list[Path], workers: int | None = None, log=print, build: bool = True,
                  poll_s: float = 1.0) -> DecodedPixels:
    """The cache of these files: opened when a complete one with the same fingerprint exists, else
    built (decoding with `workers` processes, see build_workers) after checking the free disk space.
    With build=False (ranks other than 0) wait for another process to finish building it."""
    key = fingerprint(paths)
    folder = cache_root() / key[:24]
    found = load_index(folder, key)
    while found is None and not build:
        time.sleep(poll_s)                   # torchrun stops this rank too if the builder fails
        found = load_index(folder, key)
    if found is not None:
        return found
    sizes = [image_size(p) for p in paths]
    shapes = np.array([(s[1], s[0]) if s else (0, 0) for s in sizes], dtype=np.int64)   # (height, width)
    lengths = 3 * shapes[:, 0] * shapes[:, 1]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    total = int(lengths.sum())
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if total * HEADROOM > free:
        raise DataError(f"decode_cache: {len(paths)} images need {total / 2**30:.1f} GiB decoded, but {folder} has "
                        f"{free / 2**30:.1f} GiB free; set TRAINFAST_CACHE to a bigger disk or drop --decode-cache")
    log(f"decode_cache: decoding {len(paths)} images once into {folder} ({total / 2**20:,.0f} MiB)")
    partial = folder / "pixels.u8.partial"
    with open(partial, "wb") as f:          # sized up front (sparse): workers write at their offsets
        f.truncate(max(total, 1))
    cached = np.zeros(len(paths), dtype=bool)
    job = _DecodeInto(paths, partial, offsets, shapes)
    workers = build_workers(len(paths)) if workers is None else workers
    # Its own generator: building must not draw from the global RNG the run's crops are drawn from.
    loader = DataLoader(job, batch_size=None, num_workers=workers, shuffle=False, generator=torch.Generator())
    report_every = max(1, len(paths) // 10)
    for done, (index, ok) in enumerate(loader, start=1):
        cached[int(index)] = bool(ok)
        if done % report_every == 0 and done < len(paths) and len(paths) >= SMALL_FOLDER:
            log(f"decode_cache: {done:,} of {len(paths):,} decoded")
    with open(partial, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(partial, folder / "pixels.u8")
    index_partial = folder / "index.partial.npz"
    np.savez(index_partial, fingerprint=np.array(key), offsets=offsets, shapes=shapes, cached=cached)
    os.replace(index_partial, folder / "index.npz")     # last: its presence means the cache is complete
    if not cached.all():
        log(f"decode_cache: {int((~cached).sum())} image(s) could not be decoded; they are read from their "
            f"files (and skipped and counted there if they stay unreadable)")
    return DecodedPixels(folder, offsets, shapes, cached)


def with_decode_cache(split: Split, recipe, dist=None, log=print) -> Split:
    """The split with its image-folder datasets reading from the decode cache (built on first use)
    when the recipe asks for it; unchanged otherwise. Under torchrun, rank 0 builds it and the other
    ranks wait for the finished cache to appear (a build can outlast any collective's timeout)."""
    if not recipe.decode_cache:
        return split
    return cached_split(split, dist, log)


def cached_split(split: Split, dist=None, log=print) -> Split:
    """The split with its image-folder datasets reading from the decode cache (built on first use), whatever the
    recipe: with_decode_cache's work, for a caller that compares the cache against the decoding it replaces."""
    import copy
    import dataclasses

    main = dist is None or dist.is_main
    datasets = {}
    for name in ("train", "val"):
        dataset = getattr(split, name)
        if isinstance(dataset, ImageFiles):
            dataset = copy.copy(dataset)
            dataset.pixels = open_or_build([path for path, _ in dataset.samples], log=log if main else (lambda _: None),
                                           build=main)
        datasets[name] = dataset
    return dataclasses.replace(split, **datasets)
