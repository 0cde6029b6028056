"""The machine under the run: its environment (versions, a smoke test on every device) and the other processes
that shared its cores while the steps were timed."""
from __future__ import annotations

import math

from ..envcheck import smoke_failures, summary
from .findings import NOT_HERE, SHARED_CORES, Finding, Observations


def environment(obs: Observations) -> Finding:
    failures = smoke_failures(obs.env)
    text = summary(obs.env) + "; a tiny conv and matmul ran on " + ", ".join(s["device"] for s in obs.env["smoke"])
    if failures:
        return Finding("environment", "environment", "problem", text + ". Failed: " + "; ".join(failures),
                       fix="see the explanation of each failure")
    return Finding("environment", "environment", "fine", text + ": both correct")


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
