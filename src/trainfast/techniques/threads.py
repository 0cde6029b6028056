"""passive_threads: the step's idle OpenMP threads sleep at once instead of spinning.

PyTorch runs its CPU kernels on an OpenMP thread pool (GNU libgomp in the Linux wheels). Between two parallel
regions an idle thread of the pool spins for a while before it sleeps: the fastest wake-up when the process has
its cores to itself. DataLoader workers are other processes on the same cores, and every spin is CPU time a
worker does not get for decoding the next batch; a worker that then preempts a thread of the pool holds up the
whole parallel region. OMP_WAIT_POLICY=PASSIVE makes idle threads sleep at once. The arithmetic is unchanged
(same kernels, same results). What it buys depends on how busy the workers are (docs/benchmarks/host-switches.md has a
measurement); with no workers nothing else wants the cores and spinning costs nothing.

OpenMP reads the variable once, when its runtime loads with torch, so it belongs to a process's start: the
built-in `trainfast train` sets it before it imports torch, the ablation starts a rung's process (and a user's
command) with it, and a trainfast.Session inside an already running process can only say whether its process
was started with it. `in_effect()` is the read-back: the environment the process started with.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Mapping

from .switch import ADAPTERS, ProcessWideSwitch, RunContext, RungSpec, Switch

if TYPE_CHECKING:
    from .base import Effect

ENV = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"
FIELD = "passive_threads"
NO_WORKERS_NOTE = ("no loader worker processes share the cores with the step's threads (num_workers=0): idle "
                   "threads spin on cores nothing else wants")
NOT_AT_START = ("passive_threads: OMP_WAIT_POLICY is read once, when PyTorch loads, and this process started "
                "without it, so its threads still spin; start the process with OMP_WAIT_POLICY=PASSIVE "
                "(trainfast train and trainfast ablate do)")

_passive_at_load = False       # set_before_torch() saw OMP_WAIT_POLICY=PASSIVE in place before torch loaded


def wanted(fields: Mapping[str, Any] | Any) -> bool:
    """Whether a recipe (or a run's dict of switched fields) asks for passive threads."""
    return bool(fields.get(FIELD) if isinstance(fields, Mapping) else getattr(fields, FIELD, False))


def set_before_torch() -> bool:
    """Put OMP_WAIT_POLICY=PASSIVE in this process's environment if torch is not loaded yet (the variable would
    be read too late otherwise). A value the user set is left alone. True if the policy will be passive."""
    global _passive_at_load
    if "torch" in sys.modules:
        return in_effect()
    os.environ.setdefault(ENV, PASSIVE)
    _passive_at_load = os.environ[ENV].upper() == PASSIVE
    return _passive_at_load


def started_env() -> dict[str, str]:
    """The environment this process was started with (Linux: /proc/self/environ, which later changes to
    os.environ do not touch); elsewhere the current one."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return dict(os.environ)
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def in_effect() -> bool:
    """Whether this process's OpenMP threads sleep when idle: it started with OMP_WAIT_POLICY=PASSIVE, or
    set_before_torch() set it before torch loaded."""
    return _passive_at_load or started_env().get(ENV, "").upper() == PASSIVE


def effect() -> Effect:
    """Acts where PyTorch's CPU threads are an OpenMP pool (the Linux and Windows wheels; a build on its native
    pool reads no OpenMP variable). (torch is imported here, not at the top: the CLI reads this module before.)"""
    import torch

    from .base import ACTS, Effect

    if "OpenMP" not in torch.__config__.parallel_info().split("ATen parallel backend:")[-1]:
        return Effect(False, "this PyTorch build runs its CPU threads on its native pool, not OpenMP")
    return ACTS


def workers_effect(run: RunContext) -> Effect:
    """With no loader workers nothing else wants the cores the idle threads spin on: nothing to give back."""
    from .base import ACTS, Effect

    return Effect(False, NO_WORKERS_NOTE, applies=False) if run.workers == 0 else ACTS


def slower_note(num_workers: int) -> str:
    """Why passive threads made a measured loop slower, from the loader workers its runs had beside the step."""
    if num_workers == 0:
        return ("slower, and no loader worker process ran beside the step (none seen at its steps): nothing needed "
                "the cores the sleeping threads gave up, and every parallel region waited for them to wake; leave it "
                "off for this loop (it can pay where loader workers share the cores)")
    return (f"slower with {num_workers} loader worker process(es) beside the step: waking the sleeping threads for "
            "every parallel region cost more than the cores the workers got back")


SWITCHES = (
    Switch((FIELD,),
           rungs=(RungSpec(FIELD, {FIELD: True}, place=44, tune=7),),
           own_process=True, resumable=True,
           device_effect=lambda device: effect(),
           context_effect=workers_effect,
           process_wide=ProcessWideSwitch(ENV, environ=lambda: {ENV: PASSIVE}, in_effect=in_effect,
                                       before_torch=set_before_torch, late=NOT_AT_START,
                                       keep=f"start the script with {ENV}={PASSIVE} in its environment"),
           frameworks={name: f"{ENV} in the environment the process starts with" for name in ADAPTERS}),
)
