"""What every observer of the doctor adds to its Observations alike: what the Watch found (syncs, shapes,
gradients, zero_grad calls, the evaluation), page faults per step, the load other processes put on the
machine, and memory."""
from __future__ import annotations

import torch

from ..checks import Observations
# Every observer's timed steps, and how long an own loop is kept going for its first evaluation (defaults.py says
# why each: the CLI shows them before torch loads)
from ..defaults import DOCTOR_EVAL_WITHIN as DEFAULT_EVAL_WITHIN  # noqa: F401
from ..defaults import DOCTOR_STEPS as DEFAULT_STEPS  # noqa: F401
from ..defaults import usable_cpus
from ..envcheck import other_cores_since
from ..techniques import memory_reuse
from ..instruments.watch import Watch



def add_page_faults(obs: Observations, counters: list, source: str) -> None:
    """Page faults, kernel and CPU seconds per step from (before, after) kernel_counters() pairs, and whether
    reuse_memory acts in this process."""
    steps = [memory_reuse.counted_between(before, after) for before, after in counters]
    if steps and None not in steps:
        obs.step_faults, obs.step_kernel_s, obs.step_cpu_s = ([s[i] for s in steps] for i in range(3))
        obs.fault_source = source
    obs.reuse_memory = {"in_effect": memory_reuse.in_effect(), "unavailable": memory_reuse.unavailable()}


def add_machine_load(obs: Observations, load_start: tuple | None) -> None:
    """The cores other processes took since `load_start` (envcheck.cpu_seconds() where the timed steps began;
    None: no step was timed), beside the CPUs and torch threads the loop had."""
    obs.other_cores = other_cores_since(load_start)
    obs.cpus, obs.threads = usable_cpus(), torch.get_num_threads()


def add_watch(obs: Observations, watch: Watch) -> None:
    obs.notes += [f"a watch hook failed and was skipped: {e}" for e in watch.errors]
    obs.sync_steps = watch.sync_steps
    obs.syncs = watch.counter.by_line()
    obs.shapes = watch.forwards.shapes
    obs.grads = watch.gradients.grads
    obs.zero_grad_calls = watch.gradients.zero_grad_lines()
    obs.zero_grad_s = watch.gradients.zero_grad_s
    obs.data_parallel = watch.forwards.data_parallel


def compiled_since(before: dict | None, after: dict | None) -> dict | None:
    """What was compiled between two reads of dynamo's counters (probe.compile_counters): they count for the whole
    process, so what compiled before the observed run (another model, a library's own compiled step) is left out;
    None when nothing was ever compiled."""
    if after is None or not before:
        return after
    since = dict(after)
    for key in ("graphs", "frames", "graph_breaks"):
        since[key] = after.get(key, 0) - before.get(key, 0)
    since["break_reasons"] = [r for r in after.get("break_reasons", []) if r not in before.get("break_reasons", [])]
    return since


def add_evaluation(obs: Observations, watch: Watch) -> None:
    """What the watch saw of the loop's evaluation, and how its wait for one ended (Watch.wait_record)."""
    obs.eval_forwards, obs.eval_graph = watch.forwards.eval_forwards, dict(watch.forwards.eval_graph)
    obs.train_mode_eval = watch.forwards.train_mode_check()
    obs.eval_wait = watch.eval_wait


def current_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.Process().memory_info().rss)


def capacity(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)
