"""An ablation on several nodes (`--nnodes N --node-rank K --rdzv-endpoint HOST:PORT`): the same ladder in lockstep.

Node 0 runs the ladder as on one node (the loop, its scores, its report folder) with one change: before each run it
tells the other nodes what the run is (its rung, recipe, timing budget and time limit, and what the loop has set on
the work since it was prepared: --target's aim, the paired reference), and every run is a job of all the nodes,
met at that run's own endpoint (nodes.Nodes.for_run). The other nodes plan nothing and write nothing: each runs its
share of every run node 0 announces, through the same launcher node 0 uses, in a temporary folder, and exits with
node 0's exit status when node 0 says the ladder is over.

The orders are pickled: the link is the job's own, as torch.distributed's object collectives are.
"""
from __future__ import annotations

import dataclasses
import itertools
import pickle
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..launch import NO_RESULT
from ..nodes import END, NodeLink, Nodes, ablation_key
from ..results import Rung

# How long a following node waits for node 0's next order: node 0 announces each run as the one before ends (its
# scoring takes seconds), and a node 0 that has gone ends the wait with an error sooner.
NEXT_ORDER_S = 24 * 3600.0


@dataclass
class Followed:
    """What ablate() returns on a following node: nothing measured here; node 0's exit status."""
    exit_code: int
    follower: bool = True


@dataclass(frozen=True)
class Order:
    """One run as node 0 announces it."""
    rung: Rung
    recipe: Any
    budget: Any
    limit: float | None
    state: dict[str, Any]


def identity(plan: list[Rung], settings: dict[str, Any]) -> dict[str, Any]:
    """What every node's ablation must share to run in lockstep: its rungs and workload. Folders and the measured
    worker count are left out (they may differ between nodes; node 0's recipe reaches every run)."""
    keep = ("model", "data", "image_size", "task", "command", "nproc", "mode", "measure", "repeats", "noise_seeds")
    return {"rungs": [r.name for r in plan], **{k: settings.get(k) for k in keep}}


def work_state(work) -> dict[str, Any]:
    """What the loop sets on the work after it was prepared, which each run's launch reads."""
    job = getattr(work, "job", None)
    if job is not None:
        return {"curve": job.curve, "reference": job.reference}
    return {"target": getattr(work, "target", None), "cap_seen": getattr(work, "cap_seen", None)}


def place(work, state: dict[str, Any] | None, run_nodes) -> None:
    """The work's next run is this node's share of `run_nodes`' run (with node 0's `state`, on a following node)."""
    job = getattr(work, "job", None)
    if job is not None:
        work.job = dataclasses.replace(job, nodes=run_nodes, **(state or {}))
        return
    work.cmd = dataclasses.replace(work.cmd, nodes=run_nodes)
    for name, value in (state or {}).items():
        setattr(work, name, value)


def lead(ladder, nodes: Nodes) -> Any:
    """Node 0: the ladder run with every run announced to the other nodes first; they are told the end, whatever
    way it comes (a finished ladder, a failure, Ctrl-C), with the exit status the CLI gives."""
    key = ablation_key(identity(ladder.plan, ladder.settings))
    link = NodeLink.open(nodes, key)
    launch, work, count = ladder.launches.launch, ladder.work, itertools.count()

    def launch_on_nodes(rung: Rung, recipe, budget, run_dir: Path, display, limit):
        index = next(count)
        order = Order(dataclasses.replace(rung, repeats=[], seed_runs=[]), recipe, budget, limit, work_state(work))
        link.say(index, pickle.dumps(order))
        place(work, None, nodes.for_run(key, index))
        return launch(rung, recipe, budget, run_dir, display, limit)

    ladder.launches.launch = launch_on_nodes
    status = 1
    try:
        result = ladder.run()
        status = 0 if result.best is not None and all(r.status != "failed" for r in result.rungs) else 1
        return result
    except KeyboardInterrupt:
        status = 130
        raise
    finally:
        link.close(next(count), status)


class Unseen:
    """A following node's display: node 0 shows the runs."""

    def progress(self, rung, event) -> None:
        pass


def follow(plan: list[Rung], work, settings: dict[str, Any], measure: str, nodes: Nodes,
           say: Callable[[str], None] = lambda text: print(text, file=sys.stderr)) -> Followed:
    """A following node: its share of every run node 0 announces, until node 0 says the end."""
    key = ablation_key(identity(plan, settings))
    link = NodeLink.open(nodes, key)
    launch = work.launcher(measure)
    say(f"node {nodes.rank} of {nodes.count}: joined node 0 at {nodes.endpoint}; node 0 writes the results")
    with tempfile.TemporaryDirectory(prefix="trainfast-node-") as folder:
        for index in itertools.count():
            told = link.hear(index, NEXT_ORDER_S)
            if told.startswith(END):
                link.close(index, 0)
                return Followed(int(told[len(END):] or 0))
            order: Order = pickle.loads(told)
            place(work, order.state, nodes.for_run(key, index))
            run_dir = Path(folder) / f"run{index}"
            run_dir.mkdir()
            result = launch(order.rung, order.recipe, order.budget, run_dir, Unseen(), order.limit)
            if "error" in result and NO_RESULT not in result["error"]:     # node 0's rank 0 writes the result
                say(f"node {nodes.rank}: its share of run {index} ({order.rung.name}) failed: {result['error']}\n"
                    f"{result.get('log_tail', '')}")
    raise AssertionError("itertools.count() ended")
