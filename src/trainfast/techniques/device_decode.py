"""device_decode: JPEGs decoded on the device (nvJPEG, one call per batch) and cropped, resized, flipped and
normalized there; the loader workers only read the files and draw the crops (data/encoded.py,
data/device_decode.py). It takes the decode, most of a worker's time per image, off the CPU: it pays where
the workers cannot keep up with the step (a fast GPU step, a compiled model, few cores per GPU). On a CPU the
"device" is the host itself: the decode would only move from the workers into the training process, so the
switch acts on CUDA only."""
from __future__ import annotations

import torch

from .base import Effect, cuda_only
from .switch import EVERY_ADAPTER, RungSpec, Switch

FIELD = "device_decode"


def effect(device: torch.device) -> Effect:
    return cuda_only(device, "decoding JPEGs on the device (nvJPEG)")


def decode_on_device(recipe, device: torch.device) -> bool:
    """Whether a run's image-folder loaders hand their decoding to the device."""
    return bool(recipe.device_decode) and effect(device).acts


SWITCHES = (
    Switch((FIELD,),
           rungs=(RungSpec(FIELD, {FIELD: True}, place=42, tune_inputs=1,
                           held_note=(3, "decoding on the device (--device-decode)")),),
           device_effect=effect, data="image_folder",
           unreachable={EVERY_ADAPTER: "trainfast's device decoding works on its image-folder loader; the "
                                       "script's loader is the framework's"}),
)
