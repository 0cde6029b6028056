"""The doctor's language-model observations: how much of each batch is padding and what packing it would save, and
the attention backend against the others this device runs, each measured on the run's own model replaying one
batch, the forms alternating step by step so a slow spell of the machine hits both alike.

Two observers share it. The built-in run (observe_text) replays its own optimizer steps (doctor/builtin.py:
run_steps). A watched loop or script (observe_loop_text) has no step of its own the doctor may take, so each form
is one forward and one backward of the script's model, its gradients returned rather than added to its .grad (the
script's next step is untouched) and its random streams forked (a dropout's draws are the script's own after)."""
from __future__ import annotations

import contextlib
import inspect
import statistics
import time
from itertools import islice
from types import SimpleNamespace
from typing import Any, Callable

import torch

from ..instruments.tensors import tensors_of

BATCHES_READ = 16               # loader batches whose padding share is counted
REPLAYS = 6                     # timed replays of each form, after one warm-up each
NO_POSITIONS = ("the model's forward takes no position_ids, which packed rows need: they restart at each document "
                "so that its attention stays inside it")


def observe_text(run, batch, replay_steps) -> dict[str, Any] | None:
    """{"padding": ..., "attention": ...} for a language-model run, None for any other. `replay_steps(batches)`:
    the run's own optimizer steps on those batches, their StepTimer entries (doctor/builtin.py: run_steps)."""
    from ..techniques.attention import holder
    from ..techniques.transfer import to_device
    from ..text.batching import PackCollate, TokenBatch

    inputs, labels = batch
    if not isinstance(inputs, TokenBatch):
        return None
    read = list(islice(iter(run.train_batches), BATCHES_READ))
    slots = sum(b[0].slots for b in read)
    tokens = sum(b[0].rate_count for b in read)
    share = 1 - tokens / slots if slots else 0.0
    if "position_ids" in inputs:         # the batches are packed already: nothing to compare them with
        padding: dict[str, Any] = {"share": share, "batches": len(read), "packed": True}
    else:
        packed = to_device(PackCollate(run.split.pad_id)(documents_of(inputs)), run.device)
        padding = measure_padding(share, len(read), batch, packed, replay_steps)
    return {"padding": padding,
            "attention": observe_attention(holder(run.state.model), run.device, batch, replay_steps)}


def measure_padding(share: float, batches: int, padded, packed, replay_steps) -> dict[str, Any]:
    """The padding record every observer writes: the share of the positions that were padding over `batches`
    batches, and a step of the same documents padded and packed (medians of alternating replays)."""
    times = alternate(replay_steps, {"padded": padded, "packed": packed})
    return {"share": share, "batches": batches, "packed": False, "padded_s": times["padded"],
            "packed_s": times["packed"]}


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


def observe_attention(model, device: torch.device, batch, replay_steps) -> dict[str, Any]:
    """The backend `model` (a transformers model) uses and the step time with each backend this device and model
    run without compiling (eager, sdpa; flash where its package and a GPU are here), the model switched back
    after."""
    from ..techniques.attention import backend_effect, in_use, set_attention

    current = in_use(model)
    if current is None or not hasattr(model, "set_attn_implementation"):
        return {"in_use": None}
    tried = [b for b in ("eager", "sdpa", "flash") if b == current
             or backend_effect(b, device, model).acts]
    if len(tried) < 2:
        return {"in_use": current, "seconds": {}}
    try:
        seconds = alternate(replay_steps, {backend: batch for backend in tried}, lambda b: set_attention(model, b))
    finally:
        set_attention(model, current)
    return {"in_use": current, "seconds": seconds}


# --- a watched loop's or script's model -----------------------------------------------------------------------

def observe_loop_text(model, count, device: torch.device, autocast: torch.dtype | None) -> dict[str, Any] | None:
    """{"padding": ..., "attention": ...} for a loop whose training forwards took token ids, from its token count
    (instruments/batches.py: TokenCount, its padding share and the batch it kept): the kept batch replayed as it
    was and its documents packed without padding (text/batching.py: pack, position ids restarting at each one),
    on the loop's model. Where packing cannot act (no position_ids in the forward, a batch it cannot pack) the
    record says why instead of a time. `autocast`: the half type the loop's forwards ran under autocast, if any.
    None when the padding was never counted."""
    from ..techniques.attention import holder
    from ..text.packing import PackingCollator, takes_positions

    share, batch = count.padding_share(), count.kept
    if share is None or batch is None:
        return None
    padding: dict[str, Any] = {"share": share, "batches": count.forwards, "packed": share == 0.0}
    steps = forward_backward(model, device, autocast)
    cannot = (None if padding["packed"] else NO_POSITIONS if not takes_positions(model)
              else PackingCollator.cannot_pack(batch))
    if cannot:
        padding["cannot_pack"] = cannot
    elif not padding["packed"]:
        padding = measure_padding(share, count.forwards, batch, packed_form(batch, count.pad_id), steps)
    return {"padding": padding, "attention": observe_attention(holder(model), device, batch, steps)}


def packed_form(batch: dict[str, Any], pad_id: int | None) -> dict[str, Any]:
    """A padded batch's documents packed as the padding_free switch packs a script's batches (text/packing.py:
    PackingCollator), on the batch's device: input_ids, position_ids and labels."""
    from ..instruments.batches import real_positions
    from ..text.batching import pack

    ids, labels = batch["input_ids"], batch["labels"]
    real = real_positions(batch, pad_id)
    real = torch.ones_like(ids, dtype=torch.bool) if real is None else real
    docs = [row[keep] for row, keep in zip(ids.cpu(), real.cpu())]
    targets = [row[keep] for row, keep in zip(labels.cpu(), real.cpu())]
    packed, packed_labels = pack(docs, targets, pad_id if pad_id is not None else 0)
    return {name: t.to(ids.device) for name, t in {**packed, "labels": packed_labels}.items()}


def forward_backward(model, device: torch.device, autocast: torch.dtype | None) -> Callable[[list], list]:
    """A replay of a loop's step on `model` for batches given as its keyword arguments: one forward, then the
    gradients of its loss (its outputs' sum where it computes none) for every trained parameter, returned by
    torch.autograd.grad and dropped, so nothing the loop's optimizer reads changes. Each one timed alone, the
    device synchronized at both ends; the entries carry `seconds` as the built-in run's StepTimer entries do."""
    params = [p for p in model.parameters() if p.requires_grad]
    keywords = takes_ids_by_name(model)
    cuda = device.type == "cuda"

    def steps(batches: list) -> list:
        done = []
        for batch in batches:
            context = torch.autocast(device.type, autocast) if autocast is not None else contextlib.nullcontext()
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            with torch.random.fork_rng(devices=[device] if cuda else []), torch.enable_grad(), context:
                rest = {k: v for k, v in batch.items() if k != "input_ids"}
                output = model(**batch) if keywords else model(batch["input_ids"], **rest)
                loss = getattr(output, "loss", None)
                if not isinstance(loss, torch.Tensor):
                    loss = sum(t.float().sum() for t in tensors_of(output) if t.requires_grad)
                torch.autograd.grad(loss, params, allow_unused=True)
            if cuda:
                torch.cuda.synchronize(device)
            done.append(SimpleNamespace(seconds=time.perf_counter() - start))
        return done
    return steps


def takes_ids_by_name(model) -> bool:
    """Whether the model's forward takes `input_ids` by that name (a transformers model); else the ids go first."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return True
    return "input_ids" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
