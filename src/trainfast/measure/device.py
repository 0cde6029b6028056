"""What the device holds and can do: peak memory, a model's training FLOPs, and the device's matmul ceiling
(the roof every rung is compared against)."""
from __future__ import annotations

import copy
import resource
import time
from typing import Callable

import torch
from torch import nn

from .clock import synchronize


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: the caching allocator's peak. CPU: peak resident set size of this process (Linux reports KiB)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def count_train_flops(model: nn.Module, loss_fn: Callable, inputs: torch.Tensor, targets: torch.Tensor) -> int:
    """FLOPs of one forward + backward on this batch, from torch.utils.flop_counter. Runs on a copy of
    the model with the RNG forked, so the real run's weights, BN statistics and random streams are untouched."""
    from torch.utils.flop_counter import FlopCounterMode

    shadow = copy.deepcopy(model)
    shadow.train()
    devices = [inputs.device] if inputs.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), FlopCounterMode(display=False) as counter:
        loss_fn(shadow(inputs), targets).backward()
    return int(counter.get_total_flops())


# The matmul probes read the real clock even where a script swaps time.perf_counter for its own (a test's virtual
# clock): a peak is a property of the machine, not of the run's clock.
_wall_clock = time.perf_counter


def runs_tf32(model: nn.Module | None, device: torch.device) -> bool:
    """Whether an fp32 run of this model does most of its arithmetic in TF32 on this device: on CUDA PyTorch runs
    convolutions in TF32 by default (torch.backends.cudnn.allow_tf32) and matmuls only when asked
    (torch.backends.cuda.matmul.allow_tf32, set_float32_matmul_precision). Which kernels carry the model is read
    from its weights: convolution weights outnumbering linear ones (a ResNet) make it a conv model, else (a ViT,
    whose one convolution is its patch embedding) a matmul model. The fp32 roof is then the TF32 one."""
    if device.type != "cuda" or model is None:
        return False
    def weights(kind) -> int:          # a lazy module's weight has no size yet: it counts for nothing
        return sum(m.weight.numel() for m in model.modules() if isinstance(m, kind)
                   and not isinstance(m.weight, nn.parameter.UninitializedParameter))
    conv, linear = weights(nn.modules.conv._ConvNd), weights(nn.Linear)
    return bool(torch.backends.cudnn.allow_tf32) if conv >= linear else bool(torch.backends.cuda.matmul.allow_tf32)


def measure_ceiling(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5,
                    product_seconds: float = 0.05, tf32: bool = False) -> float:
    """`tf32`: an fp32 ceiling measured with TF32 matmuls (runs_tf32: the roof of an fp32 run's kernels there)."""
    if tf32 and device.type == "cuda" and dtype == torch.float32:
        kept = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return measure_ceiling(device, dtype, n, repeats, product_seconds)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = kept
    return _measure_ceiling(device, dtype, n, repeats, product_seconds)


def _measure_ceiling(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5,
                     product_seconds: float = 0.05) -> float:
    """The device's achievable matmul FLOP/s in `dtype`: the best of `repeats` n x n x n products after a
    warm-up (a peak, so the fastest run is the estimate; slower runs are interference). 2048 is large
    enough for the CPU's BLAS to reach its peak; GPUs need 4096. The roof every rung is compared against.

    Without `n` the size grows from 256 by doubling up to that largest size, and stops as soon as one product
    takes `product_seconds`: a dtype without hardware support (bf16 on a CPU without AVX512-BF16 or AMX runs
    at ~1 GFLOP/s) would otherwise spend minutes on a 2048 product, and a product that long is at its peak."""
    largest = n or (4096 if device.type == "cuda" else 2048)
    size = n or 256
    while True:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        synchronize(device)
        t0 = _wall_clock()
        torch.mm(a, b)                      # the warm-up, and the price of one product at this size
        synchronize(device)
        if size >= largest or _wall_clock() - t0 >= product_seconds:
            break
        size *= 2
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = _wall_clock()
        torch.mm(a, b)
        synchronize(device)
        times.append(_wall_clock() - t0)
    return 2 * size**3 / min(times)
