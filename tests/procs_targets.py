"""Targets for tests/test_procs.py. Spawned children import them by name, so they live in a module."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def report_steps_and_return(steps: int, events) -> dict:
    for step in range(steps):
        events.put({"event": "progress", "step": step})
    return {"answer": 42, "steps": steps}


def fail_with(message: str, events) -> dict:
    print("about to fail", file=sys.stderr)
    raise ValueError(message)


def exit_without_result(how: str, events) -> dict:
    events.put({"event": "progress", "step": 0})
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


def hold_a_semaphore_and_die(events) -> dict:
    """Creates what a DataLoader's queues or a compiler's worker pool create in a run (a named semaphore, which
    multiprocessing's resource tracker tracks), then dies without releasing it, as a run the OOM killer ends."""
    held = mp.get_context("spawn").Lock()
    events.put({"event": "progress", "held": str(held)})
    os.kill(os.getpid(), signal.SIGKILL)


def start_workers_and_hang(pid_file: str, events) -> dict:
    """Starts what a rung starts (a forked Python worker, like a DataLoader's, and an exec'd program), writes
    every pid to `pid_file`, says so in a progress event, then hangs."""
    worker = mp.get_context("fork").Process(target=time.sleep, args=(600,), daemon=True)
    worker.start()
    sleeper = subprocess.Popen(["sleep", "600"])
    pids = {"child": os.getpid(), "worker": worker.pid, "sleeper": sleeper.pid}
    tmp = Path(pid_file + ".tmp")
    tmp.write_text(json.dumps(pids))
    tmp.replace(pid_file)
    events.put({"event": "progress", "pids": pids})
    while True:
        time.sleep(1)


def report_from_rank(events) -> dict:
    """One rank under torch.distributed.elastic: rank 0 reports through the Events it was handed."""
    rank = int(os.environ["RANK"])
    if rank == 0:
        events.put({"event": "progress", "rank": rank})
    return {"rank": rank}


def launch_ranks(nproc: int, events) -> dict:
    """What `ablate --nproc` does inside a rung: elastic workers, each given the rung's Events."""
    from trainfast.distributed import launch_local

    return launch_local(report_from_rank, (events,), nproc)
