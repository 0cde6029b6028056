"""The built-in detection dataset: objects pasted at known boxes onto crops of real photos, all offline.

Backgrounds are crops of the photos that ship inside scikit-learn (china.jpg, flower.jpg; plus
scikit-image's astronaut, coffee and chelsea when it is installed: a different background pool, so a
given seed's images differ between the two installs, but never between two runs of one install). Objects
are either drawn shapes (rectangle, ellipse, triangle: 3 categories, learnable from scratch in a few CPU
minutes) or scikit-learn's 8x8 handwritten digits upscaled (10 categories, harder). Each object is a mask
blended onto the photo in a random colour; its box is the tight box of the mask, so boxes are exact.

Image sizes are drawn from `SIZES`: five aspect ratios from 1:2 to 2:1, so batches of mixed shapes pad
(what aspect-ratio grouping removes). 2 to 5 objects per image, 28 to 96 px on their longer side
(inside the anchors of both default detectors), overlapping another object's box by at most 10%.

Deterministic: image i of a dataset is drawn from its own generator seeded by (seed, split, i), whatever
the order, the worker or the process that asks for it. Images are made on demand (about a millisecond
each), so the dataset costs no memory and workers can make them in parallel.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..errors import DataError
from .data import DetectionSplit

SIZES = ((160, 320), (192, 256), (224, 224), (256, 192), (320, 160))   # (height, width): 1:2 ... 2:1
OBJECTS_PER_IMAGE = (2, 5)          # inclusive
OBJECT_SIDE = (28, 96)              # the longer side of an object's box, pixels
MAX_OVERLAP = 0.1                   # of the smaller box's area, with any object already placed
SHAPES = ("rectangle", "ellipse", "triangle")
DIGITS = tuple(str(d) for d in range(10))
SPLIT_STREAMS = {"train": 0, "val": 1}


@lru_cache(maxsize=1)
def background_photos() -> tuple[torch.Tensor, ...]:
    """uint8 [3, H, W] photos shipped by the installed packages (cached: read once per process)."""
    from sklearn.datasets import load_sample_images

    photos = [np.asarray(image) for image in load_sample_images().images]
    try:            # optional: more backgrounds when scikit-image is installed
        from skimage import data as skdata

        photos += [np.asarray(f()) for f in (skdata.astronaut, skdata.coffee, skdata.chelsea)]
    except ImportError:
        pass
    return tuple(torch.from_numpy(np.array(p[..., :3])).permute(2, 0, 1).contiguous() for p in photos)


@lru_cache(maxsize=1)
def digit_masks() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1,797 digits as float masks in [0, 1] [N, 8, 8], and their digit labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return torch.tensor(digits.images, dtype=torch.float32) / 16.0, torch.tensor(digits.target)


def shape_mask(kind: str, height: int, width: int) -> torch.Tensor:
    """A float mask [height, width] of a shape filling its box (anti-aliased edges are not needed: the
    tight box is taken at mask >= 0.5)."""
    y = (torch.arange(height, dtype=torch.float32) + 0.5) / height
    x = (torch.arange(width, dtype=torch.float32) + 0.5) / width
    yy, xx = torch.meshgrid(y, x, indexing="ij")
    if kind == "rectangle":
        return torch.ones(height, width)
    if kind == "ellipse":
        return (((xx - 0.5) ** 2 + (yy - 0.5) ** 2) <= 0.25).float()
    # triangle: apex at the top centre, base along the bottom edge
    return ((xx - 0.5).abs() <= yy / 2).float()


def background(rng: np.random.Generator, height: int, width: int) -> torch.Tensor:
    """A random crop of a random photo, resized to height x width (uint8 [3, H, W])."""
    photos = background_photos()
    photo = photos[rng.integers(len(photos))]
    ph, pw = photo.shape[-2:]
    scale = rng.uniform(0.5, 1.0) * min(ph / height, pw / width)     # crop 1x..2x the output per side
    ch, cw = int(height * scale), int(width * scale)
    top, left = int(rng.integers(ph - ch + 1)), int(rng.integers(pw - cw + 1))
    crop = photo[None, :, top:top + ch, left:left + cw].float()
    return F.interpolate(crop, size=(height, width), mode="bilinear", antialias=True, align_corners=False)[0]


def object_mask(rng: np.random.Generator, objects: str, label_index: int) -> torch.Tensor:
    """The mask of one object of category `label_index`, at a random size and aspect ratio."""
    side = int(rng.integers(OBJECT_SIDE[0], OBJECT_SIDE[1] + 1))
    aspect = float(np.exp(rng.uniform(np.log(0.6), np.log(1.6))))       # width / height
    h, w = (side, max(8, round(side * aspect))) if aspect < 1 else (max(8, round(side / aspect)), side)
    if objects == "shapes":
        return shape_mask(SHAPES[label_index], h, w)
    masks, labels = digit_masks()
    choices = (labels == label_index).nonzero().flatten()
    digit = masks[choices[rng.integers(len(choices))]]
    return F.interpolate(digit[None, None], size=(h, w), mode="bilinear", align_corners=False)[0, 0].clamp(0, 1)


def overlap(box: tuple[int, int, int, int], other: tuple[int, int, int, int]) -> float:
    """Intersection over the smaller box's area."""
    iw = min(box[2], other[2]) - max(box[0], other[0])
    ih = min(box[3], other[3]) - max(box[1], other[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    smaller = min((box[2] - box[0]) * (box[3] - box[1]), (other[2] - other[0]) * (other[3] - other[1]))
    return iw * ih / smaller


def compose(rng: np.random.Generator, objects: str, size: tuple[int, int]) -> tuple[torch.Tensor, list, list]:
    """One image: a background with objects pasted on it. Returns (uint8 image, xyxy boxes, labels 1..C)."""
    height, width = size
    canvas = background(rng, height, width)
    categories = SHAPES if objects == "shapes" else DIGITS
    boxes, labels = [], []
    wanted = int(rng.integers(OBJECTS_PER_IMAGE[0], OBJECTS_PER_IMAGE[1] + 1))
    for _ in range(wanted * 10):            # placement attempts; a crowded image keeps fewer objects
        if len(boxes) == wanted:
            break
        index = int(rng.integers(len(categories)))
        mask = object_mask(rng, objects, index)
        mh, mw = mask.shape
        top, left = int(rng.integers(height - mh + 1)), int(rng.integers(width - mw + 1))
        rows, cols = (mask >= 0.5).any(1).nonzero().flatten(), (mask >= 0.5).any(0).nonzero().flatten()
        box = (left + int(cols[0]), top + int(rows[0]), left + int(cols[-1]) + 1, top + int(rows[-1]) + 1)
        if any(overlap(box, other) > MAX_OVERLAP for other in boxes):
            continue
        # A colour far from the background under the object: saturated, and flipped to the opposite
        # brightness of the region it lands on, so the object is visible whatever the photo shows there.
        region = canvas[:, top:top + mh, left:left + mw]
        color = torch.from_numpy(rng.uniform(0, 255, 3)).float()
        if (color.mean() > 127) == (region.mean() > 127):
            color = 255 - color
        canvas[:, top:top + mh, left:left + mw] = region * (1 - mask) + color[:, None, None] * mask
        boxes.append(box)
        labels.append(index + 1)
    return canvas.round().clamp(0, 255).to(torch.uint8), boxes, labels


class SyntheticDetection(Dataset):
    """`length` images; item i -> (uint8 [3, H, W], {"boxes", "labels", "image_id"}), the same every time."""

    def __init__(self, length: int, objects: str = "shapes", seed: int = 0, split: str = "train") -> None:
        if objects not in ("shapes", "digits"):
            raise DataError(f"synthetic detection objects are 'shapes' or 'digits', not {objects!r}")
        if split not in SPLIT_STREAMS:
            raise DataError(f"synthetic detection split is 'train' or 'val', not {split!r}")
        if length < 1:
            raise DataError(f"synthetic detection dataset needs at least one image, got length={length}")
        self.length, self.objects, self.seed, self.stream = length, objects, seed, SPLIT_STREAMS[split]
        # Sizes are drawn from a generator of their own, so they are known without making any image.
        size_rng = np.random.default_rng([seed, self.stream, 2**31])
        self.sizes = [SIZES[k] for k in size_rng.integers(len(SIZES), size=length)]
        self.categories = SHAPES if objects == "shapes" else DIGITS

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} images")
        rng = np.random.default_rng([self.seed, self.stream, index])
        image, boxes, labels = compose(rng, self.objects, self.sizes[index])
        target = {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                  "labels": torch.tensor(labels, dtype=torch.int64), "image_id": index}
        return image, target


def load_synthetic_detection(objects: str = "shapes", train_size: int = 192, val_size: int = 48,
                             seed: int = 0) -> DetectionSplit:
    """The default detection data: 192 training and 48 held-out images. Sized for 2 CPU cores: a training
    step on 4 images took 1.5 s with the CPU-sized Faster R-CNN (models.py) and 0.36 s with SSDlite on the
    2-core development machine, so an epoch is about a minute or 20 s (more when the machine is shared)."""
    train = SyntheticDetection(train_size, objects, seed, "train")
    val = SyntheticDetection(val_size, objects, seed, "val")
    return DetectionSplit(train, val, train.categories, f"synthetic:{objects}")
