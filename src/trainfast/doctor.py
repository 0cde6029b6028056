"""`trainfast doctor`: what holds this run back, and the mistakes in it, from a short, bounded run.

The built-in run (same model/data/recipe flags as `train`) is driven through the same Session objects and
the same engine as training, in three short passes:
  1. watched: 1 + K steps (K = the recipe's log_every, 4 to 16) under the Watch (watch.py): syncs per step
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

A user's own loop is watched the same way, minus what only the built-in loop allows (the replay): in this
process with `observe_loop(fn)`, or in a script with `trainfast doctor -- python train.py`, where trainfast's
sitecustomize starts the Watch (TRAINFAST_DOCTOR in the environment) and the script is stopped after its
steps. Most loops evaluate at the end of an epoch, after those steps: a loop that has not evaluated by then
is kept running, untimed, until its first evaluation forwards or `eval_within` seconds (whichever comes
first), so the evaluation checks see a real evaluation; the findings say which it was.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from .checks import Finding, Observations, run_checks, untimed
from .engine import train_one_epoch
from .envcheck import collect_environment, cpu_seconds, other_cores_since, usable_cpus
from .measure import detect_warmup, measure_ceiling
from .report import doctor_section, replace_doctor_section, saves_text
from .techniques import memory_reuse
from .techniques.precision import DTYPES, auto_amp_dtype, slow_half_reason
from .watch import EnoughSteps, Watch

DEFAULT_STEPS = 10          # timed steps: a median over the steps after warm-up (the watched pass warms up)
DEFAULT_EVAL_WITHIN = 120.0  # seconds an own loop is kept going for its first evaluation: a small epoch
EVAL_GRACE_S = 30.0         # a script still running this long past its evaluation wait is stopped from outside
DOCTOR_ENV = "TRAINFAST_DOCTOR"


class ScriptFailed(RuntimeError):
    """`doctor -- COMMAND`: the command ran past its time or ended before a step was watched (log tail said)."""


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


# --- the built-in run -------------------------------------------------------------------------------

def observe_builtin(model: nn.Module | Callable[[], nn.Module], split, loss_fn: Callable | None = None,
                    recipe=None, *, device: str | torch.device = "auto", steps: int = DEFAULT_STEPS,
                    flops: bool = True) -> Observations:
    """Run the built-in loop's three passes (module docstring) on the built-in run as `train` assembles it
    (run.py) and return what they measured."""
    from .measure import peak_memory_bytes
    from .run import assemble_run

    run = assemble_run(model, split, recipe, device=device, loss_fn=loss_fn)
    state, recipe, dev = run.state, run.recipe, run.device
    obs = Observations("built-in", str(dev), collect_environment())
    try:
        static = current_memory(dev)
        k = watch_steps(recipe.log_every)
        with Watch(state.forward, device_type=dev.type, sync_window=(1, 1 + k)) as watch:      # pass 1
            run_steps(run, repeat_passes(run.train_batches, (1 + k) * recipe.grad_accum_steps))
        with Watch(state.model, device_type=dev.type, sync_window=(0, 0)) as evaluation:
            run.task.evaluate(state.model, islice(run.val_batches, 2), state.precision, run.dist)
        obs.dropout = watch.dropout_check()
        compiled_before = _compiled_frames()
        batch = _clone(next(iter(run.train_batches)))
        load_start = cpu_seconds()
        timed, replayed, replay_kernel = time_and_replay(run, batch, steps)                    # passes 2 and 3
        add_machine_load(obs, load_start)
        recompiles = _compiled_frames() - compiled_before if compiled_before is not None else None
        obs.memory = {"peak_bytes": peak_memory_bytes(dev), "static_bytes": static, "capacity_bytes": capacity(dev)}
        obs.cuda_profile = (profile_cuda(lambda n: run_steps(run, [batch] * (n * recipe.grad_accum_steps)))
                            if dev.type == "cuda" else None)
        loss_fn = getattr(run.task, "loss_fn", None)
        obs.flops_per_sample, obs.ceiling_flops = (measure_flops(state.model, loss_fn, batch, recipe, dev)
                                                   if flops and loss_fn is not None else (None, None))
    finally:
        run.close()
    from .probe import compile_counters

    warmup = detect_warmup([s.seconds for s in timed], min_skip=1)
    steady = timed[warmup:]
    obs.steps_run, obs.warmup_steps = state.step, warmup
    obs.step_seconds = [s.seconds for s in steady]
    obs.data_wait_s = [s.data_wait_s for s in steady]
    obs.samples = [s.samples for s in steady]
    obs.replay_step_seconds = [s.seconds for s in replayed[warmup:]]   # the same steps left out: they warmed up together
    add_page_faults(obs, replay_kernel[warmup:], "the cached-batch replay: the step's own, no loader")
    _from_watch(obs, watch)
    add_evaluation(obs, evaluation)
    obs.num_workers = recipe.num_workers
    obs.cudnn_benchmark = bool(torch.backends.cudnn.benchmark)
    obs.ceiling_dtype = recipe.precision
    obs.half_ceiling = half_ceiling(dev, recipe.precision) if obs.ceiling_flops else None
    obs.compiled, obs.compile, obs.recompiles = recipe.compile, compile_counters(), recompiles
    obs.notes.append(f"recipe: {json.dumps(recipe.to_dict())}")
    return obs


def run_steps(run, micro_batches: Iterable) -> list:
    """Optimizer steps of the shared engine on these micro-batches: their StepTimer entries."""
    state = run.state
    state.timer.read()
    first = len(state.timer.steps)
    train_one_epoch(state, micro_batches, run.task, run.meter())
    state.timer.read()
    return state.timer.steps[first:]


def time_and_replay(run, batch, steps: int) -> tuple[list, list]:
    """Passes 2 and 3, interleaved step by step (a loader step, then a replayed one): on a shared machine a
    slow spell lasts seconds and moves the step time by up to 1.7x, so a replay run after the timed steps
    would compare two spells, not two pipelines. One loader iterator across the steps (its workers start
    once); the replayed batch was cloned first, so the loader's next batches are untouched."""
    accum = run.recipe.grad_accum_steps
    loader_steps = repeat_passes(run.train_batches, steps * accum)
    timed, replayed, kernel = [], [], []
    for _ in range(steps):
        timed += run_steps(run, islice(loader_steps, accum))                  # pass 2
        before = memory_reuse.kernel_counters()
        replayed += run_steps(run, [batch] * accum)                           # pass 3
        kernel.append((before, memory_reuse.kernel_counters()))
    return timed, replayed, kernel


def add_page_faults(obs: Observations, counters: list, source: str) -> None:
    """Page faults, kernel and CPU seconds per step from (before, after) kernel_counters() pairs, and whether
    reuse_memory acts in this process."""
    steps = [memory_reuse.counted_between(before, after) for before, after in counters]
    if steps and None not in steps:
        obs.step_faults, obs.step_kernel_s, obs.step_cpu_s = ([s[i] for s in steps] for i in range(3))
        obs.fault_source = source
    obs.reuse_memory = {"in_effect": memory_reuse.in_effect(), "unavailable": memory_reuse.unavailable()}


def add_machine_load(obs: Observations, load_start: tuple | None) -> None:
    """The cores other processes took since `load_start` (envcheck.cpu_seconds() where the timed steps began;
    None: no step was timed), beside the CPUs and torch threads the loop had."""
    obs.other_cores = other_cores_since(load_start)
    obs.cpus, obs.threads = usable_cpus(), torch.get_num_threads()


def _from_watch(obs: Observations, watch: Watch) -> None:
    obs.notes += [f"a watch hook failed and was skipped: {e}" for e in watch.errors]
    obs.sync_steps = watch.sync_steps
    obs.syncs = watch.counter.by_line()
    obs.shapes = watch.shapes
    obs.grads = watch.grads
    obs.zero_grad_calls = watch.zero_grad_lines()
    obs.zero_grad_s = watch.zero_grad_s
    obs.data_parallel = watch.data_parallel


def add_evaluation(obs: Observations, watch: Watch) -> None:
    """What the watch saw of the loop's evaluation, and how its wait for one ended (Watch.wait_record)."""
    obs.eval_forwards, obs.eval_graph = watch.eval_forwards, dict(watch.eval_graph)
    obs.train_mode_eval = watch.train_mode_check()
    obs.eval_wait = watch.eval_wait


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


def current_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.Process().memory_info().rss)


def capacity(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def measure_flops(model: nn.Module, loss_fn: Callable, batch, recipe, device: torch.device):
    """(training FLOPs per sample on this batch, the matmul peak in the run's dtype), or Nones when the
    counter cannot trace the model. The same two instruments the ablation's `% of matmul peak` uses."""
    from .measure import count_train_flops

    inputs, targets = batch[0], batch[1]
    try:
        per_sample = count_train_flops(model, loss_fn, inputs, targets) / max(1, inputs.shape[0])
    except Exception:
        return None, None
    # A half type without fast kernels here (fp16 on most CPUs) stops the ceiling's size early: still short.
    return per_sample, measure_ceiling(device, DTYPES[recipe.precision], repeats=3)


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


# --- a user's own loop, in this process ---------------------------------------------------------------

def observe_loop(loop: Callable[[], Any], *, steps: int = DEFAULT_STEPS, sync_steps: int = 10,
                 device: str = "cpu", eval_within: float = DEFAULT_EVAL_WITHIN) -> Observations:
    """Run `loop()` (a user's training loop) under the Watch for 1 + sync_steps + steps optimizer steps, then,
    if it has not evaluated yet, up to `eval_within` more seconds (untimed) until it does; then it is stopped
    (a loop that ends sooner is read as it ends) and what was observed is returned."""
    taken: list[Observations] = []
    watch = Watch(None, device_type=torch.device(device).type, sync_window=(1, 1 + sync_steps),
                  stop_after=1 + sync_steps + steps, eval_within=eval_within,
                  on_stop=lambda w: taken.append(loop_observations(w, device, w.dropout_check())))
    with watch:
        try:
            loop()
        except EnoughSteps:
            pass
    if watch.eval_wait is None:           # the loop ended on its own
        watch.eval_wait = watch.wait_record("ended")
    obs = taken[0] if taken else loop_observations(watch, device, watch.dropout_check())
    add_evaluation(obs, watch)
    return obs


def loop_observations(watch: Watch, device: str, dropout: dict | None) -> Observations:
    from .measure import peak_memory_bytes
    from .probe import compile_counters

    dev = torch.device(device)
    obs = Observations("own loop", str(dev), collect_environment())
    start = watch.sync_window[1]           # steps after the sync window: never slowed by the counter
    ends = watch.step_ends[start - 1:] if len(watch.step_ends) >= start else []
    seconds = [b - a for a, b in zip(ends, ends[1:])]
    waits, samples = watch.waits()[start:], watch.step_samples[start:]
    warmup = detect_warmup(seconds, min_skip=0) if seconds else 0
    obs.steps_run, obs.warmup_steps = watch.steps, warmup
    obs.step_seconds = seconds[warmup:]
    loader_seen = watch.num_workers is not None
    obs.data_wait_s = waits[warmup:] if loader_seen else None
    kernel = watch.step_kernel[start - 1:] if len(watch.step_kernel) >= start else []
    add_page_faults(obs, list(zip(kernel, kernel[1:]))[warmup:], "the loop's own steps, its batches' arrival included")
    obs.samples = samples[warmup:] if loader_seen and any(samples) else None
    _from_watch(obs, watch)
    add_evaluation(obs, watch)
    obs.dropout = dropout
    obs.recipe_flags = False
    obs.num_workers = watch.num_workers
    add_machine_load(obs, watch.load_start if obs.step_seconds else None)
    if watch.last_batch is not None:
        obs.handoff_s = worker_handoff_s(watch.last_batch)
    obs.cudnn_benchmark = bool(torch.backends.cudnn.benchmark)
    obs.memory = {"peak_bytes": peak_memory_bytes(dev), "capacity_bytes": capacity(dev)}
    counters = compile_counters()
    obs.compiled, obs.compile = bool(counters and counters.get("frames")), counters
    if obs.samples:
        obs.flops_per_sample, obs.ceiling_flops = loop_flops(watch, dev)
        dtype = DTYPE_NAMES[loop_dtype(watch)]
        obs.ceiling_dtype = f"{dtype} (the loop's)"
        obs.half_ceiling = half_ceiling(dev, dtype) if obs.ceiling_flops else None
    obs.notes.append("own loop: the cached-batch replay needs the built-in loop; not run")
    return obs


def worker_handoff_s(batch: Any, repeats: int = 5) -> float | None:
    """What a DataLoader worker would add to the training process for each batch it hands over: unpickling the
    batch's tensors, mapping their shared-memory storage and the first touch of its pages, timed on copies of
    the loop's own batch (median of `repeats`). The worker's side (collating into shared memory, pickling) is
    left out: a lower bound. None where the batch holds no CPU tensor or the transfer cannot be made here."""
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the tensor reductions workers use)

    from .watch import _tensors

    tensors = [t for t in _tensors(batch) if t.device.type == "cpu"]
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


DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}      # torch.bfloat16 -> "bf16"


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
    """The dtype of the loop's training forwards (autocast's or the weights'; Watch.compute_dtype), fp32 for
    any other (the peak measured for a matmul in it)."""
    return watch.compute_dtype if watch.compute_dtype in DTYPE_NAMES else torch.float32


def loop_flops(watch: Watch, device: torch.device) -> tuple[float | None, float | None]:
    """An own loop's training FLOPs per sample, counted on a copy of its model with its last training input:
    the forward, then the backward of the sum of the outputs (a loss adds next to nothing beside the model);
    and the matmul peak in the loop's dtype. Nones when the model cannot be copied or counted (a DDP wrapper, say)."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    from .measure import batch_samples
    from .watch import _tensors

    model = watch.root() if watch.root is not None else None
    if model is None or not watch.last_input:
        return None, None
    watch.paused = True                   # the copy's forward is not the loop's
    try:
        shadow = copy.deepcopy(model).train()
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.enable_grad(), FlopCounterMode(display=False) as counter:
            outputs = [t for t in _tensors(shadow(*watch.last_input)) if t.requires_grad]
            sum(t.float().sum() for t in outputs).backward()
        per_sample = counter.get_total_flops() / max(1, batch_samples(watch.last_input[0]))
        return per_sample, measure_ceiling(device, loop_dtype(watch), repeats=3)
    except Exception:
        return None, None
    finally:
        watch.paused = False


# --- a user's script: `trainfast doctor -- python train.py` ------------------------------------------

def install_in_script() -> None:
    """Called by trainfast's sitecustomize when TRAINFAST_DOCTOR is set: watch this process's loop; after its
    steps write the observations (so a script stopped from outside while it is kept going for its evaluation
    still has them), then, once the evaluation came or the wait ended, write them again with it and end the
    script (exit status 0); or write them at exit if it ends sooner."""
    import atexit

    from .probe import StopRun

    spec = json.loads(os.environ[DOCTOR_ENV])
    device = spec.get("device", "cpu")
    taken: list[Observations] = []
    done: list[bool] = []
    rank0 = os.environ.get("RANK", "0") == "0"          # under torchrun, rank 0 alone writes

    def write(obs: Observations) -> None:
        from .checkpoint import atomic_write_text

        atomic_write_text(spec["result"], json.dumps(asdict(obs), default=str))

    def snapshot(w: Watch) -> None:
        if rank0:
            taken.append(loop_observations(w, device, w.dropout_check()))
            taken[0].eval_wait = {"outcome": "waiting", "limit_s": w.eval_within, "steps": 0, "waited_s": 0.0}
            write(taken[0])

    def finish(w: Watch) -> None:
        if done or not rank0:
            return
        done.append(True)
        obs = taken[0] if taken else loop_observations(w, device, w.dropout_check())
        add_evaluation(obs, w)
        write(obs)

    def at_exit() -> None:
        if watch.steps and not done:
            if watch.eval_wait is None:
                watch.eval_wait = watch.wait_record("ended")
            finish(watch)

    watch = Watch(None, device_type=torch.device(device).type, sync_window=(1, 1 + spec["sync_steps"]),
                  stop_after=1 + spec["sync_steps"] + spec["steps"], on_stop=snapshot, on_finish=finish,
                  stop_with=StopRun, eval_within=float(spec.get("eval_within", 0.0)))
    watch.__enter__()
    atexit.register(at_exit)


def observe_script(command: list[str], out_dir: Path, *, steps: int = DEFAULT_STEPS, sync_steps: int = 10,
                   device: str = "cpu", timeout_s: float = 600.0, eval_within: float = DEFAULT_EVAL_WITHIN,
                   recipe_fields: dict[str, Any] | None = None) -> Observations:
    """Run the user's command (an argument list, never a shell string) under the doctor, its output in
    out_dir/log.txt, and read the observations its process wrote. `recipe_fields` (the recipe flags given to
    the doctor) reach a script's trainfast.Session through TRAINFAST_RECIPE, as under `ablate -- COMMAND`.
    The script keeps its own evaluation wait (`eval_within`) at its steps and forwards; one that stops making
    either while waiting is stopped from here, EVAL_GRACE_S later, and read from what it wrote first."""
    from .recipe import RECIPE_ENV
    from .launch import SITE_DIR, Command, check_command

    check_command(Command(tuple(command)))          # refused before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    result = out_dir / "observations.json"
    result.unlink(missing_ok=True)
    path = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, DOCTOR_ENV: json.dumps({"result": str(result), "steps": steps, "sync_steps": sync_steps,
                                                 "device": device, "eval_within": eval_within}),
           "PYTHONPATH": str(SITE_DIR) + (os.pathsep + path if path else "")}
    if recipe_fields:
        env[RECIPE_ENV] = json.dumps(recipe_fields)
    with open(out_dir / "log.txt", "wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        code, stopped = await_script(proc, result, timeout_s, eval_within + EVAL_GRACE_S)
    if not result.is_file():
        if stopped:
            raise ScriptFailed(f"the command ran past {timeout_s:.0f} s; see {out_dir / 'log.txt'}")
        tail = (out_dir / "log.txt").read_text(errors="replace")[-2000:]
        raise ScriptFailed(f"the command exited with status {code} before a single optimizer step was watched; "
                           f"its log ({out_dir / 'log.txt'}) ends:\n{tail}")
    obs = Observations(**json.loads(result.read_text()))
    obs.command = list(command)
    if (obs.eval_wait or {}).get("outcome") == "waiting":      # stopped from here while kept going
        obs.eval_wait = {**obs.eval_wait, "outcome": "limit", "waited_s": eval_within}
        obs.notes.append("the script made no step or forward to end its evaluation wait; it was stopped from "
                         "outside")
    return obs


def await_script(proc: subprocess.Popen, result: Path, timeout_s: float, wait_s: float) -> tuple[int, bool]:
    """Waits for the script: (its exit status, whether it had to be stopped). Stopped at `timeout_s`, or
    `wait_s` after it first wrote its observations (it is then only kept going for its evaluation), or when
    this process is interrupted (then the interruption goes on)."""
    deadline = time.monotonic() + timeout_s
    written_at: float | None = None
    try:
        while True:
            try:
                return proc.wait(timeout=0.5), False
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if written_at is None and result.is_file():
                written_at = now
            if now >= deadline or (written_at is not None and now >= written_at + wait_s):
                stop_script(proc)
                return proc.returncode, True
    except BaseException:
        stop_script(proc)
        raise


def stop_script(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; its DataLoader workers notice their parent's exit themselves."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- output ---------------------------------------------------------------------------------------------

def write_doctor(out_dir: Path, obs: Observations, findings: list[Finding]) -> Path:
    from .checkpoint import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "doctor.json"
    step = obs.step_s
    atomic_write_text(path, json.dumps({
        "source": obs.source, "device": obs.device,
        "step_s": step, "steps_run": obs.steps_run, "timed_steps": len(obs.step_seconds),
        "findings": [f.to_dict() for f in findings],
        "observations": asdict(obs)}, indent=1, default=str))
    return path


def print_findings(findings: list[Finding], obs: Observations, console=None) -> None:
    """The ranked list as a table (what, verdict, what fixing it saves), then each finding's evidence and fix."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    style = {"problem": "bold red", "fine": "green", "measured": "cyan", "not checked here": "dim"}
    step = f" of {obs.step_s * 1e3:.1f} ms (median)" if obs.step_seconds else ""
    table = Table(title=f"trainfast doctor: {obs.source} run on {obs.device}, {len(obs.step_seconds)} timed "
                        f"steps{step}")
    for col in ("#", "status", "check", "saves per step"):
        table.add_column(col)
    for i, f in enumerate(findings, 1):
        table.add_row(str(i), f"[{style.get(f.status, '')}]{f.status}[/]", f.name, saves_text(f.cost_s, f.share, f.status))
    console.print(table)
    if obs.steps_run and not obs.step_seconds:
        console.print(f"[bold]note:[/bold] {untimed(obs)}", highlight=False)
    for i, f in enumerate(findings, 1):
        console.print(f"[bold]{i}. {f.name}[/bold] [{style.get(f.status, '')}]{f.status}[/]: {f.evidence}",
                      highlight=False)
        if f.fix and f.status == "problem":
            console.print(f"   [bold]fix:[/bold] {f.fix}", highlight=False)
    problems = [f for f in findings if f.status == "problem"]
    console.print(f"{len(problems)} problem(s)" + (": fix them in the order above (the costliest measured first)"
                                                    if problems else "; nothing to fix in what was checked"))


def doctor(obs: Observations, out_dir: str | Path, show: bool = True) -> list[Finding]:
    """The ranked findings of these observations: printed (show), written to out_dir/doctor.json, and into
    an ablation's report.md there if one exists."""
    out_dir = Path(out_dir)
    findings = run_checks(obs)
    write_doctor(out_dir, obs, findings)
    replace_doctor_section(out_dir / "report.md", doctor_section(out_dir))
    if show:
        print_findings(findings, obs)
    return findings
