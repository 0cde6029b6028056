"""A run's steady state from its step times: warm-up found (detect_warmup), the steps after it grouped in
blocks, the blocks other processes disturbed left out and the rate of the rest (Timing); and how many more
steps a timing needs (steps_to_time)."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .clock import StepTime


def detect_warmup(seconds: list[float], min_skip: int = 1, settle: int = 3, tolerance: float = 0.5) -> int:
    """How many leading steps are warm-up: the index of the first step from which `settle` steps in a row
    each take at most (1 + tolerance) x the steady level, that level being the median of the second half
    of the run (warm-up is assumed to be shorter than half of it; the caller runs enough steps for that).
    The first `min_skip` steps are always warm-up (first touch of every buffer). Compilation, allocator
    growth and worker start-up cost 2x to 100x a steady step; the machine's own step-to-step noise here is
    well under 1.5x, so the rule stops where the start-up costs stop rather than at a fixed count."""
    n = len(seconds)
    if n <= min_skip:
        return n
    level = statistics.median(seconds[n // 2:])
    limit = level * (1 + tolerance)
    settle = max(1, min(settle, n - min_skip))
    for start in range(min_skip, n - settle + 1):
        if all(t <= limit for t in seconds[start:start + settle]):
            return start
    return n - settle          # never settled: keep only the last few steps, and the spread will show it


def compile_left_out(work: list[float], warmup: int, compiles: list[int], tolerance: float = 0.5) -> list[dict]:
    """The steps a compile inside the timed steps cost, left out of the rate as warm-up: from the step in which
    torch.compile compiled (a new input shape, a guard that failed: dynamo's compile-start callback) while the steps
    stay slower than (1 + tolerance) x the steady level (the median of the timed steps, as detect_warmup's). A
    recompile costs seconds (19.5 s measured inside one timed run of a language model: its rate fell from 4,411 to
    1,778 tokens/s and the verdict with it); it is compilation, not the rate of the switch being judged. A compile
    in a step that is not slow (one started during an evaluation, which belongs to no step) leaves nothing out.
    `work`: each step's seconds (or seconds per sample); `compiles`: step indices, ascending or not."""
    if not compiles or warmup >= len(work):
        return []
    level = statistics.median(work[warmup:]) * (1 + tolerance)
    out: list[dict] = []
    for start in sorted(set(k for k in compiles if warmup <= k < len(work))):
        if out and start < out[-1]["step"] + out[-1]["steps"]:
            continue                    # inside the steps an earlier compile already left out
        end = start
        while end < len(work) and work[end] > level:
            end += 1
        if end > start:
            out.append({"step": start, "steps": end - start})
    return out


def evaluation_left_out(n: int, warmup: int, passes: list[int], taken: set[int]) -> list[dict]:
    """The timed steps in which a pass over another loader began, left out of the training rate. A script that
    evaluates every epoch does it between two optimizer steps, so one step's interval holds the whole evaluation
    (a second in a short epoch of a small model): whether a run's window happened to hold one decided its rate,
    and a compiled rung whose evaluation step was left out for its recompile measured 1.2x against rungs that paid
    theirs. Left out in every rung alike, the rate is the training's. Not when it would leave no step to time (a
    loop that iterates another loader in every step: that is its training). `taken`: steps already left out,
    counted from the first timed step."""
    steps = sorted({k for k in passes if warmup <= k < n and k - warmup not in taken})
    if len(steps) + len(taken) >= n - warmup:
        return []
    return [{"step": k} for k in steps]


BLOCK_SECONDS = 0.2       # a timing block: consecutive steps summing to at least this (20 ticks of /proc/stat)
DISTURBED_SHARE = 0.25    # a block is disturbed when other processes used more than this share of the machine
EDGE_SHARE = 0.05         # ... and so is a block beside a disturbed one where they used more than this


@dataclass
class Timing:
    """A run's steady state: the steps after warm-up, grouped in blocks of consecutive steps, and the rate
    they give. The rate is total samples over total seconds of the clean blocks, exactly what a clock around
    them reads (no median of ratios). A block is disturbed, and left out, when other processes used more
    than DISTURBED_SHARE of the machine's cores during it (CPU runs: the run's own loader workers and ranks are
    its own, clock.JobCPU; on a GPU nothing is left out)."""
    warmup_steps: int
    step_seconds: list[float]
    step_samples: list[int]
    data_wait_s: float
    blocks: list[dict]            # {"steps", "samples", "seconds", "foreign_share", "disturbed"}
    warmup_seconds: list[float] = field(default_factory=list)   # the left-out steps (compilation shows here)
    copy_s: float | None = None   # CUDA: the batches' copy and preparation on the compute stream (StepTime)
    # Compiles inside the timed steps, left out as warm-up (compile_left_out): {"step", "steps", "seconds"}
    compiled: list[dict] = field(default_factory=list)
    # Steps holding another loader's pass (an evaluation), left out of the training rate: {"step", "seconds"}
    evaluated: list[dict] = field(default_factory=list)

    @classmethod
    def from_steps(cls, steps: list[StepTime], min_skip: int = 1, check_disturbance: bool = False,
                   per_sample: bool = False, compiles: list[int] = (), other_passes: list[int] = ()) -> "Timing":
        """`per_sample`: warm-up is found on each step's seconds per sample, for steps whose work varies (a token
        script's: a step of long documents is not a warm-up step, however long it takes). `compiles`: the steps in
        which torch.compile compiled (instruments/recompiles.py); those past warm-up are left out as warm-up
        (compile_left_out). `other_passes`: the steps in which a pass over another loader than the training one
        began (a script's evaluation between two training steps, probe/agent.py): left out of the training rate."""
        import os

        work = [(s.seconds / s.samples if s.samples else math.inf) if per_sample else s.seconds for s in steps]
        warmup = detect_warmup(work, min_skip=min_skip)
        timed = steps[warmup:]
        compiled = compile_left_out(work, warmup, compiles)
        left_out = {i - warmup for c in compiled for i in range(c["step"], c["step"] + c["steps"])}
        evaluated = evaluation_left_out(len(steps), warmup, other_passes, left_out)
        left_out |= {e["step"] - warmup for e in evaluated}
        kept = [s for i, s in enumerate(timed) if i not in left_out]
        cores = os.cpu_count() or 1
        blocks, current = [], []
        for i, step in enumerate(kept):
            current.append(step)
            if sum(s.seconds for s in current) >= BLOCK_SECONDS or i == len(kept) - 1:
                blocks.append(step_block(current, cores, check_disturbance))
                current = []
        mark_edges(blocks)
        clean = [s for b, group in _grouped(kept, blocks) if not b["disturbed"] for s in group]
        clean = clean or kept           # every block disturbed: the rate comes from all of them (clean_blocks)
        copies = [s.copy_s for s in clean]
        for c in compiled:
            c["seconds"] = sum(s.seconds for s in steps[c["step"]:c["step"] + c["steps"]])
        for e in evaluated:
            e["seconds"] = steps[e["step"]].seconds
        return cls(warmup, [s.seconds for s in timed], [s.samples for s in timed],
                   sum(s.data_wait_s for s in clean), blocks, [s.seconds for s in steps[:warmup]],
                   sum(copies) if copies and None not in copies else None, compiled, evaluated)

    @property
    def clean_blocks(self) -> list[dict]:
        """The undisturbed blocks; all of them when every block was disturbed (a machine busy throughout:
        a rate from disturbed steps, which the report says, beats no rate at all)."""
        return [b for b in self.blocks if not b["disturbed"]] or self.blocks

    @property
    def clean_steps(self) -> int:
        return sum(b["steps"] for b in self.clean_blocks)

    @property
    def seconds(self) -> float:
        return sum(b["seconds"] for b in self.clean_blocks)

    @property
    def compiled_steps(self) -> int:
        return sum(c["steps"] for c in self.compiled)

    @property
    def throughput(self) -> float:
        return sum(b["samples"] for b in self.clean_blocks) / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"warmup_steps": self.warmup_steps, "timed_steps": self.clean_steps, "timed_seconds": self.seconds,
                "throughput": self.throughput, "data_wait_s": self.data_wait_s, "copy_s": self.copy_s,
                "disturbed_steps": (len(self.step_seconds) - self.clean_steps - self.compiled_steps
                                    - len(self.evaluated)),
                "compiled_left_out": self.compiled, "evaluation_left_out": self.evaluated,
                "all_disturbed": bool(self.blocks) and all(b["disturbed"] for b in self.blocks),
                "warmup_seconds": self.warmup_seconds, "step_seconds": self.step_seconds,
                "step_samples": self.step_samples, "blocks": self.blocks}


def step_block(steps: list[StepTime], cores: int, check: bool) -> dict:
    """Consecutive steps as one timing block: samples, seconds, and whether other processes disturbed it."""
    seconds = sum(s.seconds for s in steps)
    foreign = None
    if check and all(s.machine_cpu_s is not None for s in steps) and seconds > 0:
        other = sum(s.machine_cpu_s - s.own_cpu_s for s in steps)
        foreign = max(0.0, other) / (seconds * cores)
    return {"steps": len(steps), "samples": sum(s.samples for s in steps), "seconds": seconds,
            "foreign_share": foreign, "disturbed": foreign is not None and foreign > DISTURBED_SHARE}


def mark_edges(blocks: list[dict]) -> None:
    """A disturbance rarely starts or ends on a block's boundary: the blocks beside a disturbed one hold its
    edges, under DISTURBED_SHARE yet slowed (a two-thread matrix product that loses a core to another process
    for a tenth of a block waits on it at every barrier: 25% slower measured). Such a neighbour, where other
    processes took more than EDGE_SHARE (the machine's housekeeping is 0-3%), is disturbed too."""
    core = [b["disturbed"] for b in blocks]
    for i, b in enumerate(blocks):
        beside = (i > 0 and core[i - 1]) or (i + 1 < len(blocks) and core[i + 1])
        if not b["disturbed"] and beside and b["foreign_share"] is not None and b["foreign_share"] > EDGE_SHARE:
            b["disturbed"] = b["edge"] = True


def _grouped(steps: list[StepTime], blocks: list[dict]):
    i = 0
    for b in blocks:
        yield b, steps[i:i + b["steps"]]
        i += b["steps"]


def steps_to_time(timing: Timing, min_steps: int, max_seconds: float, floor: int = 8, min_seconds: float = 0.0) -> int:
    """More steps needed for a timing of `min_steps` steady steps, or of at least `floor` steps once they
    take `max_seconds` (a slow model is timed over fewer, longer steps: its windows are already long), and in
    any case of at least `min_seconds` (millisecond steps: enough blocks for a spread)."""
    have = timing.clean_steps
    per_step = timing.seconds / have if have else 0.0
    affordable = int(max_seconds / per_step) if per_step > 0 else min_steps
    target = max(floor, min(min_steps, affordable))
    if per_step > 0 and min_seconds > 0:
        target = max(target, math.ceil(min_seconds / per_step))
    return max(0, target - have)
