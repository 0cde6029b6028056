"""`device_decode`, the device's half: decode a batch of JPEGs there, then crop, resize, flip (in uint8).

The workers send each image's bytes and its crop (data/encoded.py). Here the batch is decoded in one call
(TorchCodec's batched nvJPEG `decode_jpeg(list, device=...)`, torchvision.io's where TorchCodec does not load
beside this torch), and every image is cut, turned upright, resized and flipped with the host path's own
functions (torchvision's antialiased resize), so the pixels are the host path's up to the decoders' rounding.
The batch stays uint8 until data/device.py normalizes it. It runs inside the transfer stage: with the
prefetcher, on its side stream, so the decoding of batch i+1 overlaps the step on batch i.

The same code runs on `device="cpu"` (the decoders' CPU paths): that is how the tests compare it with the
host path on the same boxes. The switch only turns it on for CUDA (techniques/device_decode.py).

A batch the device decoder refuses as a whole is decoded image by image; an image it refuses alone is decoded
on the host (counted with the host-decoded ones); one the host cannot decode either is dropped from the batch
and counted as an unreadable file, as the workers would have counted it.
"""
from __future__ import annotations

import logging
import warnings
from collections import deque
from typing import Any

import torch

from .datasets import Skipped
from .encoded import EncodedBatch, EncodedImage
from .imagefolder import default_decoder, describe_error

log = logging.getLogger("trainfast.data")

NAMED = 5        # host-decoded files named in the log and the notes (the rest are counted)


def turn_upright(pixels: torch.Tensor, orientation: int) -> torch.Tensor:
    """A stored [C, H, W] cut turned as EXIF `orientation` says (PIL's transposes in imagefolder.TRANSPOSES)."""
    if orientation == 2:
        return pixels.flip(-1)
    if orientation == 3:
        return pixels.flip(-2, -1)
    if orientation == 4:
        return pixels.flip(-2)
    if orientation == 5:
        return pixels.transpose(-2, -1)
    if orientation == 6:
        return pixels.transpose(-2, -1).flip(-1)
    if orientation == 7:
        return pixels.transpose(-2, -1).flip(-2, -1)
    if orientation == 8:
        return pixels.transpose(-2, -1).flip(-2)
    return pixels


def cut_and_resize(pixels: torch.Tensor, item: EncodedImage) -> torch.Tensor:
    """The stored pixels of one image -> its uint8 [3, S, S] sample: the host path's geometry (TrainCrop:
    box, resize to S x S, flip; ValCrop: resize the short side, centre crop), on whatever device holds them."""
    from torchvision.transforms.v2 import functional as TF

    left, top, right, bottom = item.box
    if not (0 <= left < right <= pixels.shape[-1] and 0 <= top < bottom <= pixels.shape[-2]):
        raise ValueError(f"crop box {item.box} outside the decoded {tuple(pixels.shape[-2:])} pixels")
    crop = turn_upright(pixels[:, top:bottom, left:right], item.orientation)
    if item.short_side is None:
        image = TF.resize(crop, [item.size, item.size], antialias=True)
        return image.flip(-1) if item.flip else image
    return TF.center_crop(TF.resize(crop, item.short_side, antialias=True), item.size)


def decode_jpegs(data: list[torch.Tensor], device: torch.device, decoder: str | None = None) -> list[torch.Tensor]:
    """uint8 [3, H, W] RGB of each JPEG's stored pixels, decoded on `device` in one batched call."""
    if (decoder or default_decoder()) == "torchcodec":
        from torchcodec.decoders import decode_jpeg

        return decode_jpeg(data, mode="RGB", device=device)
    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The image decoding and encoding capabilities", DeprecationWarning)
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


class HostDecoded:
    """What the run decoded on the host instead of the device: counted per pass (the epoch records and the
    ablation's notes), the first NAMED files named with the reason (the log, and the notes)."""

    def __init__(self) -> None:
        self.total = self.pass_count = 0
        self.named: deque = deque(maxlen=NAMED)
        self.logged = 0

    def add(self, path: str, reason: str) -> None:
        self.total += 1
        self.pass_count += 1
        if len(self.named) < NAMED:
            self.named.append(f"{path} ({reason})")
        if self.logged < NAMED:
            self.logged += 1
            log.info("device_decode: %s decoded on the host (%s)%s", path, reason,
                     "; further ones are counted, not logged" if self.logged == NAMED else "")

    def take_pass(self) -> int:
        count, self.pass_count = self.pass_count, 0
        return count


class DeviceDecoder:
    """Encoded batches -> uint8 [B, 3, S, S] images on `device`. `tally`: the loader's BadFileTally, which
    counts an image neither the device nor the host can decode (None: such an image raises)."""

    def __init__(self, device: torch.device, tally=None, decoder: str | None = None) -> None:
        self.device, self.tally, self.decoder = torch.device(device), tally, decoder
        self.host = HostDecoded()

    def __call__(self, batch: Any) -> Any:
        """(EncodedBatch, targets, ...) -> (images, targets, ...); targets lose the rows of dropped images."""
        encoded, *rest = batch
        images, kept = self.decode(encoded)
        if len(kept) != len(encoded):
            index = torch.tensor(kept, dtype=torch.long)
            rest = [t[index.to(t.device)] if isinstance(t, torch.Tensor) else t for t in rest]
        return (images, *rest)

    def decode(self, encoded: EncodedBatch) -> tuple[torch.Tensor, list[int]]:
        items = encoded.items
        on_device = [i for i, item in enumerate(items) if item.data is not None]
        decoded = dict(zip(on_device, self._decode_all([items[i] for i in on_device])))
        samples, kept = [], []
        for i, item in enumerate(items):
            if item.data is None:
                if item.host_reason:
                    self.host.add(item.path, item.host_reason)
                samples.append(item.pixels.to(self.device, non_blocking=True))
                kept.append(i)
                continue
            sample = self._cut(decoded[i], item)
            if sample is not None:
                samples.append(sample)
                kept.append(i)
        if not samples:
            raise ValueError("device_decode: no image of the batch could be decoded")
        return torch.stack(samples), kept

    def _decode_all(self, items: list[EncodedImage]) -> list[torch.Tensor | Exception]:
        if not items:
            return []
        try:
            return list(decode_jpegs([item.data for item in items], self.device, self.decoder))
        except Exception:           # noqa: BLE001 - one bad file fails the batched call: find it
            return [self._decode_one(item) for item in items]

    def _decode_one(self, item: EncodedImage) -> torch.Tensor | Exception:
        try:
            return decode_jpegs([item.data], self.device, self.decoder)[0]
        except Exception as exc:    # noqa: BLE001 - decoded on the host instead (see _cut)
            return exc

    def _cut(self, pixels: torch.Tensor | Exception, item: EncodedImage) -> torch.Tensor | None:
        """The image's sample from its device-decoded pixels; where the device failed, from the host's."""
        if not isinstance(pixels, Exception):
            try:
                return cut_and_resize(pixels, item)
            except (RuntimeError, ValueError) as exc:
                pixels = exc
        try:
            from .imagefolder import decode_bytes

            # The bytes hold no orientation tag any more (encoded.strip_exif): the host gives stored pixels too.
            stored = decode_bytes(bytearray(item.data.numpy().tobytes()), _jpeg_path(item.path), "torchvision")
            sample = cut_and_resize(stored, item).to(self.device, non_blocking=True)
        except (RuntimeError, OSError, ValueError) as exc:
            if self.tally is None:
                raise
            self.tally.record_skip(Skipped(item.path, f"{type(exc).__name__}: {describe_error(exc)}"))
            return None
        self.host.add(item.path, f"the device decoder refused it: {describe_error(pixels)}")
        return sample


def _jpeg_path(path: str):
    from pathlib import Path

    return Path(path).with_suffix(".jpg")     # decode_bytes picks its decoder by suffix: these bytes are JPEG


def is_encoded(batch: Any) -> bool:
    return isinstance(batch, (tuple, list)) and bool(batch) and isinstance(batch[0], EncodedBatch)


def host_decoded_last_pass(batches: Any, device: torch.device | None = None) -> int:
    """Images decoded on the host instead of the device in the last pass over `batches` (DeviceBatches or the
    Prefetcher built by data/device.py), summed over ranks: a collective, called where skipped_last_pass is."""
    from .badfiles import reduce_count

    decoder = getattr(batches, "decoder", None)
    return reduce_count(decoder.host.take_pass() if decoder is not None else 0, device)


def host_decoded_names(batches: Any) -> list[str]:
    """The first host-decoded files of the run, each with its reason (this rank's)."""
    decoder = getattr(batches, "decoder", None)
    return list(decoder.host.named) if decoder is not None else []
