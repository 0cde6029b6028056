"""The ladder: rung recipes -> one fresh process per rung -> results.

Every rung runs in its own spawned process, so peak memory, compile caches in memory and allocator state
never leak from one rung into the next; every rung uses the same seed, so the same initial weights and the
same data order. A rung whose switches cannot act on this device (or model) is not run at all: it is
reported as "no effect on this device" with the reason, instead of a difference that is really noise.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue as queue_mod
import statistics
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import torch

from .measure import count_train_flops, measure_ceiling, peak_memory_bytes, reset_peak_memory, steady_throughput
from .recipe import Recipe, RecipeError, resolve_device, validate_for_device
from .data.imagefolder import with_decode_cache
from .techniques import changes_effect
from .techniques.precision import DTYPES, LEVEL_RUNGS, auto_amp_dtype, level_note

# name -> (label, the switches it turns on). "{amp}" is replaced by the AMP dtype chosen for the device.
LADDER: dict[str, dict[str, Any]] = {
    "baseline": {},
    "amp": {"precision": "{amp}"},
    "set_to_none": {"set_to_none": True},
    "non_blocking": {"non_blocking": True, "pin_memory": True},
    "prefetch": {"prefetch": True},
    "channels_last": {"channels_last": True},
    "compile": {"compile": True},
    "fused": {"optimizer_impl": "fused"},
}
MODES = ("cumulative", "each")
# Every rung --rungs accepts, in ladder order: the precision-level rungs (issue 3: O1/O2/O3 in bf16/fp16) sit
# where "amp" sits and are opt-in only, so the default ladder stays LADDER. Each sets precision and
# precision_level, so in cumulative mode it replaces the previous level. "fp32" names the baseline (O0).
# "decode_cache" (image folders: decode each file once, then read uint8 pixels) is opt-in too, after prefetch.
OPT_IN_AFTER = {"prefetch": {"decode_cache": {"decode_cache": True}}}
RUNGS: dict[str, dict[str, Any]] = {**dict(list(LADDER.items())[:2]), **LEVEL_RUNGS}
for _name, _changes in LADDER.items():
    RUNGS.setdefault(_name, _changes)
    RUNGS.update(OPT_IN_AFTER.get(_name, {}))
RUNG_ALIASES = {"fp32": "baseline"}


@dataclass
class Rung:
    name: str
    changes: dict[str, Any]
    recipe: Recipe
    effect: str = "measured"
    reason: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    status: str = "pending"     # pending | running | done | no-effect | failed


@dataclass
class Job:
    """What a rung process needs to rebuild the run: names (CLI) or picklable objects (Python API)."""
    model: str | Callable[[], torch.nn.Module]
    data: str | Any                     # a data spec string, or a trainfast Split
    image_size: int | None = None
    loss_fn: Callable | None = None
    device: str = "auto"
    nproc: int = 1                      # >1: the rung runs as that many torch.distributed workers (DDP)


def plan_rungs(base: Recipe, names: list[str] | None = None, mode: str = "cumulative", amp: str = "auto",
               device: torch.device | None = None) -> list[Rung]:
    """Rung recipes. cumulative: each rung adds its switches to the previous one (the seeds' ladder);
    each: the baseline plus one rung's switches at a time."""
    if mode not in MODES:
        raise RecipeError(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    device = device or resolve_device("auto")
    amp_dtype = auto_amp_dtype(device) if amp == "auto" else amp
    if amp_dtype not in ("bf16", "fp16"):
        raise RecipeError(f"--amp-dtype {amp!r} must be auto, bf16 or fp16")
    names = list(LADDER) if not names else [RUNG_ALIASES.get(n, n) for n in names]
    unknown = [n for n in names if n not in RUNGS]
    if unknown:
        raise RecipeError(f"--rungs: unknown rung(s) {', '.join(unknown)}; choose from "
                          f"{', '.join([*RUNGS, *RUNG_ALIASES])}")
    ordered = ["baseline"] + [n for n in RUNGS if n in names and n != "baseline"]
    rungs, current = [], base
    for name in ordered:
        changes = {k: (amp_dtype if v == "{amp}" else v) for k, v in RUNGS[name].items()}
        start = current if mode == "cumulative" else base
        try:
            recipe = start.replace(**changes)
            validate_for_device(recipe, device)
        except RecipeError as exc:
            raise RecipeError(f"rung {name!r}: {exc}") from exc
        rungs.append(Rung(name, changes, recipe))
        current = recipe
    return rungs


# --------------------------------------------------------------------------------------------------
# inside the rung's process


def run_rung(job: Job, recipe: Recipe, emit: Callable[[dict], None]) -> dict[str, Any]:
    """Train `recipe.epochs` epochs with the shared engine, evaluate, and return every measured number."""
    from .distributed import setup_distributed

    dist = setup_distributed(recipe, resolve_device(job.device))   # under ablate --nproc: one rank of N
    device = dist.device
    try:
        return _measure_rung(job, recipe, emit, dist, device)
    finally:
        dist.close()


def _measure_rung(job: Job, recipe: Recipe, emit: Callable[[dict], None], dist, device) -> dict[str, Any]:
    from torch import nn

    from .data.datasets import load_data
    from .models import build_model
    from .techniques.runtime import apply_runtime_flags
    from .data.badfiles import skipped_last_pass
    from .trainer import build_meter, build_run, seed_everything
    from .engine import evaluate, train_one_epoch

    split = load_data(job.data, job.image_size) if isinstance(job.data, str) else job.data
    split = with_decode_cache(split, recipe, dist)
    loss_fn = job.loss_fn or nn.CrossEntropyLoss()
    apply_runtime_flags(recipe, device)
    seed_everything(recipe.seed)
    model = build_model(job.model, split.num_classes, split.image_size) if isinstance(job.model, str) else job.model()
    reset_peak_memory(device)

    # FLOPs on the eager model before any wrapping (a sharded FSDP2 copy could not run alone).
    sample = first_readable(split.train)
    fmt = torch.channels_last if recipe.channels_last and sample.ndim == 3 else torch.contiguous_format
    probe = torch.zeros((recipe.batch_size, *sample.shape), device=device).contiguous(memory_format=fmt)
    flops_per_step = count_train_flops(model.to(device), loss_fn, probe,
                                       torch.zeros(recipe.batch_size, dtype=torch.long, device=device))
    state, train_batches, val_batches = build_run(model, split, recipe, device, dist, loss_fn)

    total_steps = len(train_batches) * recipe.epochs
    windows, losses, epoch_times, data_wait, correct, seen, skipped = [], [], [], 0.0, 0, 0, 0

    def on_window(step: int, stats) -> None:
        emit({"event": "progress", "step": step, "total": total_steps, "loss": stats.losses[-1]})

    for epoch in range(recipe.epochs):
        dist.set_epoch(epoch)
        meter = build_meter(state, dist, on_window)
        with dist.watch():
            stats = train_one_epoch(state, train_batches, dist.criterion(loss_fn), meter)
        # The first window of every epoch holds compile, allocator warm-up and worker start-up.
        windows.extend(stats.windows[1:] if len(stats.windows) > 1 else stats.windows)
        losses.extend(stats.losses)
        epoch_times.append(stats.seconds)
        data_wait += stats.data_wait_s
        correct += stats.correct
        seen += stats.samples
        skipped += skipped_last_pass(train_batches, device)
    throughput, spread, used = steady_throughput(windows, skip_first=0)
    # Ranks step in lockstep (gradient all-reduce), so the job's throughput is world_size x one rank's.
    throughput, spread = throughput * dist.world_size, spread * dist.world_size
    metrics = dist.reduce_eval(evaluate(state.model, val_batches, loss_fn, state.precision))
    train_loss, train_accuracy = dist.reduce_train(sum(losses) / max(1, len(losses)), correct, seen)
    flops_per_sample = flops_per_step / recipe.batch_size
    return {
        "throughput": throughput,
        "throughput_spread": spread,
        "timing_windows": used,
        "epoch_time_s": sum(epoch_times) / len(epoch_times),
        "epoch_times_s": epoch_times,
        "data_wait_fraction": data_wait / max(1e-9, sum(epoch_times)),
        "peak_memory_bytes": peak_memory_bytes(device),
        "accuracy": metrics["accuracy"],
        "loss": metrics["loss"],
        "val_samples": metrics["samples"],
        "train_loss": train_loss,
        "train_losses": losses,             # rank 0's
        "train_accuracy": train_accuracy,
        "world_size": dist.world_size,
        "steps": state.step,
        "flops_per_sample": flops_per_sample,
        "flops_per_s": flops_per_sample * throughput,
        "precision_state": state.precision.metrics(),
        "num_workers": recipe.num_workers,
        "skipped_files": skipped + skipped_last_pass(val_batches, device),   # unreadable images, all epochs
    }


def _rung_process(job: Job, recipe: Recipe, events, log_path: str) -> None:
    # The rung's warnings and tracebacks go to its log file, not over the parent's live table.
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 2)
        try:
            if job.nproc > 1:
                from .distributed import launch_local

                result = launch_local(_rung_worker, (job, recipe, events), job.nproc)
            else:
                result = run_rung(job, recipe, events.put)
            events.put({"event": "result", "result": result})
        except BaseException as exc:  # report every failure to the parent, which keeps going
            traceback.print_exc()
            events.put({"event": "error", "error": f"{type(exc).__name__}: {exc}"})


def _rung_worker(job: Job, recipe: Recipe, events) -> dict[str, Any]:
    """One rank of an `ablate --nproc N` rung (started by torch.distributed.elastic); rank 0 reports."""
    emit = events.put if os.environ.get("RANK", "0") == "0" else (lambda event: None)
    return run_rung(job, recipe, emit)


# --------------------------------------------------------------------------------------------------
# in the parent


@dataclass
class AblationResult:
    rungs: list[Rung]
    environment: dict[str, Any]
    out_dir: Path
    best: Recipe
    best_name: str
    ceilings: dict[str, float]
    seed_runs: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        from .report import results_dict

        return results_dict(self)


def accuracy_band(accuracy: float, n: int, seed_accuracies: list[float] | None = None) -> float:
    """Half-width of the band within which a rung's accuracy is indistinguishable from the baseline's.

    Two noise sources: evaluation sampling (n held-out samples: two binomial standard errors of a
    difference, sqrt(2) x one run's) and training itself (another seed, or the numerics of a technique,
    sends SGD down another path: two standard deviations of the baseline over its seeds, widened by
    sqrt(1 + 1/k) for comparing one run against the mean of k). The band is the larger of the two."""
    p = min(max(accuracy, 1.0 / max(1, n)), 1 - 1.0 / max(1, n))
    band = 2 * math.sqrt(2 * p * (1 - p) / max(1, n))
    if seed_accuracies and len(seed_accuracies) >= 2:
        k = len(seed_accuracies)
        band = max(band, 2 * statistics.stdev(seed_accuracies) * math.sqrt(1 + 1 / k))
    return band


def score_rungs(rungs: list[Rung], ceilings: dict[str, float], seed_accuracies: list[float] | None = None) -> None:
    """Speed-up, memory ratio, ceiling fraction and accuracy flags, all relative to the baseline (its
    accuracy: the mean over its seeds when it was repeated)."""
    base = rungs[0].result if rungs and rungs[0].status == "done" else None
    if base:
        seeds = seed_accuracies or [base["accuracy"]]
        reference = statistics.fmean(seeds)
        band = accuracy_band(reference, base["val_samples"], seeds)
    for rung in rungs:
        r = rung.result
        if rung.status != "done":
            continue
        ceiling = ceilings.get(rung.recipe.precision)
        r["ceiling_flops_per_s"] = ceiling
        r["ceiling_fraction"] = r["flops_per_s"] / ceiling if ceiling else None
        if base:
            r["speedup"] = r["throughput"] / base["throughput"] if base["throughput"] else None
            r["memory_ratio"] = r["peak_memory_bytes"] / base["peak_memory_bytes"]
            r["accuracy_delta"] = r["accuracy"] - reference
            r["accuracy_band"] = band
            r["accuracy_flag"] = abs(r["accuracy_delta"]) > band


def first_readable(dataset, tries: int = 100) -> torch.Tensor:
    """The first input of `dataset` that decodes (its shape sizes the FLOP probe); an unreadable file is
    the bad-file tally's business during training, not a reason for the probe to crash."""
    from .data.datasets import DataError, Skipped

    for index in range(min(tries, len(dataset))):
        item = dataset[index]
        if not isinstance(item, Skipped):
            return item[0]
    raise DataError(f"none of the first {min(tries, len(dataset))} training images could be read")


def pick_best(rungs: list[Rung]) -> Rung:
    """The fastest measured rung (steady-state throughput) whose accuracy is not below the baseline's
    noise band, among the rungs that are not risky by construction (O3 `pure` levels: one short run
    inside the band does not show that updates below half precision's spacing were not lost; they are
    measured and shown, never recommended); the baseline if none qualifies."""
    candidates = [r for r in rungs if r.status == "done" and level_note(r.recipe) is None
                  and not (r.result.get("accuracy_flag") and r.result.get("accuracy_delta", 0) < 0)]
    return max(candidates, key=lambda r: r.result["throughput"]) if candidates else rungs[0]


def default_out_dir() -> Path:
    return Path("runs") / datetime.now().strftime("ablate-%Y%m%d-%H%M%S")


def ablate(model: str | Callable[[], torch.nn.Module] = "resnet9", train_set=None, val_set=None, loss_fn=None, *,
           data: str = "digits", image_size: int | None = None, recipe: Recipe | None = None,
           rungs: list[str] | None = None, mode: str = "cumulative", amp_dtype: str = "auto",
           device: str = "auto", out: str | Path | None = None, mean=None, std=None,
           noise_seeds: int = 3, show: bool = True, nproc: int = 1) -> AblationResult:
    """Run the ladder and write the report folder. `model` is a timm/built-in name or a picklable
    zero-argument factory (each rung runs in a spawned process, so lambdas cannot cross). With
    `train_set`/`val_set` the datasets are used instead of `data`. The baseline is trained with
    `noise_seeds` seeds in all, so the accuracy band includes seed-to-seed training noise. With `nproc` > 1
    every rung runs as that many DDP processes (torch.distributed.elastic, rendezvous on 127.0.0.1);
    rank 0 reports."""
    from .data.datasets import load_data
    from .data.loader import resolve_num_workers
    from .models import build_model, check_model_name
    from .report import Display, environment, write_report
    from .trainer import as_split

    base = recipe or Recipe()
    if not isinstance(noise_seeds, int) or noise_seeds < 1:
        raise RecipeError(f"--noise-seeds {noise_seeds!r} must be a positive integer")
    dev = resolve_device(device)
    validate_for_device(base, dev)
    if not isinstance(nproc, int) or nproc < 1:
        raise RecipeError(f"--nproc {nproc!r} must be a positive integer")
    if isinstance(model, str):
        check_model_name(model)
    # Everything the rungs need is checked here, before the first rung starts.
    split = as_split(train_set, val_set, mean=mean, std=std) if train_set is not None else load_data(data, image_size)
    # num_workers="auto" is measured once, here: every rung then runs with the same worker count, so the
    # differences between rungs come from their techniques, not from a noisy per-rung choice.
    base = resolve_num_workers(base, split, dev)
    plan = plan_rungs(base, rungs, mode, amp_dtype, dev)
    probe_model = build_model(model, split.num_classes, split.image_size) if isinstance(model, str) else model()
    for rung in plan[1:]:
        effect = changes_effect(rung.changes, dev, probe_model, split)
        rung.effect, rung.reason = effect.label, effect.reason
        if not effect.acts:
            rung.status = "no-effect"
    del probe_model
    if any(r.recipe.decode_cache and r.status != "no-effect" for r in plan):
        with_decode_cache(split, base.replace(decode_cache=True))   # built once here, opened by the rungs
    job = Job(model, data if train_set is None else split, split.image_size or image_size, loss_fn, device, nproc)

    out_dir = Path(out) if out is not None else default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    ceilings = {p: measure_ceiling(dev, DTYPES[p]) for p in dict.fromkeys(r.recipe.precision for r in plan)}
    env = environment(dev)
    display = Display(plan, ceilings, env, show=show)
    ctx = mp.get_context("spawn")
    seed_runs: list[dict[str, Any]] = []
    with display:
        for rung in plan:
            if rung.status == "no-effect":
                display.update()
                continue
            rung.status = "running"
            display.start_rung(rung)
            rung.result = _run_in_process(ctx, job, rung, out_dir / f"rung-{rung.name}.log", display)
            rung.status = "failed" if "error" in rung.result else "done"
            if rung.name == "baseline" and rung.status == "done":
                seed_runs = [_seed_summary(rung.recipe.seed, rung.result)] + _run_seed_repeats(
                    ctx, job, rung, noise_seeds - 1, out_dir, display)
            score_rungs(plan, ceilings, [s["accuracy"] for s in seed_runs if s.get("accuracy") is not None])
            display.update()
        # The ceiling is a peak: measured again after the ladder and the higher kept, so a slow spell on a
        # shared machine at the start does not put rungs "above" it.
        ceilings.update({p: max(c, measure_ceiling(dev, DTYPES[p])) for p, c in ceilings.items()})
        score_rungs(plan, ceilings, [s["accuracy"] for s in seed_runs if s.get("accuracy") is not None])
    best = pick_best(plan)
    result = AblationResult(plan, env, out_dir, best.recipe, best.name, ceilings, seed_runs)
    write_report(result)
    display.final(result)
    return result


def _seed_summary(seed: int, result: dict[str, Any]) -> dict[str, Any]:
    return {"seed": seed, **{k: result.get(k) for k in ("accuracy", "loss", "throughput", "error")}}


def _run_seed_repeats(ctx, job: Job, baseline: Rung, repeats: int, out_dir: Path, display) -> list[dict[str, Any]]:
    """The baseline again with other seeds (other init, other data order): how far accuracy moves when
    nothing but chance changes. Only accuracy is used from these runs."""
    runs = []
    for i in range(1, repeats + 1):
        seed = baseline.recipe.seed + i
        probe = Rung(f"baseline-seed{seed}", {}, baseline.recipe.replace(seed=seed))
        display.start_rung(probe)
        result = _run_in_process(ctx, job, probe, out_dir / f"rung-baseline-seed{seed}.log", display)
        runs.append(_seed_summary(seed, result))
    return runs


def _run_in_process(ctx, job: Job, rung: Rung, log_path: Path, display) -> dict[str, Any]:
    events = ctx.Queue()
    # Not a daemon: daemonic processes may not have children, and the rung's DataLoader workers are its
    # children (num_workers > 0 would fail with "daemonic processes are not allowed to have children").
    proc = ctx.Process(target=_rung_process, args=(job, rung.recipe, events, str(log_path)), daemon=False)
    t0 = time.perf_counter()
    proc.start()
    result: dict[str, Any] | None = None
    while result is None:
        try:
            event = events.get(timeout=0.5)
        except queue_mod.Empty:
            if not proc.is_alive():
                result = {"error": f"rung process exited with code {proc.exitcode} (see {log_path})"}
            continue
        if event["event"] == "progress":
            display.progress(rung, event)
        elif event["event"] == "result":
            result = event["result"]
        else:
            result = {"error": f"{event['error']} (see {log_path})"}
    proc.join(timeout=60)
    result["wall_time_s"] = time.perf_counter() - t0
    return result
