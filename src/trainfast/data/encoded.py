"""`device_decode`, the worker's half: read a file's bytes and draw its crop; the device decodes the batch.

On a GPU fed by a compiled model, CPU workers decoding JPEGs are the epoch's floor (12 workers deliver ~3,450
320x256 images/s, a compiled ResNet-50 step eats ~6,400). nvJPEG decodes a batch of JPEGs on the device far
faster, so with this switch the workers do only what needs the file: read its bytes, parse its header (size
and EXIF orientation, ~0.02 ms), and draw the crop exactly as the host path draws it (the same torchvision
sampler on the same upright size, then the flip, from the same worker RNG: same seed, same boxes). The batch
then travels as encoded bytes plus boxes, and data/device_decode.py decodes, crops, resizes, flips and
normalizes it on the device.

What the device decoder cannot take is decoded here, on the host, by the host path's own transform (same
draws, same pixels as without the switch), and counted and named in the run's notes: files that are not JPEG
(PNG, WebP, GIF, BMP, ...), CMYK/YCCK JPEGs (nvJPEG refuses them), and JPEGs whose bytes do not end with the
end-of-image marker (a truncated file: the host decoder then raises and the file is skipped and counted as
unreadable, exactly as without the switch). A file whose header cannot be read goes the same way.

EXIF orientation: the box is drawn on the upright size (sides swapped for orientations 5-8), as on the host
path, and mapped into the stored pixels (imagefolder.stored_box); the device cuts that box from the stored
pixels and turns only the cut. The decoders disagree about the tag (TorchCodec applies it, torchvision's
decode_jpeg does not unless asked), so the tag's segment is removed from the bytes the device gets: every
decoder then gives the stored pixels, and the turn is done once, by us.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import torch

from .imagefolder import CROP_RATIO, CROP_SCALE, exif_orientation, read_bytes, stored_box

APP1, SOS, EOI = 0xE1, 0xDA, b"\xff\xd9"
EXIF_ID = b"Exif\x00\x00"


@dataclass
class EncodedImage:
    """One sample on its way to the device. Either `data` (a JPEG's bytes, uint8 1-D) with the crop to cut from
    its stored pixels, or `pixels` (uint8 [3, S, S], already cropped on the host) with the reason it was."""
    path: str
    size: int                                   # output side (train) or centre crop side (val)
    data: torch.Tensor | None = None
    box: tuple[int, int, int, int] = (0, 0, 0, 0)  # (left, top, right, bottom) in the stored pixels
    orientation: int = 1                        # EXIF 1-8: how to turn the cut to make it upright
    flip: bool = False
    short_side: int | None = None               # val: resize the short side to this, then centre-crop `size`
    pixels: torch.Tensor | None = None
    host_reason: str = ""                       # why the host decoded it ("" when the device does)


class EncodedBatch:
    """A batch's images before decoding. Not a tensor, tuple, list or mapping: the transfer
    (techniques/transfer.map_tensors) passes it through untouched, since the decoder reads the bytes from host
    memory itself."""

    def __init__(self, items: list[EncodedImage]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __reduce__(self):                       # crosses the worker queue as its items
        return EncodedBatch, (self.items,)


def collate_encoded(images: list[EncodedImage]) -> EncodedBatch:
    return EncodedBatch(list(images))


def jpeg_header(data: bytearray) -> tuple[tuple[int, int], int, str] | tuple[None, int, str]:
    """((stored width, height), EXIF orientation, "") for a JPEG the device decoder can take, else
    (None, 1, why the host decodes it). Reads the header only."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "JPEG":
                return None, 1, f"{image.format or 'unknown format'}, not JPEG"
            if image.mode not in ("RGB", "L"):
                return None, 1, f"{image.mode} JPEG (the device decoder takes RGB and grayscale)"
            return image.size, exif_orientation(image), ""
    except Exception as exc:                    # noqa: BLE001 - the host path names what is wrong with it
        return None, 1, f"header unreadable ({type(exc).__name__})"


def ends_complete(data: bytearray) -> bool:
    """Whether a JPEG's bytes end with the end-of-image marker (trailing zero padding allowed): a truncated
    file does not, and goes to the host decoder, which raises on it (skipped and counted)."""
    end = len(data)
    while end > 2 and data[end - 1] == 0:
        end -= 1
    return data[end - 2:end] == EOI


def strip_exif(data: bytearray) -> bytearray:
    """The JPEG without its EXIF (APP1 "Exif") segment, so that no decoder turns the pixels: the turn is applied
    once, after the crop. Segments are walked from the start to the first scan; anything unexpected returns
    the bytes unchanged (then the decoders' pixels would be checked by the shape: see device_decode)."""
    if data[:2] != b"\xff\xd8":
        return data
    position, cut = 2, []
    while position + 4 <= len(data) and data[position] == 0xFF:
        marker = data[position + 1]
        if marker == SOS:
            break
        length = int.from_bytes(data[position + 2:position + 4], "big")
        if marker == APP1 and data[position + 4:position + 10] == EXIF_ID:
            cut.append((position, position + 2 + length))
        position += 2 + length
    for start, stop in reversed(cut):
        del data[start:stop]
    return data


class EncodeCrop:
    """The transform ImageFiles uses under device_decode: (path, cached) -> EncodedImage. Train draws the
    RandomResizedCrop box and the flip as TrainCrop does (same sampler, same order, same RNG); val keeps the
    whole image and lets the device resize it and cut the centre (ValCrop's geometry). `host` is the host
    path's transform, used for what the device decoder cannot take."""

    def __init__(self, size: int, train: bool, host) -> None:
        self.size, self.train, self.host = size, train, host
        self.short_side = None if train else host.short_side

    def __call__(self, path: Path, cached: torch.Tensor | None = None) -> EncodedImage:
        if cached is not None:     # the decode cache holds the pixels already: nothing to decode anywhere
            return EncodedImage(str(path), self.size, pixels=self.host(path, cached), host_reason="")
        data = read_bytes(path)
        stored, orientation, why = jpeg_header(data)
        if stored is not None and not ends_complete(data):
            why = "no end-of-image marker (truncated?)"
        if why:
            # The host transform reads and draws again: same draws as without the switch (nothing drawn yet).
            return EncodedImage(str(path), self.size, pixels=self.host(path), host_reason=why)
        width, height = stored if orientation < 5 else stored[::-1]          # the upright size
        if self.train:
            from torchvision.transforms import RandomResizedCrop

            top, left, h, w = RandomResizedCrop.get_params(torch.empty(0, height, width), CROP_SCALE, CROP_RATIO)
            box = (left, top, left + w, top + h)
            flip = torch.rand(1).item() < 0.5            # drawn after the box, as TrainCrop draws it
        else:
            box, flip = (0, 0, width, height), False
        if orientation != 1:
            data = strip_exif(data)
        return EncodedImage(str(path), self.size, torch.frombuffer(data, dtype=torch.uint8),
                            stored_box(box, orientation, stored), orientation, flip, self.short_side)


def encode_on_workers(dataset):
    """A copy of an ImageFiles dataset whose items are EncodedImage (bytes and boxes) instead of pixels."""
    import copy

    encoded = copy.copy(dataset)
    host = dataset.transform            # TrainCrop or ValCrop, with the dataset's host decoder
    if isinstance(host, EncodeCrop):
        return dataset
    encoded.transform = EncodeCrop(dataset.image_size, dataset.train, host)
    return encoded


def encodes(dataset) -> bool:
    """Whether a dataset hands out EncodedImage items (its images are decoded on the device)."""
    return isinstance(getattr(dataset, "transform", None), EncodeCrop)
