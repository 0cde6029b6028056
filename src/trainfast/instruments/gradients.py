"""The gradients between two optimizer steps, and the zero_grad calls that clear them: the doctor's gradient
instruments (watch.py arms them around a loop and keeps what they find).

A hook on one parameter of each stepped optimizer runs each time a gradient arrives, just before autograd
adds it into .grad, so it sees what zero_grad left there (freed: set_to_none; zeros: zeroed in place; the
last step's values: not cleared), whatever the order of zero_grad, forward and backward in the loop
(interval_state). Beside it, `Optimizer.zero_grad` and `nn.Module.zero_grad` are wrapped while the watch is
on (wrap_zero_grad), so a finding can name the call, its set_to_none and its line.
"""
from __future__ import annotations

import functools
import inspect
import os
import sys
import time
from collections import Counter
from typing import Any, Callable

import torch
from torch import nn

from .syncs import PASS_THROUGH, TORCH_DIR, TRAINFAST_DIR, describe

# trainfast's Session forwards a loop's zero_grad to the real optimizer: the loop's line is the one to name.
FORWARDING = tuple(os.path.join(TRAINFAST_DIR, d) + os.sep for d in ("session", "techniques"))


def grads_state(params) -> str:
    """What these parameters' gradients hold just before a new step's gradient is added into them: "none"
    (freed: set_to_none), "zeroed" (kept and zeroed in place: one memset per step), "carried" (kept with values:
    no zero_grad since the last step, so this step's gradients add to the last one's). One host read."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return "none"
    nonzero = torch.stack([g.detach().abs().amax().float() for g in grads]).amax()
    return "carried" if bool(nonzero > 0) else "zeroed"


def interval_state(seen: list[str]) -> str:
    """What zero_grad did between two steps of an optimizer, from what each gradient arrival on one of its
    parameters found in .grad: "none" or "zeroed" anywhere means the last step's values were cleared before
    the next step (a GAN's generator backward may reach the discriminator's gradients before the
    discriminator's own zero_grad; a later micro-batch finds the earlier ones'); "carried" only when every
    arrival found values, the first of them the last step's."""
    for state in ("none", "zeroed"):
        if state in seen:
            return state
    return seen[0]


def graded_param(optimizer, tries: int = 8) -> nn.Parameter | None:
    """A parameter of this optimizer whose gradient is not all zero right after its step (so a zero there at
    the next step was put there by a zero_grad, not by the data); None when the first `tries` with a gradient
    are all zero. One host read each."""
    seen = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None or not p.requires_grad:
                continue
            if bool(p.grad.detach().abs().amax() > 0):
                return p
            seen += 1
            if seen >= tries:
                return None
    return None


def time_call(fn: Callable, device: torch.device) -> float:
    """Seconds fn() took, the device synchronized on both sides (never inside a timed step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def wrap_zero_grad(owner: type, on_call: Callable[[Any, bool], None]) -> Callable:
    """Replaces `owner.zero_grad` with one that calls on_call(obj, set_to_none) and then the original; returns
    the original, for the caller to put back."""
    original = owner.zero_grad
    parameters = inspect.signature(original).parameters
    default = parameters["set_to_none"].default if "set_to_none" in parameters else True

    @functools.wraps(original)
    def counted(obj, *args, **kwargs):
        set_to_none = kwargs.get("set_to_none", args[0] if args else default)
        on_call(obj, bool(set_to_none))
        return original(obj, *args, **kwargs)

    disable = getattr(torch, "_disable_dynamo", None)      # as torch's own zero_grad: never traced
    owner.zero_grad = disable(counted) if disable is not None else counted
    return original


def time_memset(obj) -> float | None:
    """Seconds of the memset an in-place zero_grad of `obj` (a module or an optimizer) is about to make (the one
    set_to_none skips), by making it: zeroing what is zeroed next is harmless. None when it has no gradients."""
    grads = [p.grad for p in _params(obj) if p.grad is not None and not p.grad.is_sparse]
    if not grads:
        return None
    with torch.no_grad():
        return time_call(lambda: torch._foreach_zero_(grads), grads[0].device)


def zero_grad_rows(calls: Counter) -> list[dict[str, Any]]:
    """(call, set_to_none, file, line) -> calls, as rows, most calls first."""
    rows = [{"call": call, "set_to_none": stn, "where": describe((path, line)), "calls": n}
            for (call, stn, path, line), n in calls.items()]
    return sorted(rows, key=lambda r: -r["calls"])


def call_site() -> tuple[str, int] | None:
    """(file, line) of the loop's code that made the current call: past torch, the instruments' modules and the
    Session layers that forward it."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path in PASS_THROUGH or path.startswith(TORCH_DIR) or path.startswith(FORWARDING)):
            return path, frame.f_lineno
        frame = frame.f_back
    return None


def _params(obj: Any) -> list:
    if isinstance(obj, nn.Module):
        return list(obj.parameters())
    return [p for group in getattr(obj, "param_groups", []) for p in group["params"]]
