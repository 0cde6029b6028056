"""What a measured process was given by the machine: its cores, its threads and where they ran, how often the
kernel took the CPU from it, its page faults and huge pages. Two fresh processes of the same rung can sit at
different speeds on a shared machine; each run's record carries these so the report (and a person reading
results.json) can tell what set a slow process apart. Linux only; None elsewhere."""
from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_states(pid: str = "self") -> list[dict[str, Any]]:
    """Every thread of the process: its name, CPU seconds, the core it last ran on, and the times the kernel took
    the core from it while it could still run (nonvoluntary context switches: another process wanted the core)."""
    threads = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:                      # the thread ended while it was read
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        # fields[0] is stat's third field: utime is the 14th, stime the 15th, processor the 39th
        cpu_s = (int(fields[11]) + int(fields[12])) / TICK
        forced = next((int(line.split()[1]) for line in status.splitlines()
                       if line.startswith("nonvoluntary_ctxt_switches")), None)
        threads.append({"name": name, "cpu_s": cpu_s, "core": int(fields[36]), "preempted": forced})
    return threads


def anon_huge_kib(pid: str = "self") -> int | None:
    """Anonymous memory backed by transparent huge pages (fewer TLB misses on large tensors), in KiB."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def process_state() -> dict[str, Any] | None:
    """This process as the machine has run it so far (module docstring); None off Linux."""
    if not Path("/proc/self/task").is_dir():
        return None
    import torch

    usage = resource.getrusage(resource.RUSAGE_SELF)
    busy = [t for t in thread_states() if t["cpu_s"] >= 0.05]        # the threads that did the work
    return {"cores": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
            "preempted": usage.ru_nivcsw, "yielded": usage.ru_nvcsw, "minor_faults": usage.ru_minflt,
            "major_faults": usage.ru_majflt, "anon_huge_kib": anon_huge_kib(), "busy_threads": busy}


def process_cpu_seconds() -> float:
    """CPU seconds this process has used so far, all its threads (a display's refresh thread included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


REFERENCE_TIMES = 7         # timings of the fixed workload at each end of a ladder
REFERENCE_PRODUCTS = 40     # 512x512 fp32 products per timing: ~30-70 ms on the 2-core machines seen (a few ms
                            # jitters by 10-20% on a quiet machine: too short to stand for the machine)


def reference_check(device=None) -> dict[str, float]:
    """A fixed workload (fp32 512x512 matmuls on the torch threads the runs use) timed REFERENCE_TIMES times:
    the machine's own speed and jitter at one moment, independent of any rung. The ablation times it before its
    first run and after its last; the two say how much the machine itself moved during the ladder."""
    import statistics
    import time

    import torch

    device = device or torch.device("cpu")
    a = torch.randn(512, 512, device=device) / 512 ** 0.5       # scaled: the chain's values neither grow nor
                                                                 # sink into denormals (which run far slower)
    times = []
    for _ in range(REFERENCE_TIMES + 1):                  # the first is a warm-up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        x = a
        for _ in range(REFERENCE_PRODUCTS):
            x = torch.mm(x, a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    times = times[1:]
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
