"""The ladder: rung recipes -> one fresh process per rung -> results.

Every rung runs in its own spawned process, so peak memory, compile caches in memory and allocator state
never leak from one rung into the next; every rung uses the same seed, so the same initial weights and the
same data order. A rung whose switches cannot act on this device (or model) is not run at all: it is
reported as "no effect on this device" with the reason, instead of a difference that is really noise.
"""
from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .procs import run_supervised
from .measure import count_train_flops, measure_ceiling, reset_peak_memory
from .stats import (MIN_EFFECT, SAME, Candidate, Noise, Repeat, compare, pooled_noise, rate_estimate, recommend,
                    recommendation_odds)
from .recipe import Recipe, RecipeError, resolve_device, validate_for_device
from .data.imagefolder import with_decode_cache
from .techniques import changes_effect
from .techniques.precision import DTYPES, LEVEL_RUNGS, SLOW_HALF, auto_amp_dtype, level_note, slow_half_reason

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
MAX_REPEATS = 8                         # settle_within_s adds passes up to this many repeats of every rung
SETTLE_WITHIN_S = 150.0                 # the built-in ablation's default: what keeps `make ablate` under 3 min
FIRST_REPORTED = "<first reported>"     # ablate --measure full without --metric: what the script reports first
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
# Detection's ladder (issue 13): its own rungs, aspect-ratio grouping and DataLoader workers (a detector's
# images are made or decoded per sample, the batch padded by the model), before channels_last; compile last,
# since in cumulative mode every later rung would inherit it and it is not run on a detector (tasks/detection.py
# says why). The rungs that cannot work on a detector (O2/O3 levels, prefetch, decode_cache) stay nameable so
# --rungs refuses them with the reason (Detection.validate) instead of calling them unknown.
DETECTION_LADDER: dict[str, dict[str, Any]] = {
    "baseline": {},
    "amp": {"precision": "{amp}"},
    "set_to_none": {"set_to_none": True},
    "group_aspect_ratio": {"group_aspect_ratio": True},
    "workers": {"num_workers": 2},
    "channels_last": {"channels_last": True},
    "compile": {"compile": True},
}
DETECTION_RUNGS: dict[str, dict[str, Any]] = {
    **{name: changes for name, changes in RUNGS.items() if name not in DETECTION_LADDER and name != "fused"},
    **{name: changes for name, changes in DETECTION_LADDER.items() if name != "compile"},
    "fused": RUNGS["fused"], "compile": DETECTION_LADDER["compile"],
}
LADDERS = {"classification": (LADDER, RUNGS), "detection": (DETECTION_LADDER, DETECTION_RUNGS)}


@dataclass
class Rung:
    name: str
    changes: dict[str, Any]
    recipe: Recipe
    effect: str = "measured"
    reason: str = ""
    result: dict[str, Any] = field(default_factory=dict)     # aggregated over repeats (score_rungs)
    status: str = "pending"     # pending | running | partial | done | no-effect | failed
    repeats: list[dict[str, Any]] = field(default_factory=list)    # one result per timed process
    seed_runs: list[dict[str, Any]] = field(default_factory=list)  # baseline only: extra noise seeds


@dataclass
class Job:
    """What a rung process needs to rebuild the run: names (CLI) or picklable objects (Python API)."""
    model: str | Callable[[], torch.nn.Module]
    data: str | Any                     # a data spec string, or a trainfast Split
    image_size: int | None = None
    loss_fn: Callable | None = None
    device: str = "auto"
    nproc: int = 1                      # >1: the rung runs as that many torch.distributed workers (DDP)
    task: str = "classification"        # tasks/: what a batch, a loss and the judged metric mean


def plan_rungs(base: Recipe, names: list[str] | None = None, mode: str = "cumulative", amp: str = "auto",
               device: torch.device | None = None, task: str = "classification") -> list[Rung]:
    """Rung recipes. cumulative: each rung adds its switches to the previous one (the seeds' ladder);
    each: the baseline plus one rung's switches at a time. `task` picks the ladder (LADDERS) and refuses
    the rungs that cannot work for it, with the reason."""
    from .tasks import build_task

    if mode not in MODES:
        raise RecipeError(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    device = device or resolve_device("auto")
    amp_dtype = auto_amp_dtype(device) if amp == "auto" else amp
    if amp_dtype not in ("bf16", "fp16"):
        raise RecipeError(f"--amp-dtype {amp!r} must be auto, bf16 or fp16")
    ladder, table = LADDERS[task]
    checker = build_task(task)
    names = list(ladder) if not names else [RUNG_ALIASES.get(n, n) for n in names]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise RecipeError(f"--rungs: unknown rung(s) {', '.join(unknown)}; choose from "
                          f"{', '.join([*table, *RUNG_ALIASES])}")
    ordered = ["baseline"] + [n for n in table if n in names and n != "baseline"]
    # --amp-dtype auto on a device where neither half type is fast (a CPU without bf16 hardware): the amp rung
    # is shown with the measurement that rules it out, and the ladder climbs on without it.
    slow = slow_half_reason(device, amp_dtype) if amp == "auto" and "amp" in ordered else None
    rungs, current = [], base
    for name in ordered:
        changes = {k: (amp_dtype if v == "{amp}" else v) for k, v in table[name].items()}
        start = current if mode == "cumulative" else base
        try:
            recipe = start.replace(**changes)
            validate_for_device(recipe, device)
            checker.validate(recipe)
        except RecipeError as exc:
            raise RecipeError(f"rung {name!r}: {exc}") from exc
        rungs.append(Rung(name, changes, recipe))
        if name == "amp" and slow:
            rule_out_slow_half(rungs[-1], slow)
            continue
        current = recipe
    return rungs


def rule_out_slow_half(rung: Rung, reason: str) -> None:
    """A precision rung whose half type slow_half_reason measured as much slower than fp32: shown, not run
    (mark_effects leaves it so)."""
    rung.status, rung.effect, rung.reason = "no-effect", SLOW_HALF, reason


# --------------------------------------------------------------------------------------------------
# inside the rung's process


@dataclass(frozen=True)
class TimingBudget:
    """How long a rung is timed, in steps after warm-up, whatever the epoch length: at least `steps`
    steady steps, or at least `floor` of them once they take `seconds` (slow models: fewer, longer steps).
    Short epochs are continued past the accuracy run (the data cycled) until the budget is met."""
    steps: int = 16
    seconds: float = 60.0
    floor: int = 8
    min_seconds: float = 2.0    # millisecond steps are timed over at least this long: enough blocks for a spread


def run_rung(job: Job, recipe: Recipe, emit: Callable[[dict], None], budget: TimingBudget | None = None) -> dict[str, Any]:
    """Train `recipe.epochs` epochs with the shared engine, evaluate, time the steady state, and return every
    measured number. `budget=None`: accuracy only (the baseline's extra noise seeds)."""
    from .distributed import setup_distributed

    dist = setup_distributed(recipe, resolve_device(job.device))   # under ablate --nproc: one rank of N
    try:
        return _measure_rung(job, recipe, emit, dist, dist.device, budget)
    finally:
        dist.close()


def _measure_rung(job: Job, recipe: Recipe, emit: Callable[[dict], None], dist, device,
                  budget: TimingBudget | None) -> dict[str, Any]:
    """The built-in run, measured by the same probe as a user's script under `ablate -- COMMAND` (probe.py):
    its steps are timed by the state's StepTimer, its evaluation goes in as reported metrics."""
    from itertools import islice

    from .measure import EpochStats
    from .probe import MeasureSpec, Probe
    from .tasks import build_task
    from .techniques.runtime import apply_runtime_flags
    from .data.badfiles import skipped_last_pass
    from .trainer import build_meter, build_run, seed_everything
    from .engine import train_one_epoch

    task = build_task(job.task, job.loss_fn, dist)
    split = task.load_data(job.data, job.image_size) if isinstance(job.data, str) else job.data
    split = with_decode_cache(split, recipe, dist)
    apply_runtime_flags(recipe, device)
    seed_everything(recipe.seed)
    model = task.build_model(job.model, split) if isinstance(job.model, str) else job.model()
    reset_peak_memory(device)
    state, train_batches, val_batches = build_run(model, split, recipe, device, dist, task)
    timed, budget = budget is not None, budget or TimingBudget()
    probe = Probe(MeasureSpec("", "full", **dataclasses.asdict(budget)))
    probe.watch(state, recipe.num_workers)

    total_steps = len(train_batches) * recipe.epochs
    trained, epoch_times, skipped = EpochStats(), [], 0

    def on_window(step: int, stats) -> None:
        emit({"event": "progress", "step": step, "total": total_steps, "loss": stats.losses[-1]})

    def run_pass(epoch: int, batches) -> Any:
        dist.set_epoch(epoch)
        meter = build_meter(state, dist, on_window, task)
        with dist.watch():
            return train_one_epoch(state, batches, task, meter)

    for epoch in range(recipe.epochs):
        stats = run_pass(epoch, train_batches)
        trained.absorb(stats)
        epoch_times.append(stats.seconds)
        skipped += skipped_last_pass(train_batches, device)
    metrics = task.evaluate(state.model, val_batches, state.precision, dist)
    train_metrics = task.train_metrics(trained, dist)
    updates = state.step            # the accuracy run's optimizer steps (the timing steps below add more)

    # Timing: the steps after warm-up, continued past the accuracy run (after its evaluation, so the metric
    # is untouched) until the budget is met. Every rank runs the same number of extra steps (the most any
    # rank needs: probe.steps_needed is a collective), so their collectives stay matched. On CPU in one
    # process, blocks of steps during which other processes used the machine are left out and more steps
    # are run instead (up to 3x the budget): see measure.Timing. The accuracy-only runs (the baseline's
    # extra noise seeds) are not timed further.
    extra_passes, limit = 0, None
    while timed:
        need = probe.steps_needed()
        limit = limit or state.timer.updates + 3 * max(budget.steps, need)
        need = min(need, limit - state.timer.updates)
        if need <= 0:
            break
        total_steps = state.timer.updates + need
        run_pass(recipe.epochs + extra_passes, islice(train_batches, need))
        extra_passes += 1
    judged = task.rung_metrics(metrics)    # "accuracy": the metric every rung is judged on (detection: mAP)
    probe.reported = {"accuracy": judged["accuracy"], "loss": judged["loss"]}
    probe.extra = {
        "seed": recipe.seed,
        "epoch_time_s": sum(epoch_times) / len(epoch_times),
        "epoch_times_s": epoch_times,
        **judged,
        **train_metrics,
        "train_losses": trained.losses,     # rank 0's
        "steps": updates,
        "num_workers": recipe.num_workers,
        "skipped_files": skipped + skipped_last_pass(val_batches, device),   # unreadable images, all epochs
    }
    return probe.result("accuracy run ended" + (", then the timing budget" if extra_passes else ""))


def _rung_main(job: Job, recipe: Recipe, budget: TimingBudget | None, events) -> dict[str, Any]:
    """What a rung process runs (under procs.child_main: its own process group, its log, the parent watch)."""
    if job.nproc > 1:
        from .distributed import launch_local

        return launch_local(_rung_worker, (job, recipe, budget, events), job.nproc)
    return run_rung(job, recipe, events.put, budget)


def _rung_worker(job: Job, recipe: Recipe, budget: TimingBudget | None, events) -> dict[str, Any]:
    """One rank of an `ablate --nproc N` rung (started by torch.distributed.elastic); rank 0 reports."""
    emit = events.put if os.environ.get("RANK", "0") == "0" else (lambda event: None)
    return run_rung(job, recipe, emit, budget)


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
    tie: list[str] = field(default_factory=list)        # rungs not measurably different from the recommendation
    settings: dict[str, Any] = field(default_factory=dict)
    odds: dict[str, float] = field(default_factory=dict)    # how often a rerun would recommend each rung

    def to_dict(self) -> dict[str, Any]:
        from .report import results_dict

        return results_dict(self)


def accuracy_band(accuracy: float, n: int | None, seed_accuracies: list[float] | None = None,
                  runs: int = 1) -> float | None:
    """Half-width of the band within which a rung's accuracy is indistinguishable from the baseline's.

    Two noise sources: evaluation sampling (n held-out samples: two binomial standard errors of a
    difference, sqrt(2) x one run's) and training itself (another seed, or the numerics of a technique,
    sends SGD down another path: two standard deviations of the baseline over its k seeds, scaled by
    sqrt(1/runs + 1/k) for comparing the mean of a rung's `runs` repeats against the mean of k). The band
    is the larger of the two. A script's own metric (n None: not a proportion of held-out samples that we
    know of) has the training-noise part only, and no band at all (None) from fewer than two seeds."""
    if not n and len(seed_accuracies or []) < 2:
        return None
    band = 0.0
    if n:
        p = min(max(accuracy, 1.0 / n), 1 - 1.0 / n)
        band = 2 * math.sqrt(2 * p * (1 - p) / n)
    if seed_accuracies and len(seed_accuracies) >= 2:
        k = len(seed_accuracies)
        band = max(band, 2 * statistics.stdev(seed_accuracies) * math.sqrt(1 / max(1, runs) + 1 / k))
    return band


def rung_repeats(rung: Rung) -> list[Repeat]:
    """The rung's timed steps, one Repeat per finished process (samples x world size: the job's rate)."""
    out = []
    for r in rung.repeats:
        kept = [b for b in r["timing"]["blocks"] if not b["disturbed"]] or r["timing"]["blocks"]   # as Timing does
        blocks = tuple((b["samples"] * r["world_size"], b["seconds"]) for b in kept)
        if blocks:
            out.append(Repeat(blocks))
    return out


def ladder_noise(rungs: list[Rung]) -> Noise | None:
    """The process-to-process noise behind every interval of this ablation, pooled over its measured rungs;
    one definition for the scores and the recommendation, so the two never judge with different noise."""
    return pooled_noise([rung_repeats(r) for r in rungs if r.status in ("done", "partial")])


def aggregate(rung: Rung, noise: Noise | None, metric: str | None = "accuracy") -> None:
    """The rung's numbers over its repeats: means for the metric and times, the worst peak memory, and the
    rate with its interval. A user's script has no epoch time, held-out samples or training loss of ours:
    those are None for it."""
    reps = rung.repeats
    if not reps:
        return
    first = reps[0]
    timed = rung_repeats(rung)
    rate = rate_estimate(timed, noise) if timed else None
    values = [run_metric(r, metric) for r in reps]
    known = None not in values

    def mean(key: str) -> float | None:
        vals = [r.get(key) for r in reps]
        return statistics.fmean(vals) if None not in vals else None

    rung.result = {
        **{k: first.get(k) for k in ("val_samples", "world_size", "num_workers", "precision_state", "train_losses",
                                     "rate_unit", "session", "compile", "overridden")},
        "repeats": len(reps),
        "throughput": rate.value if rate else 0.0,
        "throughput_interval": rate.interval if rate else None,
        "throughput_spread": rate.half_width if rate else None,
        "accuracy": statistics.fmean(values) if known else None,
        "accuracies": values if known else [],
        "loss": mean("loss"),
        "train_loss": mean("train_loss"),
        "epoch_time_s": mean("epoch_time_s"),
        "wall_s": statistics.fmean(r["wall_time_s"] for r in reps) if all(r.get("wall_time_s") for r in reps) else None,
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in reps),
        "data_wait_fraction": statistics.fmean(r["data_wait_fraction"] for r in reps),
        "skipped_files": max(r.get("skipped_files") or 0 for r in reps),      # each run reads the same files
        "steps": first.get("steps", first.get("steps_run")),
        "warmup_steps": [r["timing"]["warmup_steps"] for r in reps],
        "disturbed_steps": [r["timing"].get("disturbed_steps", 0) for r in reps],
        "timed_steps": [r["timing"]["timed_steps"] for r in reps],
        "timed_seconds": [r["timing"]["timed_seconds"] for r in reps],
        "wall_time_s": [r.get("wall_time_s") for r in reps],
    }


def score_rungs(rungs: list[Rung], ceilings: dict[str, float], seed_accuracies: list[float] | None = None,
                flops_per_sample: float | None = None, mode: str = "cumulative",
                min_effect: float = MIN_EFFECT, metric: tuple[str | None, str | None] = ("accuracy", "max")) -> None:
    """Speed-up with its interval and verdict against the baseline (and, cumulative, against the rung
    before: what adding this switch bought), memory ratio, ceiling fraction and accuracy flags. Accuracy (or
    a script's reported `metric`) is judged against the baseline's mean over its seeds; a flag marks a rung
    outside the band, `accuracy_worse` one outside it on the wrong side (below for a metric to maximize).
    The noise behind every interval is pooled over all the measured rungs (stats.pooled_noise)."""
    name, goal = metric
    sign = -1.0 if (goal or metric_goal(name)) == "min" else 1.0
    noise = ladder_noise(rungs)
    for rung in rungs:
        aggregate(rung, noise, name)
    base = rungs[0] if rungs and rungs[0].status == "done" and rungs[0].result else None
    reference = None
    if base:
        seeds = [a for a in (seed_accuracies or base.result["accuracies"]) if a is not None]
        reference = statistics.fmean(seeds) if seeds and base.result["accuracy"] is not None else None
        base_repeats = rung_repeats(base)
    previous = base
    for rung in rungs:
        r = rung.result
        if rung.status != "done" or not r:
            continue
        ceiling = ceilings.get(rung.recipe.precision)
        r["flops_per_sample"] = flops_per_sample
        r["flops_per_s"] = flops_per_sample * r["throughput"] if flops_per_sample else None
        r["ceiling_flops_per_s"] = ceiling
        r["ceiling_fraction"] = r["flops_per_s"] / ceiling if ceiling and r["flops_per_s"] else None
        if base and rung is not base:
            mine = rung_repeats(rung)
            if mine and base_repeats:
                versus = compare(rung.name, mine, "baseline", base_repeats, min_effect, noise)
                r["speedup"], r["speedup_interval"] = versus.speedup.value, versus.speedup.interval
                r["verdict"], r["verdict_text"] = versus.verdict, versus.text
                r["agreement"], r["firm"] = versus.agreement, versus.firm
                if mode == "cumulative" and rung_repeats(previous):
                    step = compare(rung.name, mine, previous.name, rung_repeats(previous), min_effect, noise)
                    r["vs_previous"] = {"rung": previous.name, **step.to_dict(), "text": step.text}
            r["memory_ratio"] = r["peak_memory_bytes"] / base.result["peak_memory_bytes"]
            if reference is not None and r["accuracy"] is not None:
                r["accuracy_delta"] = r["accuracy"] - reference
                r["accuracy_band"] = accuracy_band(reference, base.result["val_samples"], seeds, runs=r["repeats"])
                r["accuracy_flag"] = r["accuracy_band"] is not None and abs(r["accuracy_delta"]) > r["accuracy_band"]
                r["accuracy_worse"] = r["accuracy_flag"] and sign * r["accuracy_delta"] < 0
        elif rung is base:
            r["speedup"], r["speedup_interval"], r["verdict"] = 1.0, [1.0, 1.0], "reference"
            if reference is not None:
                r["accuracy_reference"] = reference
                r["accuracy_band"] = accuracy_band(reference, r["val_samples"], seeds, runs=r["repeats"])
        r["noise"] = noise_summary(noise, r["repeats"], min_effect)
        previous = rung


def noise_summary(noise: Noise | None, pairs: int, min_effect: float) -> dict[str, Any] | None:
    """The noise behind a rung's intervals, and what it means for repeatability: the smallest speed-up its
    comparisons detect in 80% of runs, and the repeats that would detect `min_effect` (or 10%, if larger)."""
    if noise is None or pairs < 1:
        return None
    target = max(min_effect, 0.10)
    return {"sigma_log": math.sqrt(noise.variance), "df": noise.df,
            "detectable_effect": noise.detectable(pairs, min_effect),
            "repeats_for": {f"{target:.2f}": noise.repeats_for(target, min_effect)}}


def metric_goal(name: str | None) -> str:
    """Whether a metric is better high or low, from its name: losses, errors and perplexities are minimized."""
    lowered = (name or "").lower()
    return "min" if any(word in lowered for word in ("loss", "err", "perplexity", "wer", "mse", "mae")) else "max"


def first_readable(dataset, tries: int = 100) -> torch.Tensor:
    """The first input of `dataset` that decodes (its shape sizes the FLOP probe); an unreadable file is
    the bad-file tally's business during training, not a reason for the probe to crash."""
    from .data.datasets import DataError, Skipped

    for index in range(min(tries, len(dataset))):
        item = dataset[index]
        if not isinstance(item, Skipped):
            return item[0]
    raise DataError(f"none of the first {min(tries, len(dataset))} training images could be read")


def pick_best(rungs: list[Rung], min_effect: float = MIN_EFFECT) -> tuple[Rung, list[str], dict[str, float]]:
    """The recommendation, its tie (stats.recommend) and how often a rerun would recommend each rung
    (stats.recommendation_odds). Candidates: the baseline and the measured rungs whose accuracy is not below the
    baseline's noise band and that are not risky by construction (O3 `pure` levels: one short run inside the
    band does not show that updates below half precision's spacing were not lost; they are measured and shown,
    never recommended). A rung is recommended over a simpler one only when it is measurably faster; the
    baseline if nothing is."""
    base = rungs[0]
    if base.status != "done" or not rung_repeats(base):
        return base, [base.name], {base.name: 1.0}
    candidates = [base] + [r for r in rungs[1:] if r.status == "done" and rung_repeats(r) and level_note(r.recipe) is None
                           and not r.result.get("accuracy_worse")]
    pool = [Candidate(r.name, switch_count(base.recipe, r.recipe), rung_repeats(r))
            for r in candidates]
    noise = ladder_noise(rungs)
    name, tie = recommend(pool, min_effect, noise)
    return next(r for r in rungs if r.name == name), tie, recommendation_odds(pool, min_effect, noise)


def recipe_changes(base: Recipe, recipe: Recipe) -> dict[str, Any]:
    """The fields of `recipe` that differ from `base`'s, with their values."""
    a, b = base.to_dict(), recipe.to_dict()
    return {k: b[k] for k in b if a[k] != b[k]}


def switch_count(base: Recipe, recipe: Recipe) -> float:
    """How far a rung's recipe is from the baseline's, for the tie-break towards the simplest: one per changed
    Recipe field, and a batch size counted by its doublings (batch 256 from 64 is a larger change to the
    optimization than 128, so of two sizes within the noise of each other the smaller is recommended)."""
    changed = recipe_changes(base, recipe).keys() - {"seed", "batch_size"}
    if recipe.batch_size == base.batch_size:
        return len(changed)
    return len(changed) + abs(math.log2(recipe.batch_size / base.batch_size))


def default_out_dir() -> Path:
    return Path("runs") / datetime.now().strftime("ablate-%Y%m%d-%H%M%S")


def ablate(model: str | Callable[[], torch.nn.Module] = "resnet9", train_set=None, val_set=None, loss_fn=None, *,
           data: str | None = None, image_size: int | None = None, recipe: Recipe | None = None,
           rungs: list[str] | None = None, mode: str = "cumulative", amp_dtype: str = "auto",
           device: str = "auto", out: str | Path | None = None, mean=None, std=None,
           noise_seeds: int = 3, repeats: int = 3, budget: TimingBudget | None = None,
           min_effect: float = MIN_EFFECT, resume: bool = False, rung_timeout: float | None = None, show: bool = True,
           nproc: int = 1, task: str | None = None,
           settle_within_s: float | None = SETTLE_WITHIN_S) -> AblationResult:
    """Run the ladder and write the report folder. `model` is a timm/built-in name (or a detection model's)
    or a picklable zero-argument factory (each rung runs in a spawned process, so lambdas cannot cross). With
    `train_set`/`val_set` the datasets are used instead of `data` (default: the task's built-in data).
    `task`: classification, or detection (inferred from a detection model's name or a DetectionSplit): its own
    ladder (DETECTION_LADDER) and every rung judged on COCO mAP instead of accuracy.

    Every rung runs `repeats` times, each in a fresh process, in interleaved order (every rung once, then
    every rung again), repeat i with seed recipe.seed + i for every rung: a slow spell of the machine hits
    all rungs alike, and every rung's accuracy is a mean over `repeats` seeds. The baseline is trained with
    `noise_seeds` seeds in all (the extra ones for accuracy only), so the accuracy band includes
    seed-to-seed training noise. `budget` sets how many steady steps each run is timed over. A difference
    below `min_effect` (a fraction) is never called a gain or a loss. With `nproc` > 1 every rung runs as
    that many DDP processes (torch.distributed.elastic, rendezvous on 127.0.0.1); rank 0 reports.
    `resume=True` continues an interrupted ablation in `out`: finished runs are reused, not run again.
    A run that passes `rung_timeout` seconds (default: 10x the baseline's first run, at least 300 s) is
    stopped with its whole process tree and reported failed with the tail of its log; the others go on.
    `settle_within_s`: passes added while a verdict is marked ? (run_ladder); None or 0: exactly `repeats`."""
    budget = budget or TimingBudget()
    check_counts(noise_seeds=noise_seeds, repeats=repeats, nproc=nproc, rung_timeout=rung_timeout, min_effect=min_effect)
    work = prepare_builtin(model, train_set, val_set, loss_fn, data=data, image_size=image_size, recipe=recipe,
                           device=device, mean=mean, std=std, nproc=nproc, task=task)
    plan = plan_rungs(work.base, rungs, mode, amp_dtype, work.dev, work.job.task)
    work.mark_effects(plan)
    settings = {**work.settings, "mode": mode, "repeats": repeats, "noise_seeds": noise_seeds, "nproc": nproc,
                "budget": dataclasses.asdict(budget), "min_effect": min_effect,
                "rungs": {r.name: r.recipe.to_dict() for r in plan if r.status != "no-effect"}}
    return run_ladder(plan, work.launcher(), settings, out, work.dev, repeats=repeats, noise_seeds=noise_seeds,
                      budget=budget, min_effect=min_effect, mode=mode, resume=resume, rung_timeout=rung_timeout,
                      show=show, flops_per_sample=work.flops_per_sample, settle_within_s=settle_within_s)


@dataclass
class Builtin:
    """The built-in run's model and data, loaded and checked once in the parent (prepare_builtin), and what
    starts one run of it: a process forked from the warm fork server (rung_context) running _rung_main."""
    job: Job
    dev: torch.device
    base: Recipe                         # the recipe with num_workers="auto" resolved
    split: Any
    probe_model: torch.nn.Module
    flops_per_sample: float | None
    settings: dict[str, Any]
    task: Any                            # tasks/: judges which switches can act on its model and data

    def mark_effects(self, plan: list[Rung]) -> None:
        """Rungs whose switches cannot act on this device, model or data are not run (no-effect, with why);
        the decode cache rung's cache is built once here, opened by the rungs."""
        for rung in plan[1:]:
            if rung.status == "no-effect":          # ruled out when planned (plan_rungs: a slow half type)
                continue
            effect = changes_effect(rung.changes, self.dev, self.probe_model, self.split, self.task.field_effect)
            rung.effect, rung.reason = effect.label, effect.reason
            if not effect.acts:
                rung.status = "no-effect"
        if any(r.recipe.decode_cache and r.status != "no-effect" for r in plan):
            with_decode_cache(self.split, self.base.replace(decode_cache=True))

    @staticmethod
    def metric(measure: str = "speed", name: str | None = None, goal: str | None = None) -> tuple[str, str]:
        """A built-in run is always trained to its end and evaluated (and timed on the way): its accuracy."""
        return ("accuracy", "max")

    @staticmethod
    def after_run(plan: list[Rung]) -> None:
        """Nothing a run can reveal changes the plan: the model and data were checked in the parent."""
        return None

    def launcher(self, measure: str = "speed") -> Callable:
        """One forked run of the built-in job; `measure` is CommandWork's (a built-in run is timed, then
        continued to the end of its epochs for accuracy, either way)."""
        ctx, job = rung_context(), self.job

        def launch(rung: Rung, recipe: Recipe, run_budget: TimingBudget | None, run_dir: Path, display, limit):
            return run_supervised(ctx, _rung_main, (job, recipe, run_budget),
                                  on_event=lambda e: display.progress(rung, e), log_path=run_dir / "log.txt",
                                  time_limit_s=limit)
        return launch


def prepare_builtin(model, train_set=None, val_set=None, loss_fn=None, *, data: str | None = None,
                    image_size: int | None = None, recipe: Recipe | None = None, device: str = "auto", mean=None,
                    std=None, nproc: int = 1, task: str | None = None) -> Builtin:
    """Everything the built-in runs need, checked here, before the first run starts."""
    from .tasks import build_task, infer_task
    from .trainer import as_split

    start_rung_server()
    name = infer_task(task, model, train_set)
    work = build_task(name, loss_fn)
    base = recipe or Recipe()
    dev = resolve_device(device)
    validate_for_device(base, dev)
    work.validate(base)
    if isinstance(model, str):
        work.check_model(model)
    data = data or work.default_data
    split = as_split(train_set, val_set, mean=mean, std=std) if train_set is not None else work.load_data(data, image_size)
    # num_workers="auto" is measured once, here: every rung then runs with the same worker count, so the
    # differences between rungs come from their techniques, not from a noisy per-rung choice.
    base = work.resolve_workers(base, split, dev)
    probe_model = work.build_model(model, split) if isinstance(model, str) else model()
    flops_per_sample = work.flops_per_sample(probe_model, split, base)
    # The rungs get the loaded split itself (a spawned process receives its tensors through shared memory),
    # not the spec to load again: loading the built-in data costs each process more than its training.
    job = Job(model, split, split.image_size or image_size, loss_fn, device, nproc, name)
    settings = {"model": model if isinstance(model, str) else getattr(model, "__qualname__", repr(model)),
                "data": data if train_set is None else split.name, "image_size": split.image_size or image_size,
                "device": str(dev), "task": name, "metric_name": work.metric_name, "metric_label": work.metric_label}
    return Builtin(job, dev, base, split, probe_model, flops_per_sample, settings, work)


@dataclass
class CommandWork:
    """A user's training command (launch.py) as the ablation's and the search's work: what starts one run of it
    (the command with the run's switches in TRAINFAST_RECIPE, timed by the probe in it, probe.py) and what
    the first run tells about it. Checked (check_command) before the first run starts."""
    cmd: Any                             # launch.Command
    dev: torch.device
    base: Recipe
    switched: list[str]                  # the Recipe fields any run may switch (plus the seed)
    budget: TimingBudget
    settings: dict[str, Any]
    flops_per_sample: float | None = None     # the script's model is not known here

    def fields(self, recipe: Recipe) -> dict[str, Any]:
        """What reaches the script: only the switched fields, so its own settings (grad_accum_steps,
        log_every...) stand and the baseline turns off whatever the script turned on."""
        values = recipe.to_dict()
        return {k: values[k] for k in self.switched}

    def mark_effects(self, plan: list[Rung]) -> None:
        """What the device alone rules out (the script's model and data are not known before it runs)."""
        for rung in plan[1:]:
            if rung.status == "no-effect":          # ruled out when planned (plan_rungs: a slow half type)
                continue
            effect = changes_effect(rung.changes, self.dev, None)
            rung.effect, rung.reason = effect.label, effect.reason
            if not effect.acts:
                rung.status = "no-effect"

    def launcher(self, measure: str) -> Callable:
        """measure "speed": a run stops once warm-up and the timing budget are timed; "full": it runs to its
        end (the metric it reports is compared). A run without a budget (a baseline noise seed) is full."""
        from .launch import command_main, run_environment
        from .probe import MeasureSpec

        def launch(rung: Rung, recipe: Recipe, run_budget: TimingBudget | None, run_dir: Path, display, limit):
            spec = MeasureSpec(str((run_dir / "result.json").resolve()), measure if run_budget else "full",
                               **dataclasses.asdict(self.budget))
            env = run_environment(self.fields(recipe), spec)
            argv = self.cmd.launch_argv()
            _atomic_write(run_dir / "command.json", {"argv": argv, "env": env, "cwd": os.getcwd()})
            return run_supervised(rung_context(), command_main, (argv, env, str(run_dir)),
                                  log_path=run_dir / "log.txt", time_limit_s=limit)
        return launch

    @staticmethod
    def metric(measure: str, name: str | None, goal: str | None) -> tuple[str | None, str | None]:
        """What run_ladder compares with the baseline's band: in full mode the value the script reports with
        tf.report (the first one unless named); in speed mode nothing (the runs stop before the end)."""
        return (name or FIRST_REPORTED, goal) if measure == "full" else (None, None)

    @staticmethod
    def after_run(plan: list[Rung]) -> Callable[[Rung, dict], None]:
        """The baseline tells whether the script uses a Session; without one no switch can reach it."""
        from .report import NO_SESSION

        def after(rung: Rung, result: dict[str, Any]) -> None:
            if rung is plan[0] and "error" not in result and not result.get("session", True):
                for other in plan[1:]:
                    other.status, other.effect = "no-effect", NO_SESSION
                    other.reason = "the script does not use trainfast.Session, so the recipe cannot reach it"
        return after


def prepare_command(command: Sequence[str], plan_changes: list[dict[str, Any]], *, recipe: Recipe | None,
                    device: str, nproc: int, measure: str, budget: TimingBudget) -> CommandWork:
    """The command checked before any run (empty, not on PATH, a missing script, a Python that cannot import
    trainfast), and the fields its runs may switch: every field some candidate changes."""
    from .launch import Command, check_command

    start_rung_server()
    cmd = Command(tuple(command), nproc, measure)
    check_command(cmd)
    switched = sorted({k for changes in plan_changes for k in changes} | {"seed"})
    settings = {"command": list(cmd.argv), "nproc": nproc, "cwd": os.getcwd()}
    return CommandWork(cmd, resolve_device(device), recipe or Recipe(), switched, budget, settings)


def ablate_command(command: Sequence[str], *, recipe: Recipe | None = None, rungs: list[str] | None = None,
                   mode: str = "cumulative", amp_dtype: str = "auto", device: str = "auto",
                   out: str | Path | None = None, measure: str = "speed", metric: str | None = None,
                   goal: str | None = None, noise_seeds: int = 3, repeats: int = 3,
                   budget: TimingBudget | None = None, min_effect: float = MIN_EFFECT, resume: bool = False,
                   rung_timeout: float | None = None, show: bool = True, nproc: int = 1,
                   settle_within_s: float | None = SETTLE_WITHIN_S) -> AblationResult:
    """`trainfast ablate -- COMMAND`: the ladder on a user's own training command (CommandWork). Every run
    starts the command with the rung's switches in TRAINFAST_RECIPE; the probe in it (probe.py) times its
    steps and writes the result. `measure="speed"`: each run stops once warm-up plus the timing budget is
    timed. `measure="full"`: each runs to its end and the metric it reports with `tf.report` (`metric`,
    default the first one reported; `goal` "max" or "min", default "min" for names with loss/error in them)
    is compared with the baseline's noise band, as the built-in ablation compares accuracy. A command that
    never creates a trainfast.Session is measured too (steps/s from the global optimizer hook); every other
    rung is then reported as having no effect on it. The other arguments are ablate()'s."""
    base = recipe or Recipe()
    budget = budget or TimingBudget()
    check_counts(noise_seeds=noise_seeds, repeats=repeats, nproc=nproc, rung_timeout=rung_timeout, min_effect=min_effect)
    check_measure(measure, goal)
    dev = resolve_device(device)
    plan = plan_rungs(base, rungs, mode, amp_dtype, dev)
    work = prepare_command(command, [r.changes for r in plan], recipe=base, device=device, nproc=nproc,
                           measure=measure, budget=budget)
    work.mark_effects(plan)
    noise_seeds = noise_seeds if measure == "full" else repeats
    settings = {**work.settings, "measure": measure, "metric": {"name": metric, "goal": goal}, "mode": mode,
                "repeats": repeats, "noise_seeds": noise_seeds, "device": str(dev),
                "budget": dataclasses.asdict(budget), "min_effect": min_effect,
                "rungs": {r.name: work.fields(r.recipe) for r in plan if r.status != "no-effect"}}
    return run_ladder(plan, work.launcher(measure), settings, out, dev, repeats=repeats, noise_seeds=noise_seeds,
                      budget=budget, min_effect=min_effect, mode=mode, resume=resume, rung_timeout=rung_timeout,
                      show=show, after_run=work.after_run(plan), metric=work.metric(measure, metric, goal),
                      settle_within_s=settle_within_s)


def check_measure(measure: str, goal: str | None) -> None:
    from .probe import MODES

    if measure not in MODES:
        raise RecipeError(f"--measure {measure!r} is not one of {', '.join(MODES)}")
    if goal not in (None, "max", "min"):
        raise RecipeError(f"--metric-goal {goal!r} must be max or min")


def check_counts(*, noise_seeds: int, repeats: int, nproc: int, rung_timeout: float | None, min_effect: float) -> None:
    for flag, value in (("--noise-seeds", noise_seeds), ("--repeats", repeats), ("--nproc", nproc)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise RecipeError(f"{flag} {value!r} must be a positive integer")
    if rung_timeout is not None and not rung_timeout > 0:
        raise RecipeError(f"--rung-timeout {rung_timeout!r} must be a positive number of seconds")
    if not 0 <= min_effect < 1:
        raise RecipeError(f"--min-effect {min_effect!r} must be a fraction in [0, 1), e.g. 0.05 for 5%")


def run_ladder(plan: list[Rung], launch: Callable, settings: dict[str, Any], out: str | Path | None,
               dev: torch.device, *, repeats: int, noise_seeds: int, budget: TimingBudget, min_effect: float,
               mode: str, resume: bool, rung_timeout: float | None, show: bool, flops_per_sample: float | None = None,
               after_run: Callable[[Rung, dict], None] | None = None,
               metric: tuple[str | None, str | None] = ("accuracy", "max"),
               time_budget_s: float | None = None, settle_within_s: float | None = None) -> AblationResult:
    """The one ablation loop, for the built-in run and a user's command alike: the interleaved runs, each
    started by `launch(rung, recipe, budget or None, run_dir, display, time_limit)` and returning the probe's
    result (or {"error", "log_tail"}), kept in the RunStore, scored after every run, then the report.

    `time_budget_s`: the seconds the whole ladder may take. The first run (the baseline's) prices a run; the
    plan is then cut to fit (fit_to_budget: fewer repeats first, then the last rungs, marked "skipped" with
    the reason) and the cut is kept in the result's settings ("budget_cut").

    `settle_within_s`: after the planned passes, while some verdict is one a rerun may not repeat (marked ?:
    a difference near the threshold at this noise) or unresolved (`unresolved`: an estimate of at least
    min_effect called "no measurable difference") and another pass, priced by the last one, still ends
    within this many seconds of the ladder's start, every rung runs once more (at most MAX_REPEATS in all).
    More passes shrink the interval where it matters, so two runs of the same command agree more often; the
    passes added and why are kept in the settings ("settle")."""
    from .report import Display, environment, write_report

    out_dir = Path(out) if out is not None else default_out_dir()
    store = RunStore(out_dir, settings, resume)
    wait_rung_server()
    ceilings = {p: measure_ceiling(dev, DTYPES[p])
                for p in dict.fromkeys(r.recipe.precision for r in plan if r.status != "no-effect")}
    env = environment(dev)
    display = Display(plan, ceilings, env, show=show, settings=settings)
    measured = [r for r in plan if r.status != "no-effect"]
    # Interleaved: repeat 0 of every rung, then repeat 1 of every rung, ...; the baseline's extra seeds last.
    runs = [(rung, i, budget) for i in range(repeats) for rung in measured]
    runs += [(plan[0], i, None) for i in range(repeats, noise_seeds)]
    seed_runs: list[dict[str, Any]] = []
    started, cut = time.monotonic(), None
    pass_times: dict[int, list[float]] = {}        # repeat index -> [start, end] of that pass's timed runs
    next_index, added = max(repeats, noise_seeds), []

    def rescore() -> None:
        seed_runs[:] = [_seed_summary(r, metric[0]) for r in plan[0].repeats + plan[0].seed_runs]
        score_rungs(plan, ceilings, [s["accuracy"] for s in seed_runs], flops_per_sample, mode, min_effect, metric)

    def limit(baseline: Rung) -> float | None:
        """--rung-timeout, or by default 10x the baseline's first run (at least 5 minutes: compilation
        alone can take that); the first run itself is unlimited by default."""
        if rung_timeout is not None:
            return rung_timeout
        walls = [r["wall_time_s"] for r in baseline.repeats if r.get("wall_time_s")]
        return max(300.0, 10 * walls[0]) if walls else None

    def another_pass() -> list[tuple[Rung, int, TimingBudget]]:
        """One more pass of every measured rung, if a verdict is unsettled or a gain unresolved and the pass
        fits settle_within_s."""
        nonlocal repeats, next_index
        shaky = [r.name for r in plan[1:] if r.status in ("done", "partial")
                 and (unsettled(r) or unresolved(r, min_effect))]
        if not settle_within_s or trimmed(cut) or not shaky or repeats >= MAX_REPEATS or not pass_times:
            return []
        first, last = pass_times[max(pass_times)]
        if time.monotonic() - started + (last - first) > settle_within_s:
            return []
        added.append({"repeat": repeats + 1, "unsettled": shaky, "pass_s": last - first})
        repeats += 1
        extra = [(r, next_index, budget) for r in measured if r.status in ("done", "partial")]
        for r, _, _ in extra:
            r.status = "partial"
        next_index += 1
        return extra

    interrupted = False
    with display:
        try:
            while runs or (runs := another_pass()):
                rung, i, rung_budget = runs.pop(0)
                if rung.status in ("no-effect", "skipped"):     # no-effect: found out by an earlier run
                    continue
                recipe_i = rung.recipe.replace(seed=rung.recipe.seed + i)
                key = f"{rung.name}-r{i}"
                result = store.load(key)
                timed = rung_budget is not None          # a timed repeat; else a baseline's accuracy-only seed
                if timed:
                    pass_times.setdefault(i, [time.monotonic(), 0.0])
                if result is None:
                    rung.status = "running"
                    display.start_rung(rung, recipe_i.seed, len(rung.repeats) + 1 if timed else i + 1,
                                       repeats if timed else noise_seeds)
                    run_dir = out_dir / "rungs" / key
                    run_dir.mkdir(parents=True, exist_ok=True)
                    _atomic_write(run_dir / "recipe.json", recipe_i.to_dict())
                    result = launch(rung, recipe_i, rung_budget, run_dir, display, limit(plan[0]))
                    if "error" not in result:
                        store.save(key, result)
                else:
                    display.reused(rung, i)
                if "error" in result:
                    rung.status = "failed"
                    rung.result = {"error": result["error"], "log_tail": result.get("log_tail", "")}
                    rung.repeats.clear()
                elif rung.status != "failed":
                    (rung.repeats if timed else rung.seed_runs).append(result)
                    rung.status = "done" if len(rung.repeats) == repeats else "partial"
                if timed:
                    pass_times[i][1] = time.monotonic()
                if after_run is not None:
                    after_run(rung, result)
                if time_budget_s is not None and cut is None and "error" not in result:
                    # Priced by the first run (the baseline's, fp32: usually the slowest), whole-process wall.
                    per_run = max(time.monotonic() - started, result.get("wall_time_s") or 0.0)
                    rungs_kept, repeats_kept = fit_to_budget(len(measured), repeats, per_run,
                                                             time_budget_s - (time.monotonic() - started))
                    cut = {"seconds_per_run": per_run, "rungs": rungs_kept, "repeats": repeats_kept,
                           "asked": {"rungs": len(measured), "repeats": repeats},
                           "skipped": [r.name for r in measured[rungs_kept:]]}
                    for skipped in measured[rungs_kept:]:
                        skipped.status = "skipped"
                        skipped.reason = (f"would not fit the time budget ({time_budget_s:.0f} s at ~{per_run:.0f} s "
                                          f"a run, {repeats_kept} repeats)")
                    repeats = noise_seeds = repeats_kept
                    runs[:] = [(r, j, b) for r, j, b in runs if j < repeats_kept and r.status != "skipped"]
                rescore()
                display.update()
        except KeyboardInterrupt:
            interrupted = True
        # The ceiling is a peak: measured again after the ladder and the higher kept, so a slow spell on a
        # shared machine at the start does not put rungs "above" it.
        if not interrupted:
            ceilings.update({p: max(c, measure_ceiling(dev, DTYPES[p])) for p, c in ceilings.items()})
        for rung in plan:
            if rung.status == "partial" and interrupted:
                rung.status = "done"            # a partial report still shows what was measured
        rescore()
    best, tie, odds = pick_best(plan, min_effect)
    if cut is not None:
        settings = {**settings, "repeats": repeats, "noise_seeds": noise_seeds, "budget_cut": cut}
    if added:
        settings = {**settings, "repeats": repeats, "settle": {"within_s": settle_within_s, "passes": added}}
    result = AblationResult(plan, env, out_dir, best.recipe, best.name, ceilings, seed_runs, tie, settings, odds)
    write_report(result)
    display.final(result, interrupted)
    if interrupted:
        raise KeyboardInterrupt
    return result


def trimmed(cut: dict[str, Any] | None) -> bool:
    """Whether the time budget cut the ladder's plan (fewer repeats or rungs than asked): no pass is added to
    a ladder that could not even fit the passes it asked for."""
    return cut is not None and bool(cut["skipped"] or cut["repeats"] < cut["asked"]["repeats"])


def unsettled(rung: Rung) -> bool:
    """A verdict of this rung (against the baseline or the rung above) that a rerun may not repeat (marked ?):
    what --settle-within adds passes for and the report lists."""
    r = rung.result
    return bool(r.get("verdict")) and (not r.get("firm", True) or not (r.get("vs_previous") or {}).get("firm", True))


def unresolved(rung: Rung, min_effect: float = MIN_EFFECT) -> bool:
    """A difference this run estimated at min_effect or more (against the baseline or the rung above) that it
    called "no measurable difference": a real gain of that size too small for this run's noise. A quieter
    run of the same command resolves it and calls it faster, so with time left --settle-within spends it
    here too (a noisy run otherwise stops early on firm-looking "no difference" calls a quiet run contradicts)."""
    r = rung.result
    line = math.log1p(min_effect)
    return any(v and v.get("verdict") == SAME and v.get("speedup") and abs(math.log(v["speedup"])) >= line
               for v in (r, r.get("vs_previous")))


def fit_to_budget(rungs: int, repeats: int, per_run: float, seconds_left: float) -> tuple[int, int]:
    """How many rungs (the plan's first ones, baseline included) and repeats fit `seconds_left` at `per_run`
    seconds a run, one run (the first) already done. Repeats go first, down to 2 (the fewest that give a
    process-to-process spread, so an interval); then the last rungs, down to 2 (a baseline and one rung).
    The plan's order is its priority: the precision levels, the largest gains, come first. Two rungs get 3
    repeats, not 2, when that many are asked for: at 2 the interval has one degree of freedom and no verdict."""
    floor = min(repeats, 2)
    runs_left = 1 + max(0.0, seconds_left) / max(per_run, 1e-9)      # the runs the budget pays for, the first included
    fitted = max(floor, min(repeats, int(runs_left // rungs)))
    if rungs * fitted <= runs_left:
        return rungs, fitted
    kept = min(rungs, max(2, int(runs_left // fitted)))
    if kept == 2 and fitted == 2:
        # Two rungs twice leave the pooled noise one degree of freedom (t = 12.7 at 95%): even a 2x gain at 7%
        # noise is "no measurable difference". A third repeat (two degrees, t = 4.3) is what a verdict needs.
        fitted = min(repeats, 3)
    return kept, fitted


def rung_context():
    """Where rung processes come from: a fork server that has imported torch and trainfast once (about 3 s
    a process on 2 cores, more than a small rung's training), forking a fresh process per rung. The server
    never runs a model, so nothing but imported code is shared: no compile cache, allocator or thread pool.
    Spawn where fork servers are not available (not POSIX)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch.optim", "trainfast.ablate", "trainfast.trainer",
                                "trainfast.engine", "trainfast.models"])
    return ctx


def start_rung_server() -> None:
    """Start the fork server's imports now, in the background, so they overlap the parent's own preparation
    (loading the data, counting FLOPs: ~5 s each on 2 cores) instead of delaying the first run."""
    if rung_context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def wait_rung_server() -> None:
    """Block until the fork server has finished importing (it answers a fork only then): the matmul peak and
    the runs are not timed while it still loads on one of the cores. (plan_rungs' slow-half probe may run
    beside it: one thread on the other core, and it judges a ratio of two dtypes, not a rate.)"""
    ctx = rung_context()
    if ctx.get_start_method() == "forkserver":
        idle = ctx.Process(target=int, daemon=True)
        idle.start()
        idle.join()


def count_flops_per_sample(model: torch.nn.Module, loss_fn: Callable | None, split, recipe: Recipe) -> float | None:
    """Model FLOPs of one training sample (forward + backward), counted once in the parent on a batch of
    two (FLOPs scale with the batch; memory format and precision do not change the count)."""
    from torch import nn

    sample = first_readable(split.train)
    batch = 2
    probe = torch.zeros((batch, *sample.shape))
    targets = torch.zeros(batch, dtype=torch.long)
    try:
        return count_train_flops(model, loss_fn or nn.CrossEntropyLoss(), probe, targets) / batch
    except Exception:           # a model the counter cannot trace still gets every other number
        return None


class RunStore:
    """One JSON file per finished run (rung x repeat) in `out/runs/`, written atomically, plus the plan
    (`out/plan.json`). With resume, a finished run is read back instead of run again; a plan that differs
    from the folder's is refused with the differences named, never mixed."""

    def __init__(self, out_dir: Path, settings: dict[str, Any], resume: bool) -> None:
        import json

        self.dir = out_dir / "runs"
        plan_path = out_dir / "plan.json"
        if plan_path.exists():
            if not resume:
                raise RecipeError(f"{out_dir} already holds an ablation: pass --resume to continue it, or "
                                  "choose another --out")
            old = json.loads(plan_path.read_text())
            diff = [k for k in sorted(set(old) | set(settings)) if old.get(k) != _jsonable(settings.get(k))]
            if diff:
                raise RecipeError(f"--resume: the plan in {plan_path} differs from this command in "
                                  + "; ".join(f"{k}: {old.get(k)!r} there, {_jsonable(settings.get(k))!r} here"
                                              for k in diff))
        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(plan_path, settings)
        self.resume = resume

    def load(self, key: str) -> dict[str, Any] | None:
        import json

        path = self.dir / f"{key}.json"
        if not self.resume or not path.exists():
            return None
        result = json.loads(path.read_text())
        result["reused"] = True
        return result

    def save(self, key: str, result: dict[str, Any]) -> None:
        _atomic_write(self.dir / f"{key}.json", result)


def _jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, default=str))


def _atomic_write(path: Path, data: Any) -> None:
    import json

    from .checkpoint import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=1, default=str))


def _seed_summary(result: dict[str, Any], metric: str | None) -> dict[str, Any]:
    return {**{k: result.get(k) for k in ("seed", "loss", "throughput")}, "accuracy": run_metric(result, metric)}


def run_metric(result: dict[str, Any], metric: str | None) -> float | None:
    """The number a run is judged on for accuracy: the built-in run's held-out accuracy, or what a user's
    script reported under `metric` (FIRST_REPORTED: the first thing it reported); None for no metric (speed
    mode: its runs stop at different points, so what they reported is not comparable)."""
    reported = result.get("reported") or {}
    if metric is None:
        return None
    if metric == FIRST_REPORTED:
        metric = next(iter(reported), None)
    value = reported.get(metric, result.get(metric)) if metric is not None else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
