"""Where rung processes come from: a fork server that has imported torch and trainfast once.

Importing torch costs about 3 s a process on 2 cores, more than a small rung's training. The server never
runs a model, so nothing but imported code is shared between rungs: no compile cache, allocator or thread
pool. Spawn where fork servers are not available (not POSIX).
"""
from __future__ import annotations

import multiprocessing as mp

# What the server imports before forking: the rung process's whole call tree.
PRELOAD = ["torch", "torch._dynamo", "torch.optim", "trainfast.ablation.rung", "trainfast.run", "trainfast.engine",
           "trainfast.models"]


def rung_context(fresh: bool = False):
    """The multiprocessing context rung processes start from (module docstring). `fresh`: spawned interpreters
    instead, for a plan with a switch read as a runtime loads (passive_threads: OpenMP's wait policy), which a
    fork of the server would inherit as the server started it; ~3 s of imports before each run's first step,
    outside its timed steps."""
    if fresh or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
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
