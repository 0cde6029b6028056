"""The doctor on the built-in run (same model/data/recipe flags as `train`), driven through the same Session
objects and the same engine as training, in three short passes:
  1. watched: 1 + K steps (K = the recipe's log_every, 4 to 16) under the Watch (instruments/watch.py): syncs per step
     by source line (steps 1..K, never timed), input shapes, the gradients' state after each step; then the
     evaluation loop on two validation batches, and two eval forwards of one input (dropout in eval);
  2. timed: `steps` steps with nothing attached, timed by the Session's StepTimer (data wait per step);
     warm-up left out as the ablation does (measure.detect_warmup);
  3. replay: as many steps on one cached batch, already on the device (no loader): the measured bound on
     what a faster input pipeline could buy, and the step's own page faults and kernel time (no loader's
     batches mapped in). Passes 2 and 3 alternate step by step, so a slow spell of a shared machine slows
     both alike.
Then the model's FLOPs on that batch, the matmul peak in the run's dtype, peak memory, compile counters and,
on CUDA, a profile of a few steps (kernel time, host-to-device copies). checks/ turns those Observations
into ranked Findings; doctor.json holds both.
"""
from __future__ import annotations

import json
import sys
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from ..checks import Observations
from ..engine import train_one_epoch
from ..envcheck import collect_environment, cpu_seconds
from ..measure import detect_warmup
from ..techniques import memory_reuse
from ..instruments.watch import Watch
from .common import (DEFAULT_STEPS, add_evaluation, add_machine_load, add_page_faults, add_watch, capacity,
                     compiled_since, current_memory)
from .peaks import half_ceiling, measure_flops
from .progress import FIRST, DoctorProgress, Silent
from .text import observe_text


def watch_steps(log_every: int) -> int:
    """Steps the sync counter covers: one whole metric window of the built-in loop (its one read per window
    then counts as the 1/log_every per step it is), within 4..16 so a long window cannot make a long run."""
    return max(4, min(16, log_every))


def repeat_passes(batches: Iterable, n: int) -> Iterator:
    """n batches, starting the loader again when an epoch runs out (itertools.cycle would keep every batch)."""
    taken = 0
    while taken < n:
        before = taken
        for batch in islice(batches, n - taken):
            taken += 1
            yield batch
        if taken == before:
            return


def observe_builtin(model: nn.Module | Callable[[], nn.Module], split, loss_fn: Callable | None = None,
                    recipe=None, *, device: str | torch.device = "auto", steps: int = DEFAULT_STEPS,
                    flops: bool = True, progress: DoctorProgress | None = None) -> Observations:
    """Run the built-in loop's three passes (module docstring) on the built-in run as `train` assembles it
    (run.py) and return what they measured; `progress` shows them, steps done of planned with the time left."""
    from ..measure import peak_memory_bytes
    from ..run import assemble_run

    from ..probe import compile_counters

    counted = compile_counters()           # the process's counters: what this run compiles is their difference
    run = assemble_run(model, split, recipe, device=device, loss_fn=loss_fn)
    state, recipe, dev = run.state, run.recipe, run.device
    obs = Observations("built-in", str(dev), collect_environment())
    progress = progress or Silent()
    try:
        static = current_memory(dev)
        k = watch_steps(recipe.log_every)
        progress.plan(builtin_phases(k, steps, flops, dev.type == "cuda"))
        progress.start(f"the first {1 + k} steps, watched (syncs, shapes, gradients)")
        with Watch(state.forward, device_type=dev.type, sync_window=(1, 1 + k)) as watch:      # pass 1
            watched = run_steps(run, repeat_passes(run.train_batches, (1 + k) * recipe.grad_accum_steps))
        progress.steps(FIRST, [s.seconds for s in watched[:1]])
        progress.steps("watched", [s.seconds for s in watched[1:]])
        progress.start("the evaluation, watched")
        with Watch(state.model, device_type=dev.type, sync_window=(0, 0)) as evaluation, progress.timed("evaluation"):
            run.task.evaluate(state.model, islice(run.val_batches, 2), state.precision, run.dist)
        obs.dropout = watch.forwards.dropout_check()
        compiled_before = _compiled_frames()
        batch = _clone(next(iter(run.train_batches)))
        load_start = cpu_seconds()
        progress.start(f"{steps} timed steps, each beside a replay of one cached batch")
        timed, replayed, replay_kernel = time_and_replay(run, batch, steps, progress)          # passes 2 and 3
        add_machine_load(obs, load_start)
        recompiles = _compiled_frames() - compiled_before if compiled_before is not None else None
        obs.memory = {"peak_bytes": peak_memory_bytes(dev), "static_bytes": static, "capacity_bytes": capacity(dev)}
        progress.start("one more step, its memory by what holds it")
        with progress.timed("memory"):
            obs.memory["breakdown"] = step_memory(run, batch)
        obs.text = observe_text(run, batch, lambda batches: run_steps(run, batches))
        if dev.type == "cuda":
            progress.start("a profile of the replayed step (kernels, copies)")
        with progress.timed("profile"):
            obs.cuda_profile = (profile_cuda(lambda n: run_steps(run, [batch] * (n * recipe.grad_accum_steps)))
                                if dev.type == "cuda" else None)
        loss_fn = run.task.loss_fn
        flops = flops and loss_fn is not None
        if flops:
            progress.start("the model's FLOPs and the matmul peak")
        with progress.timed("flops"):
            obs.flops_per_sample, obs.ceiling_flops = (measure_flops(state.model, loss_fn, batch, recipe, dev)
                                                       if flops else (None, None))
    finally:
        run.close()
    warmup = detect_warmup([s.seconds for s in timed], min_skip=1)
    steady = timed[warmup:]
    obs.steps_run, obs.warmup_steps = state.step, warmup
    obs.step_seconds = [s.seconds for s in steady]
    obs.data_wait_s = [s.data_wait_s for s in steady]
    obs.samples = [s.samples for s in steady]
    obs.replay_step_seconds = [s.seconds for s in replayed[warmup:]]  # the same steps left out: they warmed up together
    add_page_faults(obs, replay_kernel[warmup:], "the cached-batch replay: the step's own, no loader")
    add_watch(obs, watch)
    add_evaluation(obs, evaluation)
    obs.num_workers = recipe.num_workers
    obs.cudnn_benchmark = bool(torch.backends.cudnn.benchmark)
    obs.ceiling_dtype = recipe.precision
    obs.half_ceiling = half_ceiling(dev, recipe.precision) if obs.ceiling_flops else None
    obs.compile = compiled_since(counted, compile_counters())
    obs.compiled, obs.recompiles = recipe.compile, recompiles
    obs.notes.append(f"recipe: {json.dumps(recipe.to_dict())}")
    return obs


def step_memory(run, batch) -> dict | None:
    """One more step of the run, profiled by what holds the memory (measure/memory.py), after the timed passes:
    its compilation and its optimizer state are behind it."""
    from ..measure.memory import StepMemory

    state = run.state
    state.memory = StepMemory(run.device, state.optimizer.optimizer, step=0)
    try:
        run_steps(run, [_clone(batch) for _ in range(run.recipe.grad_accum_steps)])
        return state.memory.result()
    finally:
        state.memory = None


def run_steps(run, micro_batches: Iterable) -> list:
    """Optimizer steps of the shared engine on these micro-batches: their StepTimer entries."""
    state = run.state
    state.timer.read()
    first = len(state.timer.steps)
    train_one_epoch(state, micro_batches, run.task, run.meter())
    state.timer.read()
    return state.timer.steps[first:]


def builtin_phases(k: int, steps: int, flops: bool, cuda: bool) -> list[tuple[str, int]]:
    """observe_builtin's steps to come, as (kind, how many) in order (doctor/progress.py prices each kind)."""
    return [(FIRST, 1), ("watched", k), ("evaluation", 1), ("timed", steps), ("replay", steps),
            ("memory", 1), ("profile", 1 if cuda else 0), ("flops", 1 if flops else 0)]


def time_and_replay(run, batch, steps: int, progress: DoctorProgress | None = None) -> tuple[list, list]:
    """Passes 2 and 3, interleaved step by step (a loader step, then a replayed one): on a shared machine a
    slow spell lasts seconds and moves the step time by up to 1.7x, so a replay run after the timed steps
    would compare two spells, not two pipelines. One loader iterator across the steps (its workers start
    once); the replayed batch was cloned first, so the loader's next batches are untouched."""
    accum = run.recipe.grad_accum_steps
    loader_steps = repeat_passes(run.train_batches, steps * accum)
    timed, replayed, kernel = [], [], []
    progress = progress or Silent()
    for _ in range(steps):
        timed += (done := run_steps(run, islice(loader_steps, accum)))        # pass 2
        progress.steps("timed", [s.seconds for s in done])   # between steps: no step's clock runs (StepTimer.start)
        before = memory_reuse.kernel_counters()
        replayed += (done := run_steps(run, [batch] * accum))                 # pass 3
        kernel.append((before, memory_reuse.kernel_counters()))
        progress.steps("replay", [s.seconds for s in done])
    return timed, replayed, kernel


def _clone(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, (list, tuple)):
        return type(batch)(_clone(b) for b in batch)
    return batch


def _compiled_frames() -> int | None:
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    return counters.get("frames", {}).get("ok", 0)


def profile_cuda(run: Callable[[int], None], steps: int = 5) -> dict[str, Any]:
    """Kernel time and host-to-device copies per step, from torch.profiler over `steps` replayed steps (one
    cached batch on the device: the copies are the step's own, not the loader's)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        run(1)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run(steps)
            torch.cuda.synchronize()
        kernel_us, copies = 0.0, 0
        for event in prof.events():
            if str(getattr(event, "device_type", "")).endswith("CUDA"):
                name = event.name.lower()
                if "memcpy" in name and "htod" in name:
                    copies += 1
                elif "memcpy" not in name and "memset" not in name:
                    kernel_us += event.device_time_total
        # The replayed batch is already on the device: every copy counted here is made inside the step.
        return {"kernel_s_per_step": kernel_us / 1e6 / steps, "h2d_per_step": copies / steps, "batch_tensors": 0}
    except Exception as exc:             # the profiler is optional evidence; say why it is missing
        return {"error": f"{type(exc).__name__}: {exc}"}
