"""`--data imagefolder:PATH`: class subfolders of images, decoded straight to uint8 tensors.

The fast path, per sample in the workers. JPEG: Pillow reads the header only and the crop is drawn
from the image size; when the crop still has at least the output size on each side after a 1/2, 1/4
or 1/8 reduction, libjpeg-turbo decodes reduced in the DCT domain (Pillow's draft mode: a 4000x3000
phone photo cropped to 224 decodes 1/64 of the pixels) and only the crop box becomes a tensor, in HWC
order, which torch's uint8 antialiased resize is fastest on. Otherwise the whole file is decoded by
TorchCodec's decoders (torchvision.io's where TorchCodec is not installed): JPEG, PNG, GIF, WebP; BMP and
the rest: Pillow. Then RandomResizedCrop + horizontal flip (train) or resize + centre crop (val), on uint8.
Images stay uint8 through collate and the worker queue (4x fewer bytes than float32); float conversion
and normalization happen on the device in the prefetcher, or on the host in the plain baseline
(`HostNormalized`), with the same arithmetic.

When no reduction applies (any 500x375 photo cropped to 224: halving needs a crop of >= 448 on both
sides), the pixels are exactly the decoder's. A reduced decode is libjpeg's own
downscale, an 8x8 DCT truncated to 4x4, 2x2 or 1x1 coefficients: close to an area resize, not
bit-equal to decoding at full size and resizing.

Every path gives the image upright, as a photo viewer shows it: a phone stores its pixels as the sensor
read them and an EXIF orientation tag (1-8) saying how to turn them. TorchCodec applies the tag, torchvision
does when asked (not for WebP, which then decodes through Pillow), Pillow's reduced decode cuts the box
mapped back into the stored pixels and turns only that. The crop is drawn on the upright size (the header's,
sides swapped for orientations 5-8): drawn on the stored size, a rotated photo's val crop would cut off
part of it and a train crop could fall outside it (an empty tensor: skipped as an unreadable file).

PATH/train and PATH/val are used when both exist; otherwise a fixed 20% of PATH is held out. Folder
problems (missing folder, no class subfolders, a class without images, a non-image file) are errors
before any training starts; a file that fails to decode during training is skipped and counted
(see badfiles.py).
"""
from __future__ import annotations

import functools
import io
import os
import re
import warnings
from pathlib import Path

import torch
from PIL.Image import DecompressionBombError, Exif, Transpose
from torch.utils.data import Dataset

from ..errors import DataError
from .datasets import IMAGE_EXTENSIONS, Skipped, Split, split_indices

JPEG_SUFFIXES = (".jpg", ".jpeg")
DECODERS = ("torchcodec", "torchvision")
TORCHVISION_DECODES = (".png", ".gif", ".webp")   # and JPEG at full size; the rest via Pillow
DCT_REDUCTIONS = (8, 4, 2)    # libjpeg's power-of-two scaled decodes, largest first
VAL_RESIZE_RATIO = 0.875      # val: resize the short side to size / 0.875 (256 for 224), centre crop size
CROP_SCALE, CROP_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)     # RandomResizedCrop's defaults
ORIENTATION_TAG = 0x0112
# EXIF orientation -> the transpose that makes the stored pixels upright (as PIL.ImageOps.exif_transpose).
# 5-8 swap width and height.
TRANSPOSES = {2: Transpose.FLIP_LEFT_RIGHT, 3: Transpose.ROTATE_180, 4: Transpose.FLIP_TOP_BOTTOM,
              5: Transpose.TRANSPOSE, 6: Transpose.ROTATE_270, 7: Transpose.TRANSVERSE, 8: Transpose.ROTATE_90}


def scan_folder(root: Path) -> tuple[list[tuple[Path, int]], list[str]]:
    """(path, class index) for every image under root/<class>/, checked before any training starts.
    Hidden files (.DS_Store, ._foo.jpg) are ignored; any other non-image file is an error."""
    if not root.is_dir():
        raise DataError(f"--data imagefolder:{root}: folder does not exist")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"--data imagefolder:{root}: no class subfolders (expected {root}/<class>/<image>)")
    samples, others, empty = [], [], []
    for index, name in enumerate(classes):
        found = 0
        for path in sorted((root / name).rglob("*")):
            if not path.is_file() or any(part.startswith(".") for part in path.relative_to(root).parts):
                continue
            if path.suffix.lower() in IMAGE_EXTENSIONS:
                samples.append((path, index))
                found += 1
            else:
                others.append(path)
        if not found:
            empty.append(name)
    if others:
        listed = ", ".join(str(p) for p in others[:3])
        raise DataError(f"--data imagefolder:{root}: {len(others)} non-image file(s), e.g. {listed} "
                        f"(images are {', '.join(IMAGE_EXTENSIONS)})")
    if not samples:
        raise DataError(f"--data imagefolder:{root}: class folders {classes[:5]} contain no images")
    if empty:
        raise DataError(f"--data imagefolder:{root}: class folder(s) without images: {', '.join(empty[:5])}")
    return samples, classes


def read_bytes(path: Path) -> bytearray:
    """The file's bytes in a writable buffer (torch.frombuffer wraps it without a copy or a warning)."""
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)
        f.readinto(data)
    if not data:
        raise OSError("empty file (0 bytes)")
    return data


@functools.cache
def default_decoder() -> str:
    """TorchCodec, PyTorch's image and video decoders (torchvision.io's image decoding is deprecated in its
    favour since torchvision 0.29), when it loads beside this torch; else torchvision.io. Both decode JPEG with
    libjpeg-turbo, to the same pixels. Decided once per process, on first use."""
    try:
        import torchcodec.decoders  # noqa: F401  (a TorchCodec built for another torch fails to load here)
    except Exception:
        return "torchvision"
    return "torchcodec"


def decode_bytes(data: bytearray, path: Path, decoder: str | None = None) -> torch.Tensor:
    """uint8 [3, H, W] RGB of a whole file, upright (EXIF orientation applied; grayscale, palette and CMYK
    converted; an animation's first frame). Raises on a corrupt or truncated file. `decoder`: "torchcodec" or
    "torchvision" (default_decoder) for JPEG, PNG, GIF and WebP; Pillow for the rest."""
    decoder = decoder or default_decoder()
    suffix = path.suffix.lower()
    # torchvision (0.29) ignores a WebP's orientation, even when asked to apply it: Pillow's (libwebp too) does not.
    if suffix in JPEG_SUFFIXES + TORCHVISION_DECODES and not (decoder == "torchvision" and suffix == ".webp"):
        encoded = torch.frombuffer(data, dtype=torch.uint8)
        if decoder == "torchcodec":     # applies the EXIF orientation, always
            from torchcodec.decoders import ImageReadMode, decode_image

            image = decode_image(encoded, mode=ImageReadMode.RGB)
        else:       # chosen (bench-data's comparison) or the only one installed: its deprecation is known
            from torchvision.io import ImageReadMode, decode_image

            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "The image decoding and encoding capabilities", DeprecationWarning)
                image = decode_image(encoded, mode=ImageReadMode.RGB, apply_exif_orientation=True)
        return image[0] if image.dim() == 4 else image
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as image:
        # In place: no copy when there is nothing to turn. It reads the tag after loading: a TIFF, which Pillow
        # turns on load (and drops the tag), is not turned twice.
        ImageOps.exif_transpose(image, in_place=True)
        return rgb_tensor(image)


def rgb_tensor(image) -> torch.Tensor:
    """A Pillow image -> uint8 [3, H, W], a view of HWC memory (one copy of the pixels, no transpose)."""
    import numpy as np

    if image.mode != "RGB":
        image = image.convert("RGB")
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


def exif_orientation(image) -> int:
    """The EXIF orientation (1-8; 1 when absent or unreadable) of a lazily opened image, from the EXIF block
    Pillow read with the header (a JPEG's APP1, a PNG's eXIf before the pixels, a WebP's EXIF chunk): nothing
    is decoded. Only that block, as the decoders read it: not Pillow's getexif(), which decodes a whole PNG to
    look for a later chunk and falls back to XMP, which TorchCodec and torchvision ignore."""
    data = image.info.get("exif")
    if not data:
        return 1
    exif = Exif()
    try:
        exif.load(data)
    except Exception:                   # noqa: BLE001 - a malformed block: the decoders ignore it too
        return 1
    orientation = exif.get(ORIENTATION_TAG, 1)
    return orientation if orientation in TRANSPOSES else 1


def upright_size(image) -> tuple[int, int]:
    """(width, height) of a lazily opened image as the decoders give it: sides swapped for orientations 5-8."""
    width, height = image.size
    return (height, width) if exif_orientation(image) >= 5 else (width, height)


def stored_box(box: tuple[int, int, int, int], orientation: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """An upright (left, top, right, bottom) box in the stored pixels of `size` (width, height): the box that,
    cut and then turned by TRANSPOSES[orientation], gives the upright box's pixels. Orientations 5-8 swap the
    axes, then mirror as the orientation says."""
    left, top, right, bottom = box if orientation < 5 else (box[1], box[0], box[3], box[2])
    width, height = size
    if orientation in (2, 3, 7, 8):
        left, right = width - right, width - left
    if orientation in (3, 4, 6, 7):
        top, bottom = height - bottom, height - top
    return left, top, right, bottom


def dct_reduction(width: int, height: int, need: int) -> int:
    """The largest libjpeg DCT-domain reduction (8, 4, 2, or 1 for none) after which a region of
    width x height still has >= need pixels on both sides: the resize that follows only ever shrinks it,
    so no detail the output could show is lost."""
    return next((k for k in DCT_REDUCTIONS if width >= need * k and height >= need * k), 1)


def decode_jpeg_region(image, box: tuple[int, int, int, int], need: int) -> torch.Tensor:
    """The (left, top, right, bottom) box of a lazily opened JPEG's upright image (see upright_size) as
    uint8 [3, h, w], upright, decoded at the largest DCT reduction that leaves the box >= need pixels on both
    sides. The box is mapped into the stored pixels and only its pixels are turned (not the whole image)."""
    orientation = exif_orientation(image)
    full_w, full_h = image.size
    left, top, right, bottom = box = stored_box(box, orientation, image.size)
    reduction = dct_reduction(right - left, bottom - top, need)
    if reduction > 1:
        image.draft("RGB", (-(-full_w // reduction), -(-full_h // reduction)))   # Pillow rounds up too
        # Each edge rounded to the nearest reduced pixel: off by <= reduction / 2 full-size pixels, which
        # is <= half an output pixel, since the box spans >= need * reduction full-size pixels.
        sx, sy = image.size[0] / full_w, image.size[1] / full_h
        box = (round(left * sx), round(top * sy), round(right * sx), round(bottom * sy))
    if box != (0, 0, *image.size):
        image = image.crop(box)
    if orientation in TRANSPOSES:
        image = image.transpose(TRANSPOSES[orientation])
    return rgb_tensor(image)


def load_region(path: Path, region, cached: torch.Tensor | None = None, decoder: str | None = None) -> torch.Tensor:
    """Decode `path` upright and cut the region that `region(width, height)` (the upright size) returns as
    (left, top, right, bottom, need). With `cached` (the file's pixels from the decode cache) nothing is
    decoded: the same region of the same pixels. A JPEG whose region allows a DCT reduction (see
    dct_reduction) decodes reduced through Pillow; everything else decodes whole (JPEG through `decoder`'s
    libjpeg-turbo, faster than Pillow's decode at 500x375 here) and is sliced. Either way the file is read
    once."""
    if cached is not None:
        left, top, right, bottom, _ = region(cached.shape[-1], cached.shape[-2])
        return cached[:, top:bottom, left:right]
    data, box = read_bytes(path), None
    if path.suffix.lower() in JPEG_SUFFIXES:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:    # parses the header only (~0.02 ms): the size
            *box, need = region(*upright_size(image))    # the decoders' pixels are upright, so is the box
            if image.format == "JPEG" and dct_reduction(box[2] - box[0], box[3] - box[1], need) > 1:
                return decode_jpeg_region(image, tuple(box), need)
    pixels = decode_bytes(data, path, decoder)
    if box is None:
        *box, _ = region(pixels.shape[-1], pixels.shape[-2])
    left, top, right, bottom = box
    return pixels[:, top:bottom, left:right]


class TrainCrop:
    """RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) + horizontal flip with p=0.5, on uint8:
    torchvision's crop-parameter sampler drawn from the upright image size (read from the header, so a JPEG
    can decode only what the crop needs), torchvision's antialiased resize called directly (the v2 transform
    objects add ~0.25 ms of dispatch per image, a fifth of the decode). Draws from the worker's torch RNG,
    which the loader seeds per (rank, worker, epoch); same draws, same order, whatever the decode path."""

    def __init__(self, size: int, decoder: str | None = None) -> None:
        self.size, self.decoder = size, decoder

    def region(self, width: int, height: int) -> tuple[int, int, int, int, int]:
        from torchvision.transforms import RandomResizedCrop

        # get_params only reads the size: a zero-size stand-in of that shape is enough.
        top, left, h, w = RandomResizedCrop.get_params(torch.empty(0, height, width), CROP_SCALE, CROP_RATIO)
        return left, top, left + w, top + h, self.size

    def __call__(self, path: Path, cached: torch.Tensor | None = None) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        crop = load_region(path, self.region, cached, self.decoder)
        image = TF.resize(crop, [self.size, self.size], antialias=True)
        image = image.flip(-1) if torch.rand(1).item() < 0.5 else image
        return image.contiguous()


class ValCrop:
    """Resize the short side to size / 0.875 (256 for 224), then centre-crop size x size, on uint8."""

    def __init__(self, size: int, decoder: str | None = None) -> None:
        self.size, self.decoder = size, decoder
        self.short_side = round(size / VAL_RESIZE_RATIO)

    def region(self, width: int, height: int) -> tuple[int, int, int, int, int]:
        return 0, 0, width, height, self.short_side      # the whole image, short side >= 256 after reduction

    def __call__(self, path: Path, cached: torch.Tensor | None = None) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        image = TF.resize(load_region(path, self.region, cached, self.decoder), self.short_side, antialias=True)
        return TF.center_crop(image, self.size).contiguous()


def describe_error(exc: Exception) -> str:
    """The decoder's message without torchvision's C++ source location ("decode_jpeg, .../x.cpp:171, ") or
    Pillow's in-memory file object ("cannot identify image file <_io.BytesIO object at 0x7f...>")."""
    text = re.sub(r"\S+\.cpp:\d+,?\s*", "", str(exc))
    text = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>", "", text)
    if text.startswith("cannot identify image file"):
        text = "not an image Pillow can read (garbage, or a format it does not know)"
    return text.strip()[:160]


def build_transform(image_size: int, train: bool, decoder: str | None = None):
    """uint8 in, uint8 out: the crop picks and resamples pixels, it never converts them to float."""
    return TrainCrop(image_size, decoder) if train else ValCrop(image_size, decoder)


class ImageFiles(Dataset):
    """One file per item -> (uint8 [3, S, S], label), or `Skipped` when the file cannot be decoded."""

    def __init__(self, samples: list[tuple[Path, int]], image_size: int, train: bool = False,
                 decoder: str | None = None) -> None:
        self.samples = samples
        self.image_size = image_size
        self.train = train
        self.transform = build_transform(image_size, train, decoder)
        self.pixels = None        # decoded_cache.DecodedPixels when the recipe's decode_cache is on

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        try:
            image = self.transform(path, self.pixels.get(index) if self.pixels is not None else None)
        # torchvision: RuntimeError; Pillow: OSError (truncated, unidentified), ValueError, DecompressionBombError
        except (RuntimeError, OSError, ValueError, DecompressionBombError) as exc:
            return Skipped(str(path), f"{type(exc).__name__}: {describe_error(exc)}")
        return image, label


def load_imagefolder(path: str, image_size: int = 224) -> Split:
    root = Path(path)
    halves = [name for name in ("train", "val") if (root / name).is_dir()]
    if len(halves) == 2:
        train_samples, classes = scan_folder(root / "train")
        val_samples, val_classes = scan_folder(root / "val")
        if val_classes != classes:
            only_train, only_val = sorted(set(classes) - set(val_classes)), sorted(set(val_classes) - set(classes))
            raise DataError(f"--data imagefolder:{root}: train/ and val/ have different class folders ("
                            + "; ".join(f"only in {where}/: {', '.join(names[:5])}" for where, names in
                                        (("train", only_train), ("val", only_val)) if names) + ")")
    elif halves:
        # One half alone would be read as a dataset with one class named "train" (or "val").
        other = "val" if halves[0] == "train" else "train"
        raise DataError(f"--data imagefolder:{root}: has {halves[0]}/ but no {other}/: give both "
                        f"({root}/train/<class>/ and {root}/val/<class>/), or the class folders directly under "
                        f"{root} (20% is then held out for validation)")
    else:
        samples, classes = scan_folder(root)
        train_idx, val_idx = split_indices(len(samples), 0.2)
        train_samples = [samples[i] for i in train_idx.tolist()]
        val_samples = [samples[i] for i in val_idx.tolist()]
    if len(classes) < 2:
        raise DataError(f"--data imagefolder:{root}: one class folder ({classes[0]}/): a classifier needs two or "
                        f"more, one subfolder per class ({root}/<class>/<image>)")
    # ImageNet statistics: computing them would mean decoding the whole folder before training.
    return Split(ImageFiles(train_samples, image_size, train=True), ImageFiles(val_samples, image_size),
                 len(classes), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), image_size, f"imagefolder:{root}")
