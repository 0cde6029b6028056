"""What every check reads and returns: the run's Observations and one Finding; the thresholds the verdicts draw
their lines at, kept in one table so that two checks judging the same wait or the same share of a step draw the
same line; and the number formats of the evidence."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

# Thresholds, and why:
MATERIAL_SHARE = 0.05   # a cause is worth a fix when it costs >= 5% of the step: the ablation's smallest
                        # effect it calls a gain (ablate --min-effect), below it the machine's noise wins
INPUT_BOUND_SHARE = 0.20  # "input-bound": the loop waits for data >= 20% of each step (the ablation report's note uses
                          # the same line), and the cached-batch replay confirms the loop runs faster without it
SYNCS_PER_STEP = 0.5    # a read every other step or more often is a per-step read; trainfast's own Meter
                        # reads once every log_every steps (0.2 per step at the default 10)
LAUNCH_BOUND_BUSY = 0.5  # CUDA: the device computes < 50% of the step while the loop is not waiting for data
NEAR_ROOF = 0.5          # a loop at half its dtype's matmul peak or more is compute-bound: a higher roof pays there
HALF_ROOF = 1.5          # a half type's peak must be this much above fp32's to be named (AMX/AVX512-BF16: 2-6x)
FAULTS_PER_STEP = 10_000  # page faults a step must take before they are blamed: 40 MB of fresh 4 KiB pages a step
                          # is memory churn (a ResNet-18 step at 128 px, batch 128: ~130,000); a loader's batch
                          # mapped from shared memory is a few thousand and no allocator setting removes it
FAULTS_MARGIN = 1.5       # a page-fault verdict is a "problem" only this far above both of its lines (faults and
                          # share); between the lines and the margin it is "measured": a step's count moves from run
                          # to run (pytorch/examples' mnist once read 10,936 against 10,000 and flipped a verdict)
SHARED_CORES = 0.5      # other processes busy on half a core or more while the steps were timed: torch's threads
                        # each wait for the slowest at every parallel region (a step 50x slower was seen on 2
                        # cores), so step times and the timed findings are a shared machine's
VARYING_SHAPES = 2      # distinct input shapes tolerated under cudnn.benchmark (full batches + the last one)

NOT_HERE = "not checked here"
SWITCH = "switch"       # a built-in switch trainfast could apply to the loop as it is (checks/switches.py)


@dataclass
class Finding:
    name: str
    group: str                 # environment | time | mistake
    status: str                # problem | fine | measured | not checked here
    evidence: str
    cost_s: float | None = None      # seconds per step the fix would save (measured), when known
    share: float | None = None       # cost_s over the mean step time
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Observations:
    """Everything the doctor measured in one run (JSON-serializable: a script's run writes it to a file)."""
    source: str                              # "built-in" | "own loop"
    device: str
    env: dict[str, Any]
    steps_run: int = 0
    warmup_steps: int = 0
    step_seconds: list[float] = field(default_factory=list)      # steady steps, after warm-up
    data_wait_s: list[float] | None = None   # per steady step; None: the loop's loader is not trainfast's
    samples: list[int] | None = None
    sample_unit: str = "samples"             # what `samples` counts: "tokens" for a loop fed token ids (real tokens)
    replay_step_seconds: list[float] | None = None   # one cached batch, no loader; None: not run
    other_cores: float | None = None         # cores' worth of CPU other processes used while the steps were timed
    cpus: int = 1                            # the CPUs this process may run on
    threads: int = 1                         # torch's intra-op threads
    handoff_s: float | None = None           # what a loader worker would add to the training process per batch
                                             # (doctor.worker_handoff_s); None: not measured
    sync_steps: int = 0
    syncs: list[dict[str, Any]] = field(default_factory=list)    # SyncCounter.by_line()
    shapes: list[list] = field(default_factory=list)
    eval_forwards: int = 0
    eval_graph: dict[str, int] = field(default_factory=dict)
    dropout: dict[str, Any] | None = None
    train_mode_eval: dict[str, Any] | None = None   # grad-free forwards left in training mode (Watch.train_mode_check)
    eval_wait: dict[str, Any] | None = None         # how the watch came to the evaluation (Watch.wait_record)
    grads: list[str] = field(default_factory=list)  # per step: what zero_grad left when the next gradients came
    zero_grad_calls: list[dict[str, Any]] = field(default_factory=list)   # Watch.zero_grad_lines()
    zero_grad_s: float | None = None
    recipe_flags: bool = True                # the built-in run: a fix can be a Recipe flag (--set-to-none)
    data_parallel: bool = False
    num_workers: int | None = None
    cudnn_benchmark: bool = False
    flops_per_sample: float | None = None
    ceiling_flops: float | None = None
    ceiling_dtype: str | None = None
    # An fp32 loop on hardware with a fast half type: (its name, its measured matmul peak), the higher roof
    # mixed precision would give; None otherwise.
    half_ceiling: tuple[str, float] | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    compiled: bool = False
    ranks: dict[str, Any] | None = None      # several ranks: each one's own figures, judged (measure/ranks.py)
    compile: dict[str, Any] | None = None
    recompiles: int | None = None
    cuda_profile: dict[str, Any] | None = None
    step_faults: list[int] | None = None      # per steady step: page faults of the training process
    step_kernel_s: list[float] | None = None  # per steady step: its kernel (system) seconds, all threads
    step_cpu_s: list[float] | None = None     # per steady step: its CPU seconds (user + kernel), all threads
    fault_source: str = ""                    # which steps those were ("the cached-batch replay", "the loop's")
    reuse_memory: dict[str, Any] = field(default_factory=dict)   # {"in_effect": bool, "unavailable": str | None}
    command: list[str] | None = None          # `doctor -- COMMAND`: the user's command, for fixes that name it
    text: dict[str, Any] | None = None        # a language model's padding and attention (doctor/text.py)
    # A script's run: what it was seen doing (probe/observe.py's section, and "refusal": why no model switch could
    # reach it); the switches it could take are named from it (checks/switches.py)
    observed: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    # Medians, not means: on a shared machine a step that another process slowed down (often several times
    # over) must not move the verdicts; the same command run twice must give the same ones.
    @property
    def step_s(self) -> float | None:
        return statistics.median(self.step_seconds) if self.step_seconds else None

    @property
    def wait_s(self) -> float | None:
        return statistics.median(self.data_wait_s) if self.data_wait_s else None

    @property
    def wait_share(self) -> float | None:
        """The share of a typical step spent waiting for its batch: the median over steps of wait / step."""
        shares = [w / s for w, s in zip(self.data_wait_s or [], self.step_seconds) if s > 0]
        return statistics.median(shares) if shares else None

    @property
    def replay_s(self) -> float | None:
        return statistics.median(self.replay_step_seconds) if self.replay_step_seconds else None

    @property
    def replay_gain(self) -> float | None:
        """The measured bound on what a faster loader could buy: 1 - replayed step / real step (medians)."""
        if not self.replay_step_seconds or not self.step_seconds:
            return None
        return 1 - self.replay_s / self.step_s

    @property
    def busy_share(self) -> float | None:
        """CUDA: the share of a step the device spends in kernels (profiled kernel time / median step time)."""
        kernel = (self.cuda_profile or {}).get("kernel_s_per_step")
        return min(1.0, kernel / self.step_s) if kernel is not None and self.step_s else None

    def user_syncs(self) -> list[dict[str, Any]]:
        return [s for s in self.syncs if not s["trainfast"]]


def ms(seconds: float) -> str:
    millis = seconds * 1e3
    return f"{millis:.0f} ms" if millis >= 100 else f"{millis:.3g} ms"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def sig(x: float) -> str:
    """Three significant digits for a small number (a tiny MLP's 0.0123 MFLOP), thousands separated for a big one."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def pct3(x: float) -> str:
    """A share that may be far below 1% (a tiny model's share of the matmul peak) and must not read 0%."""
    return f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.2g}%"
