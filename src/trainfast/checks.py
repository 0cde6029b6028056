"""The doctor's checks: each one reads the run's Observations (what doctor.py measured) and returns one
Finding: a status, the evidence behind it, the time it costs per step where that was measured, and the one
fix (a Recipe flag where one exists). A check that cannot run on this device says "not checked here",
never "0 ms" or "fine".

Statuses: "problem" (fix it), "fine" (checked, nothing wrong), "measured" (a number to know, not a fault:
the compute rate, the memory headroom), "not checked here" (this device, this loop or this recipe cannot
show it; the evidence says why). Findings are ranked problems first, by the time their fix would save.
"""
from __future__ import annotations

import math
import shlex
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from .envcheck import smoke_failures, summary
from .techniques import memory_reuse

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
SHARED_CORES = 0.5      # other processes busy on half a core or more while the steps were timed: torch's threads
                        # each wait for the slowest at every parallel region (a step 50x slower was seen on 2
                        # cores), so step times and the timed findings are a shared machine's
VARYING_SHAPES = 2      # distinct input shapes tolerated under cudnn.benchmark (full batches + the last one)

NOT_HERE = "not checked here"


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
    compile: dict[str, Any] | None = None
    recompiles: int | None = None
    cuda_profile: dict[str, Any] | None = None
    step_faults: list[int] | None = None      # per steady step: page faults of the training process
    step_kernel_s: list[float] | None = None  # per steady step: its kernel (system) seconds, all threads
    step_cpu_s: list[float] | None = None     # per steady step: its CPU seconds (user + kernel), all threads
    fault_source: str = ""                    # which steps those were ("the cached-batch replay", "the loop's")
    reuse_memory: dict[str, Any] = field(default_factory=dict)   # {"in_effect": bool, "unavailable": str | None}
    command: list[str] | None = None          # `doctor -- COMMAND`: the user's command, for fixes that name it
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


CHECKS: list[Callable[[Observations], Finding]] = []


def check(fn: Callable[[Observations], Finding]) -> Callable[[Observations], Finding]:
    CHECKS.append(fn)
    return fn


def run_checks(obs: Observations) -> list[Finding]:
    return rank([fn(obs) for fn in CHECKS])


def rank(findings: list[Finding]) -> list[Finding]:
    """Problems first, the costliest first (unmeasured costs after measured ones), then the rest."""
    order = {"problem": 0, "measured": 1, "fine": 2, NOT_HERE: 3}
    return sorted(findings, key=lambda f: (order.get(f.status, 4), -(f.cost_s or 0.0), f.cost_s is None))


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _sig(x: float) -> str:
    """Three significant digits for a small number (a tiny MLP's 0.0123 MFLOP), thousands separated for a big one."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _pct3(x: float) -> str:
    """A share that may be far below 1% (a tiny model's share of the matmul peak) and must not read 0%."""
    return f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.2g}%"


# --- environment ------------------------------------------------------------------------------------

@check
def environment(obs: Observations) -> Finding:
    failures = smoke_failures(obs.env)
    text = summary(obs.env) + "; a tiny conv and matmul ran on " + ", ".join(s["device"] for s in obs.env["smoke"])
    if failures:
        return Finding("environment", "environment", "problem", text + ". Failed: " + "; ".join(failures),
                       fix="see the explanation of each failure")
    return Finding("environment", "environment", "fine", text + ": both correct")


@check
def other_processes(obs: Observations) -> Finding:
    name = "other processes on the cores"
    if obs.other_cores is None:
        return Finding(name, "environment", NOT_HERE, "this system's CPU counters could not be read, or no step was "
                       "timed")
    text = (f"other processes used {obs.other_cores:.1f} of the {obs.cpus} CPU(s) over the timed steps (at least "
            f"1 s; the loop's own threads and loader workers left out; torch runs {obs.threads} thread(s))")
    if obs.other_cores >= SHARED_CORES:
        free = max(1, obs.cpus - math.ceil(obs.other_cores))
        return Finding(name, "environment", "problem", text + ": each of torch's threads waits for the slowest at "
                       "every parallel region, so the step times, and every finding timed from them, are those of "
                       "a shared machine and may differ on a rerun",
                       fix="rerun when the machine is quiet, or leave torch the free cores: "
                           f"torch.set_num_threads({free})")
    return Finding(name, "environment", "fine", text)


# --- where the time goes ----------------------------------------------------------------------------

def bound(obs: Observations) -> str | None:
    """input-bound | compute-bound | launch-bound (CUDA profile), or None without a data wait to judge."""
    share, gain = obs.wait_share, obs.replay_gain
    if share is None:
        return None
    if share >= INPUT_BOUND_SHARE and (gain is None or gain >= MATERIAL_SHARE):
        return "input-bound"
    if obs.busy_share is not None and obs.busy_share < LAUNCH_BOUND_BUSY:
        return "launch-bound"
    return "compute-bound"


@check
def data_wait(obs: Observations) -> Finding:
    share, gain, step = obs.wait_share, obs.replay_gain, obs.step_s
    if share is None:
        return Finding("waiting for the next batch", "time", NOT_HERE, no_loader(obs) + ", so the wait for each "
                       "batch cannot be timed apart from the step")
    wait = obs.wait_s
    text = f"{_pct(share)} of each step ({_ms(wait)} of {_ms(step)}) is spent waiting for the next batch"
    if gain is not None:
        text += (f"; replaying one cached batch (no loader) runs a step in {_ms(obs.replay_s)}: a faster loader could "
                 f"save at most {_pct(max(gain, 0.0))} of the step")
    else:
        text += "; the cached-batch replay was not run for this loop"
    verdict = bound(obs)
    cost = max(0.0, gain) * step if gain is not None else wait
    if verdict == "input-bound":
        if workers_cannot_pay(obs):
            # A wait no worker can win back: a number to know, and the one change that would shorten it
            return Finding("waiting for the next batch", "time", "measured", f"input-bound: {text}; a worker would "
                           f"add {_ms(obs.handoff_s)} a batch to hand it over (measured on this loop's batch), more "
                           "than the wait: workers cannot win it back", cost, cost / step,
                           f"not loader workers: {CHEAPER_BATCHES}")
        if handoff_bound(obs):
            return Finding("waiting for the next batch", "time", "measured", f"input-bound: {text}; handing a batch "
                           f"over from a worker costs this process {_ms(obs.handoff_s)} (measured on this loop's "
                           "batch): the wait is mostly that handoff, which more workers would not shorten",
                           cost, cost / step, "fewer workers: DataLoader(num_workers=0) builds each batch in this "
                           "process with no handoff, which pays where building one costs less than handing it over; "
                           + CHEAPER_BATCHES)
        if obs.recipe_flags:
            fix = ("--num-workers auto (more loader processes), --prefetch (uint8 transport, normalize on the "
                   "device), --decode-cache for image folders")
        else:
            fix = ("DataLoader(num_workers=N, persistent_workers=True); uint8 images from the workers, converted and "
                   "normalized after the copy to the device; for photos, decode once into a cache")
        return Finding("waiting for the next batch", "time", "problem", f"input-bound: {text}", cost, cost / step, fix)
    # Below the input-bound line a saving the replay confirms is still worth knowing (num_workers=0 names its fix)
    material = gain is not None and gain >= MATERIAL_SHARE and share >= MATERIAL_SHARE
    return Finding("waiting for the next batch", "time", "measured" if material else "fine", f"{verdict}: {text}",
                   cost, cost / step)


def no_loader(obs: Observations) -> str:
    return ("the loop draws no batch from a torch DataLoader (it makes its batches itself)" if not obs.recipe_flags
            else "the loop's batches do not come through a trainfast loader (Session.setup)")


def workers_cannot_pay(obs: Observations) -> bool:
    """A loop without workers whose wait per batch is no more than what a worker adds to hand a batch over."""
    return (obs.num_workers == 0 and obs.handoff_s is not None and obs.wait_s is not None
            and obs.handoff_s >= obs.wait_s)


def handoff_bound(obs: Observations) -> bool:
    """A loop with workers whose wait per batch is within twice what handing a batch over costs: the wait is the
    transfer from the workers, not their work."""
    return (bool(obs.num_workers) and obs.handoff_s is not None and obs.wait_s is not None
            and obs.wait_s <= 2 * obs.handoff_s)


CHEAPER_BATCHES = ("make each batch cheaper to build in this process: a dataset indexed with a whole batch of "
                   "indices at once (a `__getitems__`, or slicing in-memory tensors) instead of one sample at a time "
                   "and a collate")


# Where a library's own loop reads a value every step, the setting of that library that stops it.
LIBRARY_SYNC_FIXES = {
    "transformers/trainer.py": "TrainingArguments(logging_nan_inf_filter=False) turns off the Trainer's check of "
                               "every step's loss for NaN/inf (a read of the loss each step)",
}


def library_of(where: str) -> str | None:
    """The installed package a source location belongs to ("transformers"), None for the script's own files."""
    import re

    match = re.search(r"(?:site|dist)-packages/([^/]+)/", where.replace("\\", "/"))
    return match.group(1) if match else None


def sync_fix(user: list[dict[str, Any]]) -> str:
    """The fix for the syncs found: in the script's code, keep values on the device; in a library's, its option."""
    generic = ("keep values on the device (accumulate losses in a tensor) and read them every N steps; print from "
               "those reads (the built-in Meter does this)")
    libraries = {library_of(s["where"]) for s in user}
    if None in libraries:
        return generic
    known = [fix for s in user for key, fix in LIBRARY_SYNC_FIXES.items() if key in s["where"].replace("\\", "/")]
    return (f"these reads are in the code of {', '.join(sorted(libraries))}, not the script's: "
            + ("; ".join(dict.fromkeys(known)) if known else "look for its option that logs or checks less often"))


@check
def syncs(obs: Observations) -> Finding:
    name = "host-device syncs per step"
    if not obs.sync_steps:
        return Finding(name, "mistake", NOT_HERE, "the loop ran too few steps to count them")
    user = obs.user_syncs()
    ours = sum(s["calls"] for s in obs.syncs if s["trainfast"])
    per_step = sum(s["calls"] for s in user) / obs.sync_steps
    lines = "; ".join(f"{s['calls'] / obs.sync_steps:g}/step {s['op']} at {s['where']}" for s in user[:4])
    text = (f"{per_step:g} per step from the loop over {obs.sync_steps} counted steps"
            + (f" ({lines})" if lines else "")
            + (f"; trainfast's own metric reads: {ours / obs.sync_steps:g} per step (once a log window)" if ours else ""))
    if per_step < SYNCS_PER_STEP:
        return Finding(name, "mistake", "fine", text)
    if not obs.cuda:
        # On the CPU the host is the device: a read waits for nothing, so calling it a problem here would be a
        # false alarm on the many correct loops that log loss.item() every step. Counted, with what a GPU would pay.
        return Finding(name, "mistake", "measured", text + "; on the CPU nothing runs ahead of the host, so they cost "
                       f"nothing here; on a GPU each one stalls it until its queued work is done: {sync_fix(user)}")
    return Finding(name, "mistake", "problem", text, fix=sync_fix(user))


@check
def compute(obs: Observations) -> Finding:
    name = "compute throughput vs matmul peak"
    if not obs.step_seconds:
        return Finding(name, "time", NOT_HERE, untimed(obs))
    if not obs.flops_per_sample or not obs.ceiling_flops or not obs.samples:
        return Finding(name, "time", NOT_HERE, "the model's FLOPs or the samples per step are unknown for this loop")
    rate = statistics.median(obs.samples) / obs.step_s
    achieved = rate * obs.flops_per_sample
    text = (f"{rate:,.0f} samples/s x {_sig(obs.flops_per_sample / 1e6)} MFLOP/sample = {_sig(achieved / 1e9)} "
            f"GFLOP/s, {_pct3(achieved / obs.ceiling_flops)} of the measured {obs.ceiling_dtype} matmul peak "
            f"({obs.ceiling_flops / 1e9:,.0f} GFLOP/s)")
    return Finding(name, "time", "measured", text + higher_roof(obs, achieved / obs.ceiling_flops))


def higher_roof(obs: Observations, fraction: float) -> str:
    """Where an fp32 loop computes near its roof and the machine's half type has a measured peak HALF_ROOF
    times higher, that roof and the switch that reaches it: the largest lever a compute-bound loop has (a
    lever, not a mistake: fp32 is a choice the ablation's accuracy column weighs)."""
    if not obs.half_ceiling or fraction < NEAR_ROOF:
        return ""
    half, peak = obs.half_ceiling
    if peak < HALF_ROOF * obs.ceiling_flops:
        return ""
    how = (f"`--precision {half}` (`trainfast ablate --switches amp` measures it, accuracy included)"
           if obs.recipe_flags else
           f"autocast in {half} around the forward and the loss (a Session's precision switch: `trainfast ablate "
           "--switches amp -- COMMAND` measures it)")
    return (f"; the loop computes in fp32 near that roof, and this machine's measured {half} matmul peak is "
            f"{peak / 1e9:,.0f} GFLOP/s ({peak / obs.ceiling_flops:.1f}x): mixed precision raises the roof, {how}")


@check
def memory(obs: Observations) -> Finding:
    m = obs.memory
    if not m.get("peak_bytes") or not m.get("capacity_bytes"):
        return Finding("memory peak vs capacity", "time", NOT_HERE, "peak memory was not measured for this loop")
    peak, cap, static = m["peak_bytes"], m["capacity_bytes"], m.get("static_bytes") or 0
    what = "allocator peak" if obs.cuda else "peak resident memory of the process"
    text = f"{what} {peak / 2**30:.2f} GiB of {cap / 2**30:.1f} GiB ({_pct(peak / cap)})"
    per_batch = peak - static
    if per_batch > 0 and static:
        room = max(1.0, (cap * 0.9 - static) / per_batch)
        text += (f"; about {per_batch / 2**30:.2f} GiB of it grows with the batch: room for "
                 + (f"roughly {room:.1f}x" if room < 8 else "more than 8x")
                 + " the batch (rough: activations scale about linearly with the batch; 10% kept free)")
    return Finding("memory peak vs capacity", "time", "measured", text)


def untimed(obs: Observations) -> str:
    """Why no step was timed: the loop ended inside the watched steps that are counted but not timed."""
    return (f"no step was timed: the loop made {obs.steps_run} optimizer step(s) and ended before the timed ones "
            "(the first steps are watched for syncs and warm-up, untimed); give it more steps (more --epochs or "
            "data) for the time checks")


@check
def page_faults(obs: Observations) -> Finding:
    name = "page faults: fresh memory every step"
    if obs.cuda:
        return Finding(name, "time", NOT_HERE, "on a GPU the step's tensors come from the device's caching allocator; "
                       "the host's page faults are not the step's cost")
    if not obs.step_seconds:
        return Finding(name, "time", NOT_HERE, untimed(obs))
    if not obs.step_faults or not obs.step_kernel_s:
        return Finding(name, "time", NOT_HERE, "this platform does not count a process's page faults (getrusage)")
    # glibc's malloc raises its mmap threshold (up to 32 MiB) each time it unmaps a freed block, so a loop's
    # first steps fault more than its later ones: the verdict is on the last third of the watched steps.
    late = slice(-max(3, len(obs.step_faults) // 3), None)
    faults, kernel = statistics.median(obs.step_faults[late]), statistics.median(obs.step_kernel_s[late])
    # Kernel seconds are summed over the step's threads, which fault in parallel: their share of the step's CPU
    # seconds, not of its wall time, is the part of the step they take (two busy threads: half the wall share).
    cpu = statistics.median(obs.step_cpu_s[late]) if obs.step_cpu_s else 0.0
    share = min(1.0, kernel / cpu) if cpu > 0 else kernel / obs.step_s
    cost = share * obs.step_s
    first = statistics.median(obs.step_faults[:len(obs.step_faults) // 2] or obs.step_faults)
    falling = (f", falling from {first:,.0f} in the first watched steps as glibc's malloc raised its mmap "
               "threshold" if first > 1.5 * faults and first >= FAULTS_PER_STEP else "")
    text = (f"{faults:,.0f} page faults and {_ms(kernel)} of kernel time per step{falling}, {_pct(share)} of its "
            f"CPU time (~{_ms(cost)} of the {_ms(obs.step_s)} step; {obs.fault_source or 'the steady steps'})")
    reuse = obs.reuse_memory
    if reuse.get("in_effect"):
        return Finding(name, "time", "fine", text + ": reuse_memory is on (freed memory stays mapped)")
    if reuse.get("unavailable"):
        return Finding(name, "time", NOT_HERE, f"{text}; reuse_memory cannot act here: {reuse['unavailable']}")
    if faults >= FAULTS_PER_STEP and share >= MATERIAL_SHARE:
        env = " ".join(f"{k}={v}" for k, v in memory_reuse.ENV.items())   # the variables ablate starts it with
        command = shlex.join(obs.command) if obs.command else "COMMAND"
        fix = ("--reuse-memory" if obs.recipe_flags else
               f"measure it with `trainfast ablate --switches {memory_reuse.FIELD} -- {command}`; keep it with "
               f"Recipe({memory_reuse.FIELD}=True) in trainfast.Session, or start the script with its environment: "
               f"`{env} {command}`")
        return Finding(name, "time", "problem",
                       text + ": the C library's malloc hands the step's large freed blocks back to the kernel, which "
                       "maps and zero-fills them again on the next step; keeping them mapped saves about that share "
                       "of the step", cost, share, fix)
    return Finding(name, "time", "fine", text + f": below {FAULTS_PER_STEP:,} faults or {_pct(MATERIAL_SHARE)} of "
                   "the step's CPU time")


@check
def launch_bound(obs: Observations) -> Finding:
    name = "launch-bound steps"
    if not obs.cuda:
        return Finding(name, "time", NOT_HERE, "needs the CUDA profiler (kernel time vs step time): no GPU here")
    p = obs.cuda_profile
    if obs.busy_share is None:
        return Finding(name, "time", NOT_HERE, f"the CUDA profile did not run: {(p or {}).get('error', 'no profile')}")
    text = f"the GPU computes {_pct(obs.busy_share)} of the step ({_ms(p['kernel_s_per_step'])} of kernels per step)"
    if bound(obs) == "launch-bound":
        cost = obs.step_s - p["kernel_s_per_step"]
        return Finding(name, "time", "problem", text + ": the host cannot issue kernels fast enough", cost,
                       cost / obs.step_s, "--compile (fewer, fused kernels), a larger --batch-size")
    return Finding(name, "time", "fine", text)


@check
def compile_graphs(obs: Observations) -> Finding:
    name = "compile: graph breaks and recompilations"
    if not obs.compiled:
        return Finding(name, "time", NOT_HERE, "the run is not compiled (--compile turns it on)")
    c = obs.compile or {}
    text = f"{c.get('graphs', 0)} graph(s), {c.get('graph_breaks', 0)} graph break(s)"
    if c.get("break_reasons"):
        text += ": " + "; ".join(c["break_reasons"])
    if obs.recompiles is not None:
        text += f"; {obs.recompiles} frame(s) compiled during the steady steps"
    if c.get("graph_breaks") or obs.recompiles:
        return Finding(name, "time", "problem", text, fix="remove the break's cause (data-dependent Python, "
                       ".item(), print) from forward; keep input shapes fixed (drop_last=True) or mark them dynamic")
    return Finding(name, "time", "fine", text)


# --- mistakes ---------------------------------------------------------------------------------------

@check
def eval_dropout(obs: Observations) -> Finding:
    name = "dropout active in eval mode"
    d = obs.dropout
    if d is None:
        return Finding(name, "mistake", NOT_HERE, "no training forward with positional inputs was seen after the first step: no input to test with")
    if "error" in d:
        return Finding(name, "mistake", NOT_HERE, f"the eval forwards of the last training input failed: {d['error']}")
    text = (f"in eval() + inference_mode two forwards of the same input differ by up to {d['max_diff']:.3g} "
            f"({_pct(d['relative_diff'])} of the output's scale)")
    fix = ("use nn.Dropout modules (they follow eval()), or pass training=self.training to F.dropout "
           "(dropout_p=self.p if self.training else 0.0 to scaled_dot_product_attention)")
    if d["calls"]:
        return Finding(name, "mistake", "problem", text + "; still dropping: " + "; ".join(d["calls"]), fix=fix)
    if d["relative_diff"] > 1e-3 and d.get("random_calls"):
        return Finding(name, "mistake", "measured", text + ": no dropout drops; the forward draws random numbers "
                       f"({sampling(d)}), which eval() does not switch off")
    if d["relative_diff"] > 1e-3:
        return Finding(name, "mistake", "problem", text + " (no dropout or random call of torch's was seen making "
                       "them differ: a random op in an extension, or nondeterministic kernels)", fix=fix)
    return Finding(name, "mistake", "fine", "two eval forwards of the same input agree exactly")


def sampling(d: dict[str, Any]) -> str:
    """The random draws of a forward, and what they are when they are meant."""
    return ("; ".join(d["random_calls"][:3]) + ": sampling by design, as in a VAE's reparameterization or a "
            "diffusion step, is right; a hand-made dropout mask there should follow self.training")


def eval_unseen(obs: Observations) -> str:
    """Why the evaluation checks have nothing to read."""
    wait = obs.eval_wait or {}
    outcome, steps = wait.get("outcome"), wait.get("steps", 0)
    if outcome == "limit":
        return (f"no evaluation forward ran in the watched steps, nor in the {wait['limit_s']:g} s the loop was then "
                f"kept going, untimed ({steps} more step(s)): its evaluation comes later (--eval-within SECONDS waits "
                "longer)")
    if outcome == "ended":
        return f"the loop ended after {obs.steps_run + steps} step(s) without an evaluation forward"
    if outcome == "off":
        return "no evaluation forward ran in the watched steps, and waiting for one was off (--eval-within 0)"
    return "no evaluation forward (model in eval mode, or grad off) ran while watched"


def eval_source(obs: Observations) -> str:
    """Where the evaluation the checks read came from, when the loop was kept going for it."""
    wait = obs.eval_wait or {}
    if wait.get("outcome") == "reached" or (wait.get("outcome") == "ended" and wait.get("steps")):
        return (f" (the loop's first evaluation, reached {wait['waited_s']:.0f} s and {wait['steps']} untimed step(s) "
                "after the watched steps; the run was stopped there)")
    return ""


@check
def eval_graph(obs: Observations) -> Finding:
    name = "evaluation builds an autograd graph"
    total = obs.eval_forwards + (obs.train_mode_eval or {}).get("forwards", 0)
    if not total:
        return Finding(name, "mistake", NOT_HERE, eval_unseen(obs))
    if obs.eval_graph:
        where = ", ".join(f"{k} ({v} forward(s))" for k, v in obs.eval_graph.items())
        return Finding(name, "mistake", "problem", f"{sum(obs.eval_graph.values())} of {total} evaluation "
                       f"forwards ran in eval mode with grad enabled and returned outputs that require grad: {where}"
                       + eval_source(obs),
                       fix="wrap evaluation in `with torch.inference_mode():` (or torch.no_grad()): no graph is kept, "
                           "activations are freed at once")
    return Finding(name, "mistake", "fine", f"{total} evaluation forward(s) ran without autograd" + eval_source(obs))


# what each kind of module does differently in training mode
TRAIN_MODE_EFFECTS = (("Dropout", "dropout drops units"),
                      ("BatchNorm", "batch norm normalizes with each batch's statistics and updates its running "
                                    "ones with evaluation data"),
                      ("InstanceNorm", "instance norm updates its running statistics"),
                      ("MultiheadAttention", "attention dropout drops weights"),
                      ("RNN", "the recurrent layers' dropout drops"), ("LSTM", "the recurrent layers' dropout drops"),
                      ("GRU", "the recurrent layers' dropout drops"))


@check
def eval_mode(obs: Observations) -> Finding:
    name = "evaluation without model.eval()"
    seen = obs.train_mode_eval
    if not seen:
        if not obs.eval_forwards:
            return Finding(name, "mistake", NOT_HERE, eval_unseen(obs))
        return Finding(name, "mistake", "fine", f"{obs.eval_forwards} evaluation forward(s) ran in eval mode"
                       + eval_source(obs))
    text = (f"{seen['forwards']} grad-free forward(s) of the trained model ran in training mode (model.eval() "
            "was not called before them)")
    fix = "call model.eval() before evaluating, and model.train() before training again"
    modules, repeat = seen.get("modules") or {}, seen.get("repeat")
    if modules:
        listed = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in modules.items())
        effects = list(dict.fromkeys(e for key, e in TRAIN_MODE_EFFECTS if any(key in m for m in modules)))
        return Finding(name, "mistake", "problem", f"{text}: its {listed} act as in training"
                       + (f" ({'; '.join(effects)})" if effects else "") + eval_source(obs), fix=fix)
    if repeat and "error" in repeat:
        return Finding(name, "mistake", NOT_HERE, f"{text}; the model would not take that input again: "
                       f"{repeat['error']}")
    if repeat and not repeat["calls"] and repeat["relative_diff"] > 1e-3 and repeat.get("random_calls"):
        return Finding(name, "mistake", "fine", f"{text}, but nothing in this model acts differently in eval(): two "
                       f"such forwards differ only by random draws that do not follow the mode ({sampling(repeat)})")
    if repeat and (repeat["relative_diff"] > 1e-3 or repeat["calls"]):
        where = "; still dropping: " + "; ".join(repeat["calls"]) if repeat["calls"] else ""
        return Finding(name, "mistake", "problem", f"{text}: two such forwards of the same input differ by up to "
                       f"{repeat['max_diff']:.3g} (dropout that follows self.training){where}" + eval_source(obs),
                       fix=fix)
    return Finding(name, "mistake", "fine", f"{text}, but nothing in this model acts differently in eval() (no "
                   "dropout or batch norm module; two forwards of the same input agree): here it changes nothing")


@check
def host_copies(obs: Observations) -> Finding:
    name = "tensors created on the host and copied every step"
    if not obs.cuda:
        return Finding(name, "mistake", NOT_HERE, "host-to-device copies only exist with a GPU")
    p = obs.cuda_profile or {}
    if p.get("h2d_per_step") is None:
        return Finding(name, "mistake", NOT_HERE, f"the CUDA profile did not run: {p.get('error', 'no profile')}")
    extra = p["h2d_per_step"] - p.get("batch_tensors", 0)
    batch = p.get("batch_tensors", 0)
    text = (f"{p['h2d_per_step']:g} host-to-device copies per step"
            + (f", {batch} of them the batch's" if batch else " with the batch already on the device (replay)"))
    if extra >= 1:
        return Finding(name, "mistake", "problem", text, fix="create constants on the device once "
                       "(torch.tensor(..., device=device) outside the loop, or a registered buffer)")
    return Finding(name, "mistake", "fine", text)


def zero_grad_lines(calls: list[dict[str, Any]]) -> str:
    return "; ".join(f"{c['call']} with set_to_none={c['set_to_none']} ({c['calls']} call(s)) at {c['where']}"
                     for c in calls[:3])


@check
def zero_grad(obs: Observations) -> Finding:
    """Read from the gradients themselves as gradients arrive between two steps (whatever the order of
    zero_grad, forward and backward in the loop); the zero_grad calls seen name the line."""
    name = "zero_grad without set_to_none"
    calls = obs.zero_grad_calls
    kept = [c for c in calls if not c["set_to_none"]]
    flag = "--set-to-none" if obs.recipe_flags else "optimizer.zero_grad(set_to_none=True) (torch's default)"
    if "carried" in obs.grads:
        why = (f"zero_grad is called ({zero_grad_lines(calls)}) but not between every optimizer step and the next "
               "backward, so those steps add to the last one's gradients" if calls else
               "zero_grad() is never called, so every step adds to the last one's gradients")
        return Finding(name, "mistake", "problem", "gradients still held the previous step's values when the next "
                       f"step's gradients arrived: {why}",
                       fix="call optimizer.zero_grad() once per step, anywhere between step() and the next backward()")
    per_step = sum(c["calls"] for c in kept) / max(1, obs.steps_run)
    if "zeroed" in obs.grads or (not obs.grads and per_step >= 0.5):
        cost = obs.zero_grad_s
        text = ("gradients are zeroed in place every step (a memset of every gradient, and their memory kept "
                "between steps)" + (f": {zero_grad_lines(kept)}" if kept else
                                    " by something other than zero_grad (p.grad.zero_(), say)"))
        share = cost / obs.step_s if cost and obs.step_s else None
        if cost is not None:
            text += f"; the memset measured {_ms(cost)}"
        if share is not None and share < MATERIAL_SHARE:
            return Finding(name, "mistake", "measured", text + f", {_pct(share)} of the step: below the "
                           f"{_pct(MATERIAL_SHARE)} a change pays for here (set_to_none would also free the gradients' "
                           "memory between steps)", cost, share, flag)
        return Finding(name, "mistake", "problem", text, cost, share, flag)
    if obs.grads:
        return Finding(name, "mistake", "fine", "gradients are freed between steps (set_to_none)"
                       + (f": {zero_grad_lines(calls)}" if calls else ""))
    if calls and not kept:
        return Finding(name, "mistake", "fine", f"zero_grad frees the gradients: {zero_grad_lines(calls)}")
    return Finding(name, "mistake", NOT_HERE, "no backward followed an optimizer step while watched, and no "
                   "zero_grad call was seen")


@check
def data_parallel(obs: Observations) -> Finding:
    name = "DataParallel where DDP would serve"
    if obs.data_parallel:
        return Finding(name, "mistake", "problem", "the model is an nn.DataParallel: one process drives every GPU, "
                       "replicates the model each step and gathers outputs on the first GPU",
                       fix="torchrun --nproc-per-node N with --strategy ddp (one process per GPU)")
    return Finding(name, "mistake", "fine", "no nn.DataParallel in the model")


def distinct_shapes(shapes: list[list]) -> int:
    return len({repr(s) for s in shapes})


@check
def cudnn_shapes(obs: Observations) -> Finding:
    name = "cudnn.benchmark with changing input shapes"
    n = distinct_shapes(obs.shapes)
    text = f"{n} distinct input shape(s) over {len(obs.shapes)} training forwards"
    if not obs.cuda:
        return Finding(name, "mistake", NOT_HERE, f"cudnn.benchmark acts on CUDA only ({text})")
    if obs.cudnn_benchmark and n > VARYING_SHAPES:
        return Finding(name, "mistake", "problem", text + " with cudnn.benchmark on: every new shape is autotuned "
                       "again", fix="--no-cudnn-benchmark, or fixed shapes (drop_last=True, padding to buckets)")
    return Finding(name, "mistake", "fine", text + (" (cudnn.benchmark on)" if obs.cudnn_benchmark else
                                                      " (cudnn.benchmark off)"))


@check
def num_workers(obs: Observations) -> Finding:
    name = "num_workers=0"
    share, gain = obs.wait_share, obs.replay_gain
    if obs.num_workers is None or share is None:
        return Finding(name, "mistake", NOT_HERE, no_loader(obs) + ": its workers and its wait are unknown")
    if obs.num_workers > 0:
        return Finding(name, "mistake", "fine", f"{obs.num_workers} loader worker(s)")
    text = f"the loader runs in the training process; the wait is {_pct(share)} of the step"
    fix = "--num-workers auto" if obs.recipe_flags else "DataLoader(num_workers=2 or more)"
    if workers_cannot_pay(obs):
        text += (f" ({_ms(obs.wait_s)}), and a worker would add {_ms(obs.handoff_s)} a batch to this process to hand "
                 "the batch over (received from shared memory: measured on this loop's batch): workers cannot win "
                 "the wait back; " + CHEAPER_BATCHES)
        return Finding(name, "mistake", "measured" if share >= MATERIAL_SHARE else "fine", text)
    if gain is not None:
        text += f" and the cached-batch replay is {_pct(max(gain, 0.0))} faster"
        # Material only when both say so: a wait the replay does not confirm is the loader's own noise.
        if share >= MATERIAL_SHARE and gain >= MATERIAL_SHARE:
            cost = gain * obs.step_s
            return Finding(name, "mistake", "problem", text, cost, cost / obs.step_s, fix)
    else:
        # Without the replay nothing confirms that workers would win the wait back (on a CPU they take cores
        # from the compute): a problem only where the loop is input-bound; a smaller wait is a number to know.
        if share >= INPUT_BOUND_SHARE:
            text += " (no cached-batch replay for this loop: the wait alone decides, and bounds the saving)"
            return Finding(name, "mistake", "problem", text, obs.wait_s, obs.wait_s / obs.step_s, fix)
        if share >= MATERIAL_SHARE:
            return Finding(name, "mistake", "measured", text + ": loader workers could save up to that, unconfirmed "
                           f"(no cached-batch replay for this loop) and below the {_pct(INPUT_BOUND_SHARE)} that "
                           "makes a loop input-bound")
        text += " (no cached-batch replay for this loop: the wait alone decides, and bounds the saving)"
    return Finding(name, "mistake", "fine", text + f": below the {_pct(MATERIAL_SHARE)} that would make workers pay")
