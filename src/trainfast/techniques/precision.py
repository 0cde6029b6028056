"""Precision: one interface (forward context, backward, unscale, optimizer step, state) so the engine
step never branches on dtype. fp32 is the no-op object; bf16 is autocast alone (same exponent range as
fp32, so no loss scaling); fp16 is autocast plus a dynamic GradScaler on the run's device.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from .base import ACTS, Effect

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """fp32: every hook is the plain PyTorch call, so an fp32 run is bit-identical to a plain loop."""

    name = "fp32"
    dtype = torch.float32

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def forward_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale (before clipping). No-op without a scaler."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def effect(self, device: torch.device) -> Effect:
        return ACTS


class Autocast(Precision):
    """torch.autocast in bf16 or fp16. fp16 gradients underflow without loss scaling, so fp16 carries a
    torch.amp.GradScaler: scale the loss, unscale before clipping, skip steps with inf/NaN grads."""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device)
        self.dtype = dtype
        self.name = "bf16" if dtype == torch.bfloat16 else "fp16"
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        self._skipped = torch.zeros((), dtype=torch.long, device=device)   # counted on the device, no sync

    def forward_context(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        # scaler.step skips optimizer.step when it found inf/NaN; update() then backs the scale off, so a
        # drop of the (device-side) scale marks a skipped step without reading anything on the host.
        if not self.scaler.is_enabled():
            optimizer.step()
            return
        scale_before = self.scaler._scale.clone()
        self.scaler.step(optimizer)
        self.scaler.update()
        self._skipped += (self.scaler._scale < scale_before).squeeze()

    def metrics(self) -> dict[str, float]:
        if not self.scaler.is_enabled():
            return {}
        return {"loss_scale": float(self.scaler.get_scale()), "skipped_steps": int(self._skipped)}

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict(), "skipped_steps": int(self._skipped)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self._skipped.fill_(int(state.get("skipped_steps", 0)))


def build_precision(name: str, device: torch.device) -> Precision:
    if name == "fp32":
        return Precision(device)
    return Autocast(device, DTYPES[name])


def has_fast_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls have hardware support: AMX/AVX512-BF16 on CPU, Ampere+ on CUDA."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})
    return False


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def auto_amp_dtype(device: torch.device) -> str:
    """The AMP rung's dtype when the user asks for 'auto': bf16 where it is fast, else fp16 + scaler."""
    return "bf16" if has_fast_bf16(device) else "fp16"
