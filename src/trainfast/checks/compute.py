"""Where the step's own time goes: the compute rate against the measured matmul peak, memory against capacity,
page faults of fresh memory, kernel launches the device waits for, and compiled graphs that break or recompile."""
from __future__ import annotations

import shlex
import statistics

from ..measure.memory import largest_text
from ..techniques import memory_reuse, memory_shrinkers
from .findings import (FAULTS_MARGIN, FAULTS_PER_STEP, HALF_ROOF, MATERIAL_SHARE, NEAR_ROOF, NOT_HERE, Finding,
                       Observations, ms, pct, pct3, sig)
from .loader import bound


def compute(obs: Observations) -> Finding:
    name = "compute throughput vs matmul peak"
    if not obs.step_seconds:
        return Finding(name, "time", NOT_HERE, untimed(obs))
    if not obs.flops_per_sample or not obs.ceiling_flops or not obs.samples:
        return Finding(name, "time", NOT_HERE, "the model's FLOPs or the samples per step are unknown for this loop")
    rate = statistics.median(obs.samples) / obs.step_s
    achieved = rate * obs.flops_per_sample
    unit = obs.sample_unit.rstrip("s")
    text = (f"{rate:,.0f} {unit}s/s x {sig(obs.flops_per_sample / 1e6)} MFLOP/{unit} = {sig(achieved / 1e9)} "
            f"GFLOP/s, {pct3(achieved / obs.ceiling_flops)} of the measured {obs.ceiling_dtype} matmul peak "
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
           f"autocast in {half} around the forward and the loss (`trainfast ablate --switches amp -- COMMAND` "
           "applies it to the script as it is, a plain loop included, and measures it, accuracy included)")
    return (f"; the loop computes in fp32 near that roof, and this machine's measured {half} matmul peak is "
            f"{peak / 1e9:,.0f} GFLOP/s ({peak / obs.ceiling_flops:.1f}x): mixed precision raises the roof, {how}")


def memory(obs: Observations) -> Finding:
    m = obs.memory
    if not m.get("peak_bytes") or not m.get("capacity_bytes"):
        return Finding("memory peak vs capacity", "time", NOT_HERE, "peak memory was not measured for this loop")
    peak, cap, static = m["peak_bytes"], m["capacity_bytes"], m.get("static_bytes") or 0
    what = "allocator peak" if obs.cuda else "peak resident memory of the process"
    text = f"{what} {peak / 2**30:.2f} GiB of {cap / 2**30:.1f} GiB ({pct(peak / cap)})"
    per_batch = peak - static
    if per_batch > 0 and static:
        room = max(1.0, (cap * 0.9 - static) / per_batch)
        text += (f"; about {per_batch / 2**30:.2f} GiB of it grows with the batch: room for "
                 + (f"roughly {room:.1f}x" if room < 8 else "more than 8x")
                 + " the batch (rough: activations scale about linearly with the batch; 10% kept free)")
    if m.get("breakdown"):
        text += f"; {largest_text(m['breakdown'], memory_shrinkers())}"
    return Finding("memory peak vs capacity", "time", "measured", text)


def untimed(obs: Observations) -> str:
    """Why no step was timed: the loop ended inside the watched steps that are counted but not timed."""
    return (f"no step was timed: the loop made {obs.steps_run} optimizer step(s) and ended before the timed ones "
            "(the first steps are watched for syncs and warm-up, untimed); give it more steps (more --epochs or "
            "data) for the time checks")


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
    text = (f"{faults:,.0f} page faults and {ms(kernel)} of kernel time per step{falling}, {pct(share)} of its "
            f"CPU time (~{ms(cost)} of the {ms(obs.step_s)} step; {obs.fault_source or 'the steady steps'})")
    reuse = obs.reuse_memory
    if reuse.get("in_effect"):
        return Finding(name, "time", "fine", text + ": reuse_memory is on (freed memory stays mapped)")
    if reuse.get("unavailable"):
        return Finding(name, "time", NOT_HERE, f"{text}; reuse_memory cannot act here: {reuse['unavailable']}")
    if faults < FAULTS_PER_STEP or share < MATERIAL_SHARE:
        return Finding(name, "time", "fine", text + f": below {FAULTS_PER_STEP:,} faults or {pct(MATERIAL_SHARE)} of "
                       "the step's CPU time")
    env = " ".join(f"{k}={v}" for k, v in memory_reuse.ENV.items())   # the variables ablate starts it with
    command = shlex.join(obs.command) if obs.command else "COMMAND"
    fix = ("--reuse-memory" if obs.recipe_flags else
           f"measure it with `trainfast ablate --switches {memory_reuse.FIELD} -- {command}`; keep it with "
           f"Recipe({memory_reuse.FIELD}=True) in trainfast.Session, or start the script with its environment: "
           f"`{env} {command}`")
    why = ("the C library's malloc hands the step's large freed blocks back to the kernel, which maps and zero-fills "
           "them again on the next step; keeping them mapped saves about that share of the step")
    # Judged with a margin: a count or a share near its line is a number to know, not a verdict that a rerun flips.
    if faults < FAULTS_MARGIN * FAULTS_PER_STEP or share < FAULTS_MARGIN * MATERIAL_SHARE:
        return Finding(name, "time", "measured", text + f": near the line ({FAULTS_PER_STEP:,} faults and "
                       f"{pct(MATERIAL_SHARE)} of the step's CPU time; a problem from {FAULTS_MARGIN:g}x both): {why}",
                       cost, share, fix)
    return Finding(name, "time", "problem", text + ": " + why, cost, share, fix)


def launch_bound(obs: Observations) -> Finding:
    name = "launch-bound steps"
    if not obs.cuda:
        return Finding(name, "time", NOT_HERE, "needs the CUDA profiler (kernel time vs step time): no GPU here")
    p = obs.cuda_profile
    if obs.busy_share is None:
        return Finding(name, "time", NOT_HERE, f"the CUDA profile did not run: {(p or {}).get('error', 'no profile')}")
    text = f"the GPU computes {pct(obs.busy_share)} of the step ({ms(p['kernel_s_per_step'])} of kernels per step)"
    if bound(obs) == "launch-bound":
        cost = obs.step_s - p["kernel_s_per_step"]
        return Finding(name, "time", "problem", text + ": the host cannot issue kernels fast enough", cost,
                       cost / obs.step_s, "--compile (fewer, fused kernels), a larger --batch-size")
    return Finding(name, "time", "fine", text)


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
