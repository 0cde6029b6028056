"""The doctor on a user's own loop (observe_loop). A user's own loop is watched as the built-in run is
(builtin.py), minus what only the built-in loop allows (the replay): in this process with `observe_loop(fn)`,
or in a script with `trainfast doctor -- python train.py` (script.py), where trainfast's sitecustomize starts
the Watch (TRAINFAST_DOCTOR in the environment) and the script is stopped after its steps. Most loops evaluate
at the end of an epoch, after those steps: a loop that has not evaluated by then is kept running, untimed,
until its first evaluation forwards or `eval_within` seconds (whichever comes first), so the evaluation checks
see a real evaluation; the findings say which it was.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ..checks import Observations
from ..envcheck import collect_environment
from ..measure import detect_warmup
from ..instruments.watch import EnoughSteps, Watch
from .common import (DEFAULT_EVAL_WITHIN, DEFAULT_STEPS, add_evaluation, add_machine_load, add_page_faults, add_watch,
                     capacity, compiled_since)
from .peaks import DTYPE_NAMES, half_ceiling, loop_dtype, loop_flops, token_flops
from .text import observe_loop_text


def observe_loop(loop: Callable[[], Any], *, steps: int = DEFAULT_STEPS, sync_steps: int = 10,
                 device: str = "cpu", eval_within: float = DEFAULT_EVAL_WITHIN) -> Observations:
    """Run `loop()` (a user's training loop) under the Watch for 1 + sync_steps + steps optimizer steps, then,
    if it has not evaluated yet, up to `eval_within` more seconds (untimed) until it does; then it is stopped
    (a loop that ends sooner is read as it ends) and what was observed is returned."""
    from ..probe import compile_counters

    taken: list[Observations] = []
    before = compile_counters()            # the process's counters: what this loop compiles is their difference
    watch = Watch(None, device_type=torch.device(device).type, sync_window=(1, 1 + sync_steps),
                  stop_after=1 + sync_steps + steps, eval_within=eval_within,
                  on_stop=lambda w: taken.append(loop_observations(w, device, w.forwards.dropout_check(), before)))
    with watch:
        try:
            loop()
        except EnoughSteps:
            pass
    if watch.eval_wait is None:           # the loop ended on its own
        watch.eval_wait = watch.wait_record("ended")
    obs = taken[0] if taken else loop_observations(watch, device, watch.forwards.dropout_check(), before)
    add_evaluation(obs, watch)
    return obs


def loop_observations(watch: Watch, device: str, dropout: dict | None, compiled_before: dict | None = None
                      ) -> Observations:
    from ..measure import peak_memory_bytes
    from ..probe import compile_counters

    dev = torch.device(device)
    obs = Observations("own loop", str(dev), collect_environment())
    start = watch.sync_window[1]           # steps after the sync window: never slowed by the counter
    clock = watch.clock
    ends = clock.step_ends[start - 1:] if len(clock.step_ends) >= start else []
    seconds = [b - a for a, b in zip(ends, ends[1:])]
    waits, samples = clock.waits()[start:], clock.step_samples[start:]
    warmup = detect_warmup(seconds, min_skip=0) if seconds else 0
    obs.steps_run, obs.warmup_steps = watch.steps, warmup
    obs.step_seconds = seconds[warmup:]
    loader_seen = clock.num_workers is not None
    obs.data_wait_s = waits[warmup:] if loader_seen else None
    kernel = clock.step_kernel[start - 1:] if len(clock.step_kernel) >= start else []
    add_page_faults(obs, list(zip(kernel, kernel[1:]))[warmup:], "the loop's own steps, its batches' arrival included")
    obs.samples = samples[warmup:] if loader_seen and any(samples) else None
    count = watch.batches.tokens if watch.batches is not None else None
    if count is not None:              # token ids: the rate in tokens, whatever a row holds (instruments/batches.py)
        obs.samples, obs.sample_unit = watch.batches.step_tokens(watch.steps)[start:][warmup:], "tokens"
    add_watch(obs, watch)
    add_evaluation(obs, watch)
    obs.dropout = dropout
    obs.recipe_flags = False
    obs.num_workers = clock.num_workers
    add_machine_load(obs, clock.load_start if obs.step_seconds else None)
    if clock.last_batch is not None:
        obs.handoff_s = worker_handoff_s(clock.last_batch)
    obs.cudnn_benchmark = bool(torch.backends.cudnn.benchmark)
    obs.memory = {"peak_bytes": peak_memory_bytes(dev), "capacity_bytes": capacity(dev)}
    counters = compiled_since(compiled_before, compile_counters())
    obs.compiled, obs.compile = bool(counters and counters.get("frames")), counters
    if obs.samples:
        obs.flops_per_sample, obs.ceiling_flops = (token_flops(watch.batches.outer, count, dev, loop_dtype(watch))
                                                   if count is not None else loop_flops(watch, dev))
        dtype = DTYPE_NAMES[loop_dtype(watch)]
        obs.ceiling_dtype = f"{dtype} (the loop's)"
        obs.half_ceiling = half_ceiling(dev, dtype) if obs.ceiling_flops else None
    obs.notes.append("own loop: the cached-batch replay needs the built-in loop; not run")
    if count is not None:
        add_loop_text(obs, watch, dev)
    return obs


def add_loop_text(obs: Observations, watch: Watch, device: torch.device) -> None:
    """A token loop's padding and attention (doctor/text.py: observe_loop_text), replayed on its model after its
    steps; the doctor's own forwards are not the loop's (the forward hooks pause), and a model that will not take
    its batch again is noted, never a crash of the loop."""
    model = watch.batches.outer
    weights = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    compute = loop_dtype(watch)
    watch.forwards.paused = True
    try:
        obs.text = observe_loop_text(model, watch.batches.tokens, device, compute if compute != weights else None)
    except Exception as exc:
        obs.notes.append(f"the padding and attention replay could not run on the loop's model: "
                         f"{type(exc).__name__}: {exc}")
    finally:
        watch.forwards.paused = False


def worker_handoff_s(batch: Any, repeats: int = 5) -> float | None:
    """What a DataLoader worker would add to the training process for each batch it hands over: unpickling the
    batch's tensors, mapping their shared-memory storage and the first touch of its pages, timed on copies of
    the loop's own batch (median of `repeats`). The worker's side (collating into shared memory, pickling) is
    left out: a lower bound. None where the batch holds no CPU tensor or the transfer cannot be made here."""
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the tensor reductions workers use)

    from ..instruments.tensors import tensors_of

    tensors = [t for t in tensors_of(batch) if t.device.type == "cpu"]
    if not tensors:
        return None
    seconds = []
    try:
        for _ in range(repeats):
            sent = io.BytesIO()
            ForkingPickler(sent, pickle.HIGHEST_PROTOCOL).dump([t.clone().share_memory_() for t in tensors])
            start = time.perf_counter()
            received = pickle.loads(sent.getvalue())
            for t in received:
                t.sum()                                 # the first touch of each shared page
            seconds.append(time.perf_counter() - start)
    except Exception:                                   # no shared memory here (a sandbox): say nothing
        return None
    return sorted(seconds)[len(seconds) // 2]
