"""Several nodes: where this machine stands in a job of several (`--nnodes`, `--node-rank`, `--rdzv-endpoint`, as
torchrun takes them), and the link that keeps an ablation's runs in lockstep across the nodes.

An ablation over several nodes is the same command started on every node, each with its node rank. Node 0 leads:
it plans the ladder, hosts a small key-value store (torch's TCPStore) at the rendezvous endpoint for the whole
ablation, and before each run says on it what the run is; every other node follows: it runs its share of each run
as one node of that run's torchrun job and leaves when node 0 says the ladder is over. Every run meets at a port of
its own (the endpoint's port + 1 + its index modulo RUN_PORTS) under an id of its own (the ablation's key and the
run's index): both come from the run's place in the ladder, so the nodes' agents of one run find each other and
never a neighbouring run's (whose agents may still be leaving). The run uses torch's static rendezvous, which keeps
the node ranks as given: node 0's first process is global rank 0, the one that reports.

Before any run the nodes greet each other on the link: a node that cannot reach the endpoint, a node count or an
ablation that differs between nodes, and a node that never comes are each refused within the rendezvous timeout
with a message that names them, never a hang. Nothing here imports torch until a link is opened: the CLI reads the
flags before torch loads.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

RDZV_TIMEOUT_S = 300.0          # long enough to start the command on every node by hand
RUN_PORTS = 32                  # the ports above the endpoint's that runs take in turn
END = b"end"                    # what node 0 says at run index n when the ladder is over (then the exit status)
BYE_S = 10.0                    # how long node 0 keeps the link open for the others to read the end


class NodesError(ValueError):
    """A job of several nodes that cannot start or go on: the message names the node, flag or endpoint."""


@dataclass(frozen=True)
class RunNodes:
    """One run's place on several nodes: what its torchrun agent on this node is started with."""
    count: int
    rank: int
    endpoint: str                # node 0's address and this run's own port
    run_id: str
    timeout_s: float

    def torchrun_flags(self) -> list[str]:
        """torchrun's flags for this run (static rendezvous: the node ranks as given)."""
        return [f"--nnodes={self.count}", f"--node-rank={self.rank}", "--rdzv-backend=static",
                f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id={self.run_id}",
                f"--rdzv-conf=timeout={max(1, round(self.timeout_s))}"]

    def launch_options(self) -> dict:
        """torch.distributed.launcher.api.LaunchConfig's fields for this run (what torchrun_flags say)."""
        return dict(min_nodes=self.count, max_nodes=self.count, run_id=self.run_id, rdzv_backend="static",
                    rdzv_endpoint=self.endpoint,
                    rdzv_configs={"rank": self.rank, "timeout": max(1, round(self.timeout_s))})


@dataclass(frozen=True)
class Nodes:
    """This node's place in a job of `count` nodes; one node (the default) is no job of several."""
    count: int = 1
    rank: int = 0
    host: str = ""
    port: int = 0
    timeout_s: float = RDZV_TIMEOUT_S

    @property
    def several(self) -> bool:
        return self.count > 1

    @property
    def leads(self) -> bool:
        """Node 0 plans, reports and writes; the others only take part."""
        return self.rank == 0

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def for_run(self, key: str, index: int) -> RunNodes:
        """Run `index` of the ablation `key`: its own port and id, the same on every node (module docstring)."""
        return RunNodes(self.count, self.rank, f"{self.host}:{self.port + 1 + index % RUN_PORTS}",
                        f"{key}-{index}", self.timeout_s)


def parse_endpoint(text: str, flag: str = "--rdzv-endpoint") -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) -> (host, port); refused naming `flag`."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535 - RUN_PORTS - 1:
        raise NodesError(f"{flag} {text!r} must be HOST:PORT, node 0's address and a free port below "
                         f"{65535 - RUN_PORTS} (the runs take the {RUN_PORTS} ports above it)")
    return host, int(port)


def nodes_from(nnodes: int | None = None, node_rank: int | None = None, endpoint: str | None = None,
               timeout_s: float | None = None, environ: Mapping[str, str] | None = None) -> Nodes:
    """This node's place from the flags, or where a flag is not given from the variables torchrun's users set
    (PET_NNODES, PET_NODE_RANK, PET_RDZV_ENDPOINT: torchrun reads its own flags from them) or a SLURM step's
    (SLURM_STEP_NUM_NODES, SLURM_NODEID, with MASTER_ADDR and MASTER_PORT as the endpoint). Checked before
    anything starts: a rank outside the count, several nodes without an endpoint, a bad endpoint or timeout."""
    env = os.environ if environ is None else environ
    slurm = "SLURM_STEP_NUM_NODES" in env and "SLURM_NODEID" in env
    named = {"--nnodes": nnodes, "--node-rank": node_rank, "--rdzv-endpoint": endpoint}
    if nnodes is None:
        nnodes = read_int(env, "PET_NNODES") or (read_int(env, "SLURM_STEP_NUM_NODES") if slurm else None) or 1
    if nnodes < 1:
        raise NodesError(f"--nnodes {nnodes} must be a positive number of nodes")
    if nnodes == 1:
        given = [flag for flag, value in named.items() if value is not None and flag != "--nnodes"]
        if given:
            raise NodesError(f"{' and '.join(given)} {'place' if len(given) > 1 else 'places'} this node in a job of "
                             "several: give --nnodes N (2 or more) with it, the same on every node")
        return Nodes()
    if node_rank is None:
        node_rank = read_int(env, "PET_NODE_RANK", "SLURM_NODEID" if slurm else None)
    if node_rank is None:
        raise NodesError(f"--nnodes {nnodes} needs --node-rank K on every node (0 on the node that hosts the "
                         f"rendezvous endpoint, 1..{nnodes - 1} on the others)")
    if not 0 <= node_rank < nnodes:
        raise NodesError(f"--node-rank {node_rank} is outside 0..{nnodes - 1} (--nnodes {nnodes})")
    if endpoint is None:
        endpoint = env.get("PET_RDZV_ENDPOINT") or (
            f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if slurm and "MASTER_ADDR" in env and "MASTER_PORT" in env
            else None)
    if endpoint is None:
        raise NodesError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, node 0's address and a free port, "
                         "the same on every node")
    host, port = parse_endpoint(endpoint)
    timeout = RDZV_TIMEOUT_S if timeout_s is None else timeout_s
    if not timeout > 0:
        raise NodesError(f"--rdzv-timeout {timeout!r} must be a positive number of seconds")
    return Nodes(nnodes, node_rank, host, port, float(timeout))


def read_int(env: Mapping[str, str], *names: str | None) -> int | None:
    """The first of `names` set in `env`, as an integer; a range ("1:2", torchrun's elastic node counts) or any
    other text is refused: every run of an ablation needs the same nodes."""
    for name in names:
        if name is not None and env.get(name, "").strip():
            text = env[name].strip()
            if not text.isdigit():
                raise NodesError(f"{name}={text!r} must be a whole number (an ablation needs a fixed node count)")
            return int(text)
    return None


def ablation_key(identity: Mapping) -> str:
    """A short name for one ablation, the same on every node started with the same command: what its runs'
    rendezvous ids start with, and how a node started with another command is told apart."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return "tf" + hashlib.sha1(text.encode()).hexdigest()[:10]


class NodeLink:
    """The ablation's own store at the rendezvous endpoint (module docstring): hosted by node 0 for the whole
    ablation, joined by the others; `open` greets, `say` / `hear` pass each run's order, `close` ends."""

    def __init__(self, nodes: Nodes, key: str, store) -> None:
        self.nodes, self.key, self.store = nodes, key, store

    @classmethod
    def open(cls, nodes: Nodes, key: str) -> "NodeLink":
        """Node 0 hosts the store and waits for every other node's greeting; the others reach it, greet and wait
        for node 0's verdict. Each step is bounded by the rendezvous timeout; a refusal is said on every node."""
        from torch.distributed import DistError, TCPStore

        timeout = timedelta(seconds=nodes.timeout_s)
        try:
            store = TCPStore(nodes.host, nodes.port, is_master=nodes.leads, timeout=timeout,
                             wait_for_workers=False)
        except (DistError, RuntimeError) as exc:
            if nodes.leads:
                raise NodesError(f"node 0 cannot host the rendezvous at {nodes.endpoint} (--rdzv-endpoint): {exc}; "
                                 "node 0 runs on that host, and the port must be free") from None
            raise NodesError(f"node {nodes.rank} cannot reach the rendezvous endpoint {nodes.endpoint} within "
                             f"{nodes.timeout_s:g} s (--rdzv-timeout): start node 0 first (--node-rank 0 on the host "
                             f"of --rdzv-endpoint) and check the address and port") from None
        link = cls(nodes, key, store)
        link.greet()
        return link

    def greet(self) -> None:
        mine = json.dumps({"key": self.key, "nnodes": self.nodes.count, "node": self.nodes.rank})
        if not self.nodes.leads:
            if self.store.add(f"joined/{self.nodes.rank}", 1) > 1:
                raise NodesError(f"another node already joined as --node-rank {self.nodes.rank}: give every node "
                                 "its own rank")
            self.store.set(f"hello/{self.nodes.rank}", mine)
            verdict = self.wait_for("verdict", "node 0 did not answer")
            if verdict != b"ok":
                raise NodesError(verdict.decode())
            return
        others = [f"hello/{k}" for k in range(1, self.nodes.count)]
        try:
            self.store.wait(others, timedelta(seconds=self.nodes.timeout_s))
        except RuntimeError:
            missing = [str(k) for k, name in enumerate(others, 1) if not self.store.check([name])]
            raise NodesError(
                f"--nnodes {self.nodes.count}: node(s) {', '.join(missing)} did not join the rendezvous at "
                f"{self.nodes.endpoint} within {self.nodes.timeout_s:g} s (--rdzv-timeout): start the same command "
                f"on every node with its --node-rank, or give the number of nodes you start") from None
        problem = self.judge([json.loads(self.store.get(name)) for name in others])
        self.store.set("verdict", problem or "ok")
        if problem:
            raise NodesError(problem)

    def judge(self, hellos: list[dict]) -> str | None:
        """Node 0's verdict on the others' greetings: the same node count and the same ablation everywhere."""
        for hello in hellos:
            if hello["nnodes"] != self.nodes.count:
                return (f"the nodes disagree on the node count: node 0 has --nnodes {self.nodes.count}, node "
                        f"{hello['node']} has --nnodes {hello['nnodes']}")
            if hello["key"] != self.key:
                return (f"node {hello['node']} was started with another ablation than node 0 (its ladder, workload "
                        "or settings differ): start the same command on every node")
        return None

    def wait_for(self, name: str, what: str, timeout_s: float | None = None) -> bytes:
        try:
            self.store.wait([name], timedelta(seconds=timeout_s or self.nodes.timeout_s))
            return self.store.get(name)
        except RuntimeError as exc:
            raise NodesError(f"node {self.nodes.rank}: {what} at {self.nodes.endpoint}: {exc}") from None

    def say(self, index: int, order: bytes) -> None:
        """Node 0: run `index` is `order` (what the others need to start their share of it)."""
        self.store.set(f"{self.key}/run/{index}", order)

    def hear(self, index: int, wait_s: float) -> bytes:
        """The others: run `index`'s order, or END + the exit status once the ladder is over. Node 0 says the next
        run within a run's time; a node 0 that has gone ends the wait with an error that says so."""
        return self.wait_for(f"{self.key}/run/{index}", f"no word from node 0 for run {index} (it ended or is "
                             "unreachable)", wait_s)

    def close(self, index: int, status: int) -> None:
        """Node 0: the ladder is over at run `index`; the others are given BYE_S to read it before the store goes.
        The others: say they read it."""
        if self.nodes.leads:
            self.say(index, END + str(status).encode())
            others = [f"{self.key}/bye/{k}" for k in range(1, self.nodes.count)]
            try:
                self.store.wait(others, timedelta(seconds=BYE_S))
            except RuntimeError:
                pass             # a node that left early has nothing more to read
        else:
            self.store.set(f"{self.key}/bye/{self.nodes.rank}", b"1")
