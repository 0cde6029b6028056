"""EXIF orientation (every phone photo carries one): whatever path decodes a file (TorchCodec, torchvision,
Pillow's DCT-reduced decode, Pillow for the other formats, the decode cache), the pixels are the upright
image a photo viewer shows (PIL.ImageOps.exif_transpose), and the crops are drawn on the upright size, so
no region falls outside the pixels (a train draw skipped as unreadable) or cuts only part of the image (val).

The pictures are two gradients (red rises left to right, green top to bottom) and an off-centre blob: all
eight orientations give different pixels, smooth enough that JPEG and a DCT-reduced decode stay close."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from torchvision.transforms.v2 import functional as TF

from trainfast.data.datasets import Skipped
from trainfast.data.decoded_cache import open_or_build
from trainfast.data.imagefolder import ImageFiles, TrainCrop, ValCrop, decode_bytes, read_bytes

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")

ORIENTATIONS = range(1, 9)
SMALL, LARGE = (80, 40), (800, 400)     # (width, height) as stored; LARGE allows an 8x DCT reduction at 32


def available_decoders() -> list[str]:
    try:
        import torchcodec.decoders  # noqa: F401
    except Exception:                   # noqa: BLE001 - not installed, or built for another torch
        return ["torchvision"]
    return ["torchcodec", "torchvision"]


DECODERS = available_decoders()


def write_photo(path, orientation: int, size=SMALL, **save):
    width, height = size
    x, y = np.meshgrid(np.linspace(0, 1, width), np.linspace(0, 1, height))
    blob = np.exp(-((x - 0.25) ** 2 + (y - 0.3) ** 2) / 0.02)
    pixels = np.stack([230 * x + 10, 230 * y + 10, 200 * blob + 20], axis=-1)
    image = Image.fromarray(pixels.round().astype(np.uint8))
    exif = image.getexif()
    exif[0x0112] = orientation
    image.save(path, exif=exif, **({"quality": 95} if path.suffix == ".jpg" else {}), **save)
    return path


def upright(path) -> torch.Tensor:
    """uint8 [3, H, W] as a photo viewer shows the file."""
    with Image.open(path) as image:
        return torch.from_numpy(np.array(ImageOps.exif_transpose(image).convert("RGB"))).permute(2, 0, 1)


def val_reference(path, size: int) -> torch.Tensor:
    short_side = round(size / 0.875)
    return TF.center_crop(TF.resize(upright(path), short_side, antialias=True), size)


def mean_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (tuple(a.shape), tuple(b.shape))
    return (a.float() - b.float()).abs().mean().item()


def far_from_upright(produce, reference, limit: float) -> str | None:
    """None when `produce()` matches the upright reference; else why not."""
    try:
        ours = produce()
    except Exception as exc:            # noqa: BLE001 - reported as a mismatch, with its message
        return f"{type(exc).__name__}: {exc}"[:120]
    if isinstance(ours, Skipped):
        return f"skipped: {ours}"[:120]
    if ours.shape != reference.shape:
        return f"shape {tuple(ours.shape)}, upright {tuple(reference.shape)}"
    diff = mean_diff(ours, reference)
    return None if diff < limit else f"mean difference {diff:.1f} levels"


def train_reference(path, crop: TrainCrop, seed: int) -> torch.Tensor:
    """The draw TrainCrop makes with this seed, cut from the upright image: region, resize, flip."""
    pixels = upright(path)
    torch.manual_seed(seed)
    left, top, right, bottom, _ = crop.region(pixels.shape[-1], pixels.shape[-2])
    image = TF.resize(pixels[:, top:bottom, left:right], [crop.size, crop.size], antialias=True)
    return image.flip(-1) if torch.rand(1).item() < 0.5 else image


@pytest.mark.parametrize("decoder", DECODERS)
def test_val_crop_is_the_centre_of_the_upright_image(tmp_path, decoder):
    wrong = {}
    for orientation in ORIENTATIONS:
        path = write_photo(tmp_path / f"o{orientation}.jpg", orientation)
        # Full decode (80x40 allows no reduction at 37): the decoder's pixels, the same libjpeg-turbo as Pillow's.
        why = far_from_upright(lambda: ValCrop(32, decoder)(path), val_reference(path, 32), 1.5)
        if why:
            wrong[orientation] = why
    assert not wrong, wrong


@pytest.mark.parametrize("decoder", DECODERS)
def test_train_draws_are_crops_of_the_upright_image_and_none_is_skipped(tmp_path, decoder):
    wrong = {}
    for orientation in ORIENTATIONS:
        path = write_photo(tmp_path / f"o{orientation}.jpg", orientation)
        dataset = ImageFiles([(path, 0)], 32, train=True, decoder=decoder)
        for seed in range(50):
            torch.manual_seed(seed)
            item = dataset[0]
            produce = lambda: item if isinstance(item, Skipped) else item[0]   # noqa: E731
            why = far_from_upright(produce, train_reference(path, dataset.transform, seed), 1.5)
            if why:
                wrong.setdefault(orientation, f"seed {seed}: {why}")
    assert not wrong, wrong


@pytest.mark.parametrize("decoder", DECODERS)
def test_reduced_decode_is_upright_like_the_full_decode(tmp_path, decoder):
    """800x400 at 32: val and most train draws take Pillow's DCT-reduced decode of only the crop box, which
    must come out in the orientation of the whole-file decode; the tolerance is the existing one for a reduced
    decode (libjpeg's DCT downscale, box edges on the reduced grid)."""
    wrong = {}
    for orientation in ORIENTATIONS:
        path = write_photo(tmp_path / f"o{orientation}.jpg", orientation, size=LARGE)
        full = decode_bytes(read_bytes(path), path, decoder)
        if (why := far_from_upright(lambda: full, upright(path), 1.0)):
            wrong[f"{orientation} full decode"] = why
        if (why := far_from_upright(lambda: ValCrop(32, decoder)(path), val_reference(path, 32), 4.0)):
            wrong[f"{orientation} val"] = why
        crop = TrainCrop(32, decoder)
        for seed in range(20):          # every draw here spans >= 138 pixels a side: all reduced, by 4 or 8
            reference = train_reference(path, crop, seed)
            torch.manual_seed(seed)
            why = far_from_upright(lambda: crop(path), reference, 4.0)
            if why:
                wrong.setdefault(f"{orientation} train", f"seed {seed}: {why}")
    assert not wrong, wrong


def test_every_format_decodes_upright_with_either_decoder(tmp_path):
    """decode_bytes, the whole-file decode: JPEG and PNG by the decoder, WebP too (torchvision's decoder does
    not apply a WebP's orientation), TIFF by Pillow."""
    wrong = {}
    for suffix in (".jpg", ".png", ".webp", ".tif"):
        for orientation in ORIENTATIONS:
            path = write_photo(tmp_path / f"o{orientation}{suffix}", orientation,
                               **({"lossless": True} if suffix == ".webp" else {}))
            for decoder in DECODERS:
                why = far_from_upright(lambda: decode_bytes(read_bytes(path), path, decoder), upright(path), 1.0)
                if why:
                    wrong[f"{decoder} {suffix} {orientation}"] = why
    assert not wrong, wrong


def test_decode_cache_stores_upright_pixels(tmp_path):
    paths = [write_photo(tmp_path / f"o{orientation}.jpg", orientation) for orientation in ORIENTATIONS]
    pixels = open_or_build(paths, workers=0, log=lambda _: None)
    not_cached = [o for o, i in zip(ORIENTATIONS, range(len(paths))) if pixels.get(i) is None]
    assert not not_cached, f"orientations not cached: {not_cached}"
    for orientation, i in zip(ORIENTATIONS, range(len(paths))):
        assert torch.equal(pixels.get(i), decode_bytes(read_bytes(paths[i]), paths[i]))
        assert mean_diff(pixels.get(i), upright(paths[i])) < 1.0, orientation
