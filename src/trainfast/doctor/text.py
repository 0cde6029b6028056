"""The doctor's language-model observations: how much of each batch is padding and what packing it would save, and
the attention backend against the others this device runs, each measured on the run's own step (its switches, its
model) replaying one batch, the forms alternating step by step so a slow spell of the machine hits both alike."""
from __future__ import annotations

import statistics
from itertools import islice
from typing import Any

import torch

BATCHES_READ = 16               # loader batches whose padding share is counted
REPLAYS = 6                     # timed replays of each form, after one warm-up each


def observe_text(run, batch, replay_steps) -> dict[str, Any] | None:
    """{"padding": ..., "attention": ...} for a language-model run, None for any other. `replay_steps(batches)`:
    the run's own optimizer steps on those batches, their StepTimer entries (doctor/builtin.py: run_steps)."""
    from ..techniques.transfer import to_device
    from ..text.batching import PackCollate, TokenBatch

    inputs, labels = batch
    if not isinstance(inputs, TokenBatch):
        return None
    read = list(islice(iter(run.train_batches), BATCHES_READ))
    slots = sum(b[0].slots for b in read)
    tokens = sum(b[0].rate_count for b in read)
    padding: dict[str, Any] = {"share": 1 - tokens / slots if slots else 0.0, "batches": len(read),
                               "packed": bool(run.recipe.padding_free)}
    if not run.recipe.padding_free:
        docs = documents_of(inputs)
        packed = to_device(PackCollate(run.split.pad_id)(docs), run.device)
        times = alternate(replay_steps, {"padded": batch, "packed": packed})
        padding.update({"padded_s": times["padded"], "packed_s": times["packed"]})
    return {"padding": padding, "attention": observe_attention(run, batch, replay_steps)}


def documents_of(inputs) -> list[torch.Tensor]:
    """The documents of a padded batch, on the host."""
    ids, mask = inputs["input_ids"].cpu(), inputs["attention_mask"].cpu()
    return [row[keep.bool()] for row, keep in zip(ids, mask)]


def alternate(replay_steps, forms: dict[str, Any], before=lambda name: None) -> dict[str, float]:
    """Median step seconds of each form: one warm-up each, then REPLAYS rounds, one step of each form a round.
    `before(name)` sets the run up for that form's step (the attention backend)."""
    for name, form in forms.items():
        before(name)
        replay_steps([form])
    seconds: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(REPLAYS):
        for name, form in forms.items():
            before(name)
            seconds[name] += [s.seconds for s in replay_steps([form])]
    return {name: statistics.median(values) for name, values in seconds.items()}


def observe_attention(run, batch, replay_steps) -> dict[str, Any]:
    """The backend in use and the step time with each backend this device and model run without compiling
    (eager, sdpa; flash where its package and a GPU are here), the model switched back after."""
    from ..techniques.attention import backend_effect, holder, in_use, set_attention

    model = holder(run.state.model)
    current = in_use(model)
    if current is None or not hasattr(model, "set_attn_implementation"):
        return {"in_use": None}
    tried = [b for b in ("eager", "sdpa", "flash") if b == current
             or backend_effect(b, run.device, model).acts]
    if len(tried) < 2:
        return {"in_use": current, "seconds": {}}
    try:
        seconds = alternate(replay_steps, {backend: batch for backend in tried}, lambda b: set_attention(model, b))
    finally:
        set_attention(model, current)
    return {"in_use": current, "seconds": seconds}
