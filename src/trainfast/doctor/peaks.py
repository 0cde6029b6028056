"""The compute side of the doctor's observations: a loop's training FLOPs per sample (the built-in run's, an own
loop's) and the matmul peaks they are compared with, in the loop's dtype and in the half type mixed precision
would use."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..measure import measure_ceiling
from ..techniques.precision import DTYPES, auto_amp_dtype, slow_half_reason
from ..instruments.watch import Watch

DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}      # torch.bfloat16 -> "bf16"


def measure_flops(model: nn.Module, loss_fn: Callable, batch, recipe, device: torch.device):
    """(training FLOPs per sample on this batch, the matmul peak in the run's dtype), or Nones when the
    counter cannot trace the model. The same two instruments the ablation's `% of matmul peak` uses."""
    from ..measure import count_train_flops

    inputs, targets = batch[0], batch[1]
    try:
        per_sample = count_train_flops(model, loss_fn, inputs, targets) / max(1, inputs.shape[0])
    except Exception:
        return None, None
    # A half type without fast kernels here (fp16 on most CPUs) stops the ceiling's size early: still short.
    return per_sample, measure_ceiling(device, DTYPES[recipe.precision], repeats=3)


def half_ceiling(device: torch.device, precision: str) -> tuple[str, float] | None:
    """For an fp32 loop: the half type mixed precision would use here and its measured matmul peak; None for a
    loop already in a half type, or where the half type runs in slow generic kernels (no bf16/fp16 hardware)."""
    if precision != "fp32":
        return None
    half = auto_amp_dtype(device)
    if slow_half_reason(device, half):
        return None
    return half, measure_ceiling(device, DTYPES[half], repeats=3)


def loop_dtype(watch: Watch) -> torch.dtype:
    """The dtype of the loop's training forwards (autocast's or the weights'; ForwardWatch.compute_dtype),
    fp32 for any other (the peak measured for a matmul in it)."""
    return watch.forwards.compute_dtype if watch.forwards.compute_dtype in DTYPE_NAMES else torch.float32


def loop_flops(watch: Watch, device: torch.device) -> tuple[float | None, float | None]:
    """An own loop's training FLOPs per sample, counted on a copy of its model with its last training input:
    the forward, then the backward of the sum of the outputs (a loss adds next to nothing beside the model);
    and the matmul peak in the loop's dtype. Nones when the model cannot be copied or counted (a DDP wrapper, say)."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    from ..instruments.tensors import tensors_of
    from ..measure import batch_samples

    forwards = watch.forwards
    model = forwards.root() if forwards.root is not None else None
    if model is None or not forwards.last_input:
        return None, None
    forwards.paused = True                # the copy's forward is not the loop's
    try:
        shadow = copy.deepcopy(model).train()
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.enable_grad(), FlopCounterMode(display=False) as counter:
            outputs = [t for t in tensors_of(shadow(*forwards.last_input)) if t.requires_grad]
            sum(t.float().sum() for t in outputs).backward()
        per_sample = counter.get_total_flops() / max(1, batch_samples(forwards.last_input[0]))
        return per_sample, measure_ceiling(device, loop_dtype(watch), repeats=3)
    except Exception:
        return None, None
    finally:
        forwards.paused = False


def token_flops(model: nn.Module, count, device: torch.device, dtype: torch.dtype) -> tuple[float | None, float | None]:
    """A token loop's training FLOPs per real token, the rate's unit (its steps' tokens: instruments/batches.py),
    and the matmul peak in the loop's dtype. A transformers model's per token: text.models.flops_per_token, 6 x
    the parameters a token's matrices use plus attention's term, with the context a token of the kept batch's
    documents sees on average (a document of n tokens gives each of its n tokens n); any other model's: 6 x its
    parameters beside the embeddings (forward and backward of every matrix a token passes through)."""
    from ..instruments.batches import real_positions
    from ..text.models import flops_per_token

    batch = count.kept or {}
    real = real_positions(batch, count.pad_id) if "input_ids" in batch else None
    lengths = (real.sum(1).tolist() if real is not None else
               [batch["input_ids"].shape[1]] * batch["input_ids"].shape[0] if batch else [])
    context = sum(n * n for n in lengths) / max(1, sum(lengths))
    try:
        per_token = flops_per_token(model, context)
    except (AttributeError, TypeError):          # not a transformers model: no config to read its shape from
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        per_token = 6.0 * sum(p.numel() for p in model.parameters() if id(p) not in embeddings)
    return per_token, measure_ceiling(device, dtype, repeats=3)
