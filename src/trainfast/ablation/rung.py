"""Inside a rung's process: the built-in run (run.py) trained, evaluated and timed, measured by the same
probe as a user's script under `ablate -- COMMAND` (probe/), so both kinds of rung report the same record.

Every rung runs in its own process (server.py), so peak memory, compile caches in memory and allocator state
never leak from one rung into the next; every rung uses the same seed, so the same initial weights and the
same data order.
"""
from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from itertools import islice, repeat
from pathlib import Path
from typing import Any, Callable

import torch

from ..checkpoint import NoCheckpoints, build_checkpointer
from ..curves import BuiltinCurve, CurvePlan
from ..defaults import TIMING_FLOOR, TIMING_SECONDS, TIMING_STEPS
from ..engine import train_one_epoch
from ..measure import BLOCK_SECONDS, EpochStats, Timing
from ..probe import MeasureSpec, Probe, agree_max, collect_ranks, run_record
from ..recipe import Recipe
from ..run import BuiltinRun, assemble_run
from ..techniques import not_in_effect, process_wide_in_effect
from ..techniques.compile import fresh_compile_cache
from .paired import time_paired, unpaired_reason


@dataclass(frozen=True)
class TimingBudget:
    """How long a rung is timed, in steps after warm-up, whatever the epoch length: at least `steps`
    steady steps, or at least `floor` of them once they take `seconds` (slow models: fewer, longer steps).
    Short epochs are continued past the accuracy run (the data cycled) until the budget is met."""
    steps: int = TIMING_STEPS            # the numbers live in defaults.py: the CLI shows them before torch loads
    seconds: float = TIMING_SECONDS
    floor: int = TIMING_FLOOR
    min_seconds: float = 2.0    # millisecond steps are timed over at least this long: enough blocks for a spread


@dataclass
class Job:
    """What a rung process needs to rebuild the run: names (CLI) or picklable objects (Python API)."""
    model: str | Callable[[], torch.nn.Module]
    data: Any                           # the loaded split (a spawned process gets its tensors by shared memory)
    loss_fn: Callable | None = None
    device: str = "auto"
    nproc: int = 1                      # >1: the rung runs as that many torch.distributed workers (DDP)
    task: str = "classification"        # tasks/: what a batch, a loss and the judged metric mean
    # The ladder's baseline recipe: every timed run is also timed against it in alternating blocks inside its own
    # process (paired.py). None: runs are compared across processes only.
    reference: Recipe | None = None
    # --target: evaluations on a schedule (the curve) and the stop at the target or the cap (curves.py); None:
    # the planned epochs, one evaluation at the end.
    curve: CurvePlan | None = None
    # Several nodes (nodes.RunNodes): this node's share of the run, met at the run's own endpoint; None: one node.
    nodes: Any = None


def run_rung(job: Job, recipe: Recipe, emit: Callable[[dict], None],
             budget: TimingBudget | None = None) -> dict[str, Any]:
    """Train `recipe.epochs` epochs with the shared engine, evaluate, time the steady state, and return every
    measured number. `budget=None`: accuracy only (the baseline's extra noise seeds)."""
    # A time to target counts compilation: every run pays what a fresh machine pays (compile.fresh_compile_cache)
    with fresh_compile_cache() if job.curve is not None else nullcontext():
        run = assemble_run(job.model, job.data, recipe, device=job.device, task=job.task, loss_fn=job.loss_fn,
                           env=False)
        try:
            with ExitStack() as stack:
                record = measure_rung(run, emit, budget, rung_checkpoints(run, stack), job.curve)
            # after the record: the pair's memory is not the rung's
            if budget is not None and job.reference is not None:
                record["paired"] = pair_with_reference(job, run, job.reference.replace(seed=recipe.seed), budget)
            return record
        finally:
            run.close()


def rung_checkpoints(run: BuiltinRun, stack: ExitStack):
    """With save_every (--save-every N) a rung saves as `trainfast train` does, every N steps, into a folder
    deleted afterwards: the saves then fall inside the timed steps, so the ablation measures what they cost
    the loop (and what async_checkpoint gives back). Without it, nothing is saved: a rung times steps only."""
    if not run.recipe.save_every:
        return NoCheckpoints()
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trainfast-rung-ckpt-")))
    checkpoints = build_checkpointer(folder, run.recipe, run.train_batches, run.dist.rank, run.dist.gather_objects)
    checkpoints.start(run.state, None)
    stack.callback(checkpoints.finish)        # the last background save completes before its folder goes
    return checkpoints


def measure_rung(run: BuiltinRun, emit: Callable[[dict], None], budget: TimingBudget | None,
                 checkpoints, plan: CurvePlan | None = None) -> dict[str, Any]:
    """The accuracy run (every epoch, then the evaluation), then more steps until the timing budget is met;
    the probe's record of it, with the evaluation's numbers. `checkpoints`: rung_checkpoints' saver. `plan`
    (--target): the accuracy run evaluates on a schedule and ends at the target or its cap (curves.py)."""
    recipe, state, task = run.recipe, run.state, run.task
    missing = not_in_effect(recipe)        # never time the default under a process switch's name
    if missing:
        raise RuntimeError("; ".join(missing))
    timed, budget = budget is not None, budget or TimingBudget()
    probe = Probe(MeasureSpec("", "full", **dataclasses.asdict(budget)))
    probe.attach(run.session)
    probe.watch(state, recipe.num_workers)
    progress = Progress(emit, len(run.train_batches) * recipe.epochs)

    trained, epoch_times, files = EpochStats(), [], task.build_file_counts()     # files: an image folder's counts
    curve = BuiltinCurve(run, plan) if plan is not None else None
    epoch = 0
    while curve.more() if curve is not None else epoch < recipe.epochs:
        batches = curve.batches(run.train_batches) if curve is not None else run.train_batches
        stats = train_pass(run, epoch, batches, progress, checkpoints, curve)
        trained.absorb(stats)
        epoch_times.append(stats.seconds)
        files.after_pass(run.train_batches, run.device)
        epoch += 1
    metrics = (curve.finish(state) if curve is not None
               else task.evaluate(state.model, run.val_batches, state.precision, run.dist))
    train_metrics = task.train_metrics(trained, run.dist)
    updates = state.step            # the accuracy run's optimizer steps (the timing steps below add more)
    extra_passes = time_the_rest(run, probe, budget, progress, checkpoints) if timed else 0
    alone = time_step_alone(run, probe, budget) if timed else None
    probe.unit = task.rate_unit               # what the task's clock counts (tokens, images, samples)
    figures = RungFigures(task.metric.value(task.judged(metrics)), epoch_times, task.rung_metrics(metrics),
                          train_metrics, trained.losses, updates, checkpoints.saves, checkpoints.loop_seconds,
                          process_wide_in_effect(), alone)
    stopped = "accuracy run ended" + (", then the timing budget" if extra_passes else "")
    collect_ranks(probe)                      # several ranks: every rank is here, the timed steps are over
    return run_record(probe, stopped, curve=curve, task=figures,
                      data=files.finish(run.train_batches, run.val_batches, run.device))


@dataclass
class RungFigures:
    """The built-in run's section of its record (probe/record.py): its task's figures, written here alone."""
    # The metric every rung is judged on, by name and goal (accuracy, mAP, a language model's validation loss):
    # the record says it whatever task wrote it.
    metric: dict[str, Any]
    epoch_times_s: list[float]
    evaluation: dict[str, Any]       # the task's rung_metrics: "loss", "val_samples", its own
    train: dict[str, Any]            # the task's train_metrics
    train_losses: list[float]        # rank 0's
    steps: int                       # the accuracy run's optimizer steps (the timing steps add more)
    checkpoint_saves: int            # --save-every: saves inside the steps, and
    checkpoint_loop_s: float         # the seconds the loop spent in them
    in_effect: dict[str, bool]       # each process switch, read back in this process, by its name
    step_alone: dict[str, Any] | None   # the same step on a batch kept on the device

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "epoch_time_s": sum(self.epoch_times_s) / len(self.epoch_times_s),
                "epoch_times_s": self.epoch_times_s, **self.evaluation, **self.train,
                "train_losses": self.train_losses, "steps": self.steps, "checkpoint_saves": self.checkpoint_saves,
                "checkpoint_loop_s": self.checkpoint_loop_s, **self.in_effect, "step_alone": self.step_alone}


def pair_with_reference(job: Job, run: BuiltinRun, reference: Recipe, budget: TimingBudget) -> dict[str, Any]:
    """The rung's step against the reference's (the baseline's) in alternating blocks in this process, or why
    not (paired.py): the ratio that process-level state cannot move. Its blocks are the timing's blocks, shorter
    where the budget asks for less than the default's time (a quick test's ladder)."""
    why = unpaired_reason(run.recipe, reference, job.nproc)
    if why is not None:
        return {"unpaired": why}
    ref = assemble_run(job.model, job.data, reference, device=job.device, task=job.task, loss_fn=job.loss_fn,
                       env=False)
    try:
        share = min(1.0, budget.min_seconds / TimingBudget.min_seconds)
        return time_paired(run, ref, check=run.device.type == "cpu", block_seconds=BLOCK_SECONDS * share)
    finally:
        ref.close()


@dataclass
class Progress:
    """The rung's progress events for the parent's display: step and loss at every metric window."""
    emit: Callable[[dict], None]
    total: int

    def on_window(self, step: int, stats) -> None:
        self.emit({"event": "progress", "step": step, "total": self.total, "loss": stats.losses[-1]})


def train_pass(run: BuiltinRun, epoch: int, batches, progress: Progress, checkpoints,
               curve: BuiltinCurve | None = None):
    run.dist.set_epoch(epoch)
    meter = run.meter(progress.on_window)
    checkpoints.begin_epoch(run.state, meter)
    after_step = curve.hooked(checkpoints.after_step) if curve is not None else checkpoints.after_step
    with run.dist.watch():
        return train_one_epoch(run.state, batches, run.task, meter, after_step=after_step)


def time_the_rest(run: BuiltinRun, probe: Probe, budget: TimingBudget, progress: Progress, checkpoints) -> int:
    """Timing: the steps after warm-up, continued past the accuracy run (after its evaluation, so the metric
    is untouched) until the budget is met; returns the passes added. Every rank runs the same number of extra
    steps (the most any rank needs: probe.steps_needed is a collective), so their collectives stay matched.
    On CPU in one process, blocks of steps during which other processes used the machine are left out and
    more steps are run instead (up to 3x the budget): see measure.Timing."""
    timer, extra_passes, limit = run.state.timer, 0, None
    while True:
        need = probe.steps_needed()
        limit = limit or timer.updates + 3 * max(budget.steps, need)
        need = min(need, limit - timer.updates)
        if need <= 0:
            return extra_passes
        progress.total = timer.updates + need
        train_pass(run, run.recipe.epochs + extra_passes, islice(run.train_batches, need), progress, checkpoints)
        extra_passes += 1


STEP_ALONE_SECONDS = 0.3   # the step alone is timed over about this long (at least STEP_ALONE_STEPS steps)
STEP_ALONE_STEPS = 6
STEP_ALONE_WARMUP = 2       # replayed steps before the timed ones (the first touch of the replayed batch)


def time_step_alone(run: BuiltinRun, probe: Probe, budget: TimingBudget) -> dict[str, Any]:
    """The rung's step alone: the same step (train_one_epoch, the rung's switches, its meter) on one batch that
    stays on the device, replayed, so no loader, copy or wait is in it. What a switch does to the arithmetic,
    visible even where the input holds the epoch; the epoch's rate over it is how far the epoch is from its
    floor. Timed after the epoch and its evaluation (the metric is untouched), warm-up left out, on the rung's own
    clock kind (device events on CUDA). Every rank replays the same number of steps (agreed), so their collectives
    stay matched."""
    started = time.perf_counter()
    timing = probe.timing()
    per_step = timing.seconds / timing.clean_steps if timing.clean_steps else 0.0
    wanted = math.ceil(STEP_ALONE_SECONDS / per_step) if per_step > 0 else STEP_ALONE_STEPS
    steps = agree_max(probe, max(STEP_ALONE_STEPS, min(budget.steps, wanted)))
    batch = next(iter(run.train_batches))          # one batch as the rung's input path delivers it, on the device
    replayed = run.steps_apart(repeat(batch, STEP_ALONE_WARMUP + steps))
    # Judged as the epoch's steps are (measure.Timing): warm-up found, blocks other processes disturbed left out.
    alone = Timing.from_steps(replayed, min_skip=STEP_ALONE_WARMUP, check_disturbance=probe.check_disturbance)
    return {"throughput": alone.throughput * probe.world_size, "steps": alone.clean_steps, "seconds": alone.seconds,
            "step_seconds": alone.step_seconds, "disturbed_steps": len(alone.step_seconds) - alone.clean_steps,
            "wall_s": time.perf_counter() - started}      # what it cost the run, its batch and warm-up included


def rung_main(job: Job, recipe: Recipe, budget: TimingBudget | None, events) -> dict[str, Any]:
    """What a rung process runs (under procs.child_main: its own process group, its log, the parent watch)."""
    if job.nproc > 1 or job.nodes is not None:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        from ..distributed import launch_local
        from ..rankfaults import HEARTBEATS, HEARTBEATS_ENV

        log = os.path.realpath("/proc/self/fd/2")           # the rung's log (procs.child_main), on Linux
        if os.path.isfile(log):                              # its ranks' heartbeats beside it (rankfaults.py)
            os.environ[HEARTBEATS_ENV] = os.path.join(os.path.dirname(log), HEARTBEATS)
        try:
            ranked = launch_local(rung_worker, (job, recipe, budget, events), job.nproc, nodes=job.nodes)
        except ChildFailedError as exc:          # its 40-line table said as the rank that failed first
            raise rank_failure(exc, job.nproc * (job.nodes.count if job.nodes else 1), log) from None
        return ranked if ranked is not None else {"node": job.nodes.rank}     # a following node: its share ran
    return run_rung(job, recipe, events.put, budget)


def rank_failure(exc, world: int, log: str = "") -> Exception:
    """A rung's job that lost a rank, said by rank (rankfaults.py): how the first rank to fail ended, where it and the
    others were last seen, and its last lines (torch prefixes a rank's uncaught exception with its rank; the rung's
    log holds them)."""
    import sys

    from ..rankfaults import HEARTBEATS_ENV, RankFailed, describe_rank_fault, exits_of, read_heartbeats

    first = exc.get_first_failure()[0] if exc.failures else None
    sys.stderr.flush()
    lines = []
    if os.path.isfile(log):
        with open(log, errors="replace") as f:
            lines = f.read()[-(1 << 20):].splitlines()
    beats = read_heartbeats(os.environ[HEARTBEATS_ENV]) if os.environ.get(HEARTBEATS_ENV) else {}
    fault = describe_rank_fault(exits_of(exc.failures, first), beats, lines, world)
    return RankFailed(f"{fault} (the rung's {world} processes failed)") if fault is not None else exc


def rung_worker(job: Job, recipe: Recipe, budget: TimingBudget | None, events) -> dict[str, Any]:
    """One rank of an `ablate --nproc N` rung (started by torch.distributed.elastic); rank 0 reports."""
    emit = events.put if os.environ.get("RANK", "0") == "0" else (lambda event: None)
    return run_rung(job, recipe, emit, budget)
