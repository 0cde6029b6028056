"""fast_fp32_matmul: fp32 matrix multiplications computed in a faster type inside, the result still fp32.

`torch.set_float32_matmul_precision("medium")` lets PyTorch compute an fp32 matmul (nn.Linear, attention's
products, torch.mm) with bf16 inputs on a CPU that has native bf16 (AVX512-BF16 or AMX: oneDNN's matmul) and in
TF32 on an NVIDIA GPU from Ampere on (cuBLAS). Both keep fp32 accumulation and fp32 tensors everywhere else: the
weights, the optimizer, the activations and the loss stay fp32; only the products' inputs lose mantissa bits
(bf16: 8, TF32: 11). It is what a run that cannot use mixed precision (an fp32 recipe, a loss sensitive to
half-type activations) can still take of the half type's speed: the gain is the share of the step spent in fp32
matmuls, largest on a transformer without autocast, nothing where autocast already runs them in bf16 or fp16.
Convolutions are left as they are (cuDNN already runs them in TF32 by default on a GPU).

What it costs: the products are less exact (a relative error of about 1e-3 per product, averaged down over the
sum), so it changes the arithmetic: the ablation checks the run's metric against the baseline's band.

The setting belongs to the process (a library-wide flag, no variable to start with): a Session sets it when it
starts, a framework adapter as it switches the script, and a command the ablation runs gets it as soon as its
Python imports torch (the probe's start-up), so a script with neither is measured and recommended with it too.
Elsewhere (a CPU without native bf16, where the products would be emulated; a GPU before Ampere) it is not
applicable. `in_effect()` is the read-back: the backends' own flags.
"""
from __future__ import annotations

import functools
import platform
import sys
from typing import TYPE_CHECKING

from .switch import ADAPTERS, ProcessWideSwitch, RungSpec, Switch

if TYPE_CHECKING:
    import torch

    from .base import Effect

FIELD = "fast_fp32_matmul"
LABEL = "torch.set_float32_matmul_precision('medium')"
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")      # x86 (AVX512-BF16, AMX) and Arm (FEAT_BF16) cpuinfo flags

_applied = False                  # set in this process by apply()


@functools.lru_cache(maxsize=None)
def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 products natively (read from /proc/cpuinfo; elsewhere: not known, no)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = {word for line in f if line.startswith(("flags", "Features")) for word in line.split()}
    except OSError:
        return False
    return any(flag in flags for flag in CPU_BF16_FLAGS)


def effect(device: torch.device) -> Effect:
    import torch

    from .base import ACTS, Effect

    if device.type == "cuda":
        if torch.cuda.get_device_capability(device) < (8, 0):
            return Effect(False, "TF32 matmuls need an NVIDIA GPU from Ampere on (compute capability 8.0)")
        return ACTS
    if device.type != "cpu":
        return Effect(False, f"no reduced fp32 matmul on {device.type}")
    if not cpu_has_bf16() or not torch.backends.mkldnn.is_available():
        return Effect(False, f"this CPU ({platform.processor() or platform.machine()}) has no native bf16 "
                             "(AVX512-BF16, AMX or Arm BF16): its bf16 products would be emulated, not faster")
    return ACTS


def in_effect() -> bool:
    """Whether this process's fp32 matmuls run in a reduced type: the CPU backend's or the GPU backend's flag."""
    if "torch" not in sys.modules:
        return False
    import torch

    return (torch.backends.mkldnn.matmul.fp32_precision == "bf16"
            or torch.backends.cuda.matmul.fp32_precision == "tf32")


def apply(on: bool) -> bool:
    """Set the reduced fp32 matmul (on), or undo a setting this module made (off). The legacy call is used on
    purpose: PyTorch refuses to read the precision back once the legacy and the per-backend settings are mixed,
    and libraries (Lightning among them) read it with the legacy getter."""
    global _applied
    import torch

    if on and not _applied:
        torch.set_float32_matmul_precision("medium")
        _applied = True
    elif not on and _applied:
        torch.set_float32_matmul_precision("highest")
        _applied = False
    return in_effect()


SWITCHES = (
    Switch((FIELD,),
           rungs=(RungSpec(FIELD, {FIELD: True}, place=46, tune=7.5),),
           resumable=True,
           device_effect=effect,
           process_wide=ProcessWideSwitch(LABEL, environ=dict, in_effect=in_effect, apply=apply,
                                       keep=f"call {LABEL} at the top of the script"),
           frameworks={name: f"{LABEL} in the script's process, as torch is imported" for name in ADAPTERS}),
)
