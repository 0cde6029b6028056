"""The tests the doctor runs on a watched model at the end (watch.py calls them): does it evaluate the same
input twice alike (dropout that ignores eval()), and which of its modules compute differently in train() and
eval()."""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn

from .syncs import SyncCounter, describe
from .tensors import tensors_of


def mode_dependent(model: nn.Module) -> dict[str, int]:
    """Modules (by class) that compute differently in train() and eval(): dropout that drops; batch norm
    (batch statistics, and its running ones updated); instance norm and attention/RNN dropout likewise."""
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd
    from torch.nn.modules.instancenorm import _InstanceNorm

    found: Counter = Counter()
    for m in model.modules():
        if ((isinstance(m, _DropoutNd) and m.p > 0) or isinstance(m, _BatchNorm)
                or (isinstance(m, _InstanceNorm) and m.track_running_stats)
                or (isinstance(m, (nn.MultiheadAttention, nn.RNNBase)) and getattr(m, "dropout", 0) > 0)):
            found[type(m).__name__] += 1
    return dict(found)


def check_eval_dropout(model: nn.Module, *inputs: Any, training: bool = False) -> dict[str, Any]:
    """In eval() and inference_mode, two forwards of the same input must agree: a difference is dropout that
    does not follow eval() (F.dropout with training=True, or its default), or a forward that samples. Returns
    the largest difference, the lines of the functional dropouts that still dropped and of the calls that drew
    random numbers. The RNG is forked, and the model's mode restored.
    training=True: the same test in the mode a loop evaluated in without model.eval() (its buffers, batch
    norm's running statistics, are put back afterwards)."""
    was_training = model.training
    device = next((t.device for t in tensors_of(inputs)), torch.device("cpu"))
    counter = SyncCounter(device.type)
    buffers = [(b, b.detach().clone()) for b in model.buffers()] if training else []
    model.train(training)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
            with counter:
                first = model(*inputs)
            second = model(*inputs)
    finally:
        model.train(was_training)
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
    pairs = list(zip(tensors_of(first), tensors_of(second)))
    diff = max((float((a.float() - b.float()).abs().max()) for a, b in pairs if a.numel()), default=0.0)
    scale = max((float(a.float().abs().max()) for a, _ in pairs if a.numel()), default=0.0)
    return {"max_diff": diff, "relative_diff": diff / scale if scale else diff,
            "calls": [describe(w) for w in counter.dropouts],
            "random_calls": [f"{call}() at {describe(where)}" for call, *where in counter.randoms]}
