"""The typed records of an ablation: a rung, what its runs measured, and the whole ladder's result.

The ablation fills them (ablation/), the report and the search read them (report/, tune/); results.json is
their serialization (`Rung.to_dict`, `AblationResult.to_dict`). A run's own record (what one process measured,
`Rung.repeats`) stays the probe's JSON as written to the run folder, so an interrupted ablation resumes from
those files whatever version wrote the rest.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from .recipe import Recipe

# 3: every rung carries every result key (null when not measured); status/effect enumerated. 4: each rung's judged
# metric as `metric` ({"name", "goal", "value"}; `accuracy` still holds its value) and the unit its rate counts.
# 5: the judged metric's numbers are `metric_*` (`accuracy*` held a validation loss or an mAP as well): a rung's
# metric_values, metric_reference, metric_delta, metric_band, metric_flag, metric_worse; a baseline seed's `metric`.
# 6: a script's observed section names its optimizer's implementation `optimizer_implementation` (what the run did),
# no longer by the switch's field.
SCHEMA_VERSION = 6


class Status(str, Enum):
    """Where a rung stands. A str, so it compares with and serializes to its value."""
    PENDING = "pending"          # planned, no run finished yet
    RUNNING = "running"          # a run of it is in progress
    PARTIAL = "partial"          # some of its repeats finished
    DONE = "done"                # every planned repeat finished
    NO_EFFECT = "no-effect"      # not run: its switches cannot act here (the effect says why)
    FAILED = "failed"            # a run failed; its error and log tail are in the result
    SKIPPED = "skipped"          # not run: it did not fit the time budget

    def __str__(self) -> str:
        return self.value


class EffectLabel(str, Enum):
    """What the rung's switches can do here, decided before it runs."""
    MEASURED = "measured"                # they act: the rung is run and timed
    NO_EFFECT = "no-effect"              # this device ignores them (non_blocking on a CPU)
    NOT_APPLICABLE = "not-applicable"    # the task's model or data has nothing for them to act on
    SLOW_HALF = "slower here"            # a half type without fast kernels on this device: shown, not run
    NO_SESSION = "no-session"            # the measured script never creates a trainfast.Session
    NOT_APPLIED = "not-applied"          # the run's framework did not end up with the switch (read back)

    def __str__(self) -> str:
        return self.value


@dataclass
class RungResult:
    """A rung's numbers over its repeats (ablation.scoring fills it). None: not measured for this rung."""
    # what every run shares (from the first)
    val_samples: int | None = None
    world_size: int | None = None
    num_workers: int | None = None
    precision_state: dict[str, Any] | None = None
    train_losses: list[float] | None = None
    rate_unit: str | None = None             # "samples/s", "tokens/s", "images/s", "steps/s"
    unit: str | None = None                  # what the rate counts: "samples", "tokens", "images", "steps"
    session: bool | None = None              # a script's runs: whether it created a trainfast.Session
    compile: dict[str, Any] | None = None    # torch.compile's counters in the run
    overridden: dict[str, Any] | None = None  # script settings the rung's recipe replaced: field -> [old, new]
    observed: dict[str, Any] | None = None   # a script's runs: what its first run was seen doing (probe/observe.py)
    # aggregated over the repeats
    repeats: int = 0
    throughput: float | None = None
    throughput_interval: list[float] | None = None
    throughput_spread: float | None = None
    documents_per_s: float | None = None     # a token script's documents/s beside its tokens/s (mean over repeats)
    # The judged metric's value (classification accuracy, detection mAP, a language model's validation loss, a
    # script's): its name and goal are the ladder's (AblationResult.metric); every `metric_*` below is about it.
    metric: float | None = None
    metric_values: list[float] = field(default_factory=list)     # each run's, in the order of `repeats`
    loss: float | None = None
    train_loss: float | None = None
    epoch_time_s: float | None = None
    wall_s: float | None = None
    peak_memory_bytes: int | None = None
    data_wait_fraction: float | None = None  # of the timed steps: waiting for input (CUDA: the device idle for it)
    copy_fraction: float | None = None       # CUDA: the batches' copy and preparation on the compute stream
    ranks: dict[str, Any] | None = None      # several ranks: each one's figures over the repeats, the straggler
    step_alone: float | None = None          # the rung's step on a batch kept on the device (rung.time_step_alone)
    step_alone_speedup: float | None = None  # ... over the baseline's step alone
    epoch_of_step: float | None = None       # the timed rate over the step alone: how close the epoch is to its floor
    skipped_files: int | None = None
    host_decoded_files: int | None = None    # device_decode: images the workers or the host decoded instead
    host_decoded_named: list[str] = field(default_factory=list)   # the first few, each with its reason
    steps: int | None = None
    warmup_steps: list[int] = field(default_factory=list)
    disturbed_steps: list[int] = field(default_factory=list)
    timed_steps: list[int] = field(default_factory=list)
    timed_seconds: list[float] = field(default_factory=list)
    wall_time_s: list[float | None] = field(default_factory=list)
    # against the machine's ceiling
    flops_per_sample: float | None = None
    flops_per_s: float | None = None
    ceiling_flops_per_s: float | None = None
    ceiling_fraction: float | None = None
    # against the baseline (and, in a cumulative ladder, the rung above)
    speedup: float | None = None
    speedup_interval: list[float] | None = None
    verdict: str | None = None               # stats' FASTER / SLOWER / SAME, or "reference" for the baseline
    verdict_text: str | None = None
    agreement: float | None = None           # how often a rerun repeats the verdict
    firm: bool | None = None                 # agreement of at least stats.FIRM
    vs_previous: dict[str, Any] | None = None  # {"rung", "speedup", "interval", "verdict", "agreement", "firm", "text"}
    memory_ratio: float | None = None
    metric_reference: float | None = None    # the baseline: its mean over the noise seeds
    metric_delta: float | None = None
    metric_band: float | None = None
    metric_flag: bool | None = None          # outside the baseline's band
    metric_worse: bool | None = None         # ... on the wrong side
    noise: dict[str, Any] | None = None      # scoring.noise_summary
    # --target: time to target and its two factors against the baseline, with the verdict (ablation/target.py)
    to_target: dict[str, Any] | None = None
    # a failed rung
    error: str | None = None
    log_tail: str | None = None

    @property
    def is_firm(self) -> bool:
        """A verdict a rerun repeats (no verdict counts as firm: there is nothing to repeat)."""
        return self.firm is not False

    @property
    def unsettled(self) -> bool:
        """A verdict (against the baseline or the rung above) that a rerun may not repeat (marked ?): what
        settling adds passes for and the report lists."""
        return bool(self.verdict) and (not self.is_firm or not (self.vs_previous or {}).get("firm", True))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Rung:
    name: str
    changes: dict[str, Any]
    recipe: Recipe
    effect: EffectLabel = EffectLabel.MEASURED
    reason: str = ""
    result: RungResult = field(default_factory=RungResult)       # aggregated over repeats (ablation.scoring)
    status: Status = Status.PENDING
    repeats: list[dict[str, Any]] = field(default_factory=list)    # one probe record per timed process
    seed_runs: list[dict[str, Any]] = field(default_factory=list)  # baseline only: extra noise seeds
    # A rung of the user's own command (ablation/script_rungs.py): its own args and env, the command line and the
    # variables its runs had (cumulative: the rungs above included), and a note when its runs observed nothing new.
    script: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        """Done, or partly done: it has timed runs to judge."""
        return self.status in (Status.DONE, Status.PARTIAL)

    def rule_out(self, effect: EffectLabel, reason: str) -> None:
        """Not run: its switches cannot act here (or do worse than nothing); the report shows why."""
        self.status, self.effect, self.reason = Status.NO_EFFECT, effect, reason

    def fail(self, error: str, log_tail: str = "") -> None:
        self.status = Status.FAILED
        self.result = RungResult(error=error, log_tail=log_tail)
        self.repeats.clear()


@dataclass
class AblationResult:
    rungs: list[Rung]
    environment: dict[str, Any]
    out_dir: Path
    best: Recipe | None                  # None: no recommendation (the baseline has no finished run to compare with)
    best_name: str | None
    ceilings: dict[str, float]
    seed_runs: list[dict[str, Any]] = field(default_factory=list)
    tie: list[str] = field(default_factory=list)        # rungs not measurably different from the recommendation
    settings: dict[str, Any] = field(default_factory=dict)
    odds: dict[str, float] = field(default_factory=dict)    # how often a rerun would recommend each rung
    metric: dict[str, Any] | None = None     # the judged metric: {"name", "goal", "why"}; None when only timed

    @property
    def failed(self) -> bool:
        """Every run that was started failed: nothing was measured."""
        ran = [r for r in self.rungs if r.status not in (Status.NO_EFFECT, Status.SKIPPED, Status.PENDING)]
        return bool(ran) and all(r.status == Status.FAILED for r in ran)

    @property
    def no_recommendation(self) -> str | None:
        """Why nothing is recommended, or None when something is."""
        if self.best_name is not None:
            return None
        if self.failed:
            return "every run failed (the errors are in the notes and each run's log.txt)"
        if self.settings.get("memory_limit") and any(r.repeats for r in self.rungs):
            return (f"no measured rung fits the memory limit of {self.settings['memory_limit'] / 2**20:,.0f} MiB "
                    "(the Memory section gives each one's peak and what holds it)")
        return "the baseline has no finished run, so nothing could be compared with it"
