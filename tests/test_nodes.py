"""Several nodes: the flags and variables that place a node, each run's rendezvous derived alike on every node, the
lockstep of node 0 and the others (in one process, over a real store), the refusals of a rendezvous that cannot
complete, bounded in time; then, slow, two torchrun agents on this machine as two nodes: `trainfast train` (each
global rank its own shard, one writer, resumed from the shared folder) and `trainfast ablate` as two node commands."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainfast.ablation.nodes import Followed, follow, identity, lead
from trainfast.distributed import free_port
from trainfast.launch import Command
from trainfast.nodes import RUN_PORTS, NodeLink, Nodes, NodesError, ablation_key, nodes_from
from trainfast.recipe import Recipe
from trainfast.results import Rung

ROOT = Path(__file__).resolve().parents[1]
SHORT_S = 1.0          # the rendezvous timeout of the fault tests
# What a refusal may take beyond the timeout: the store's connection retries, the greeting's round trips
SLACK_S = 4.0


# --- placing a node --------------------------------------------------------------------------------

def test_a_node_is_placed_by_its_flags_or_by_torchrun_and_slurm_variables():
    assert nodes_from(environ={}) == Nodes()
    assert nodes_from(2, 1, "10.0.0.5:29500", 30, environ={}) == Nodes(2, 1, "10.0.0.5", 29500, 30.0)
    torchrun = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_RDZV_ENDPOINT": "node0:29500"}
    assert nodes_from(environ=torchrun) == Nodes(2, 1, "node0", 29500)
    assert nodes_from(node_rank=0, environ=torchrun).rank == 0                    # a flag wins over a variable
    slurm = {"SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1", "MASTER_ADDR": "n0", "MASTER_PORT": "29400"}
    assert nodes_from(environ=slurm) == Nodes(2, 1, "n0", 29400)
    assert nodes_from(environ={"SLURM_NODEID": "1", "MASTER_ADDR": "n0"}) == Nodes()   # no step: not a job of nodes


@pytest.mark.parametrize("flags, env, message", [
    ((2, None, "h:1"), {}, "--nnodes 2 needs --node-rank K"),
    ((2, 2, "h:1"), {}, "--node-rank 2 is outside 0..1"),
    ((2, 0, None), {}, "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
    ((None, 1, None), {}, "--node-rank places this node in a job of several: give --nnodes N"),
    ((2, 0, "node0"), {}, "--rdzv-endpoint 'node0' must be HOST:PORT"),
    ((2, 0, "h:65530"), {}, "--rdzv-endpoint 'h:65530' must be HOST:PORT"),      # no room for its runs' ports
    ((2, 0, "h:1", 0.0), {}, "--rdzv-timeout 0.0 must be a positive number"),
    ((None, None, None), {"PET_NNODES": "1:2"}, "PET_NNODES='1:2' must be a whole number"),
])
def test_a_node_that_cannot_be_placed_is_refused_naming_the_flag(flags, env, message):
    with pytest.raises(NodesError, match="^" + message.replace("(", r"\(").replace(".", r"\.").replace("?", r"\?")):
        nodes_from(*flags, environ=env)


def test_the_ablate_command_line_places_the_node_before_torch_loads():
    from trainfast.cli import main

    assert main(["ablate", "--nnodes", "2", "--node-rank", "0"]) == 2      # no endpoint: refused, nothing run
    from trainfast.cliflags import check_before_torch, parse_command_line

    args = parse_command_line(["ablate", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "n0:29500",
                               "--rdzv-timeout", "30s"])
    check_before_torch(args)
    assert args.nodes == Nodes(2, 1, "n0", 29500, 30.0)


# --- each run's rendezvous -------------------------------------------------------------------------

def test_every_node_derives_the_same_rendezvous_for_a_run_and_a_new_one_for_the_next():
    leader, other = Nodes(2, 0, "n0", 29500), Nodes(2, 1, "n0", 29500)
    first, same = leader.for_run("tfkey", 3), other.for_run("tfkey", 3)
    assert (first.endpoint, first.run_id) == (same.endpoint, same.run_id) == ("n0:29504", "tfkey-3")
    assert (first.rank, same.rank) == (0, 1)
    assert leader.for_run("tfkey", 4).endpoint == "n0:29505"                       # the next run: its own port
    assert leader.for_run("tfkey", 3 + RUN_PORTS).endpoint == first.endpoint          # taken in turn
    assert first.torchrun_flags() == ["--nnodes=2", "--node-rank=0", "--rdzv-backend=static",
                                      "--rdzv-endpoint=n0:29504", "--rdzv-id=tfkey-3", "--rdzv-conf=timeout=300"]
    assert same.launch_options()["rdzv_configs"] == {"rank": 1, "timeout": 300}
    # a command's run: torchrun with this node's place instead of --standalone
    argv = Command(("python", "train.py", "--lr", "1"), 2, nodes=same).launch_argv()
    assert argv[:3] == ["python", "-m", "torch.distributed.run"] and "--standalone" not in argv
    assert argv[3:] == [*same.torchrun_flags(), "--nproc-per-node=2", "train.py", "--lr", "1"]


def test_the_ablation_key_is_the_same_for_the_same_ladder_and_workload_only():
    plan = [Rung("baseline", {}, Recipe()), Rung("fused", {"optimizer_impl": "fused"}, Recipe())]
    settings = {"model": "test_vit", "data": "synthetic", "cwd": "/home/a", "repeats": 1}
    key = ablation_key(identity(plan, settings))
    assert key == ablation_key(identity(plan, {**settings, "cwd": "/home/b"}))     # folders may differ
    assert key != ablation_key(identity(plan[:1], settings))
    assert key != ablation_key(identity(plan, {**settings, "repeats": 2}))


# --- lockstep, in one process over a real store --------------------------------------------------

@dataclasses.dataclass
class FakeWork:
    """A command's work as the lockstep sees it: what its launcher was asked to start, and where."""
    cmd: Command = Command(("python", "t.py"))
    target: object = None
    cap_seen: float | None = None
    launched: list = dataclasses.field(default_factory=list)

    def launcher(self, measure):
        def launch(rung, recipe, budget, run_dir, display, limit):
            self.launched.append((rung.name, recipe.seed, budget, limit, self.target, self.cmd.nodes))
            return {"throughput": 1.0}
        return launch


class FakeLadder:
    """LadderRun's face to lead(): its plan, settings, work and launches; run() starts three runs, the loop
    aiming its work at a target between the first and the second."""

    def __init__(self, plan, work):
        self.plan, self.work, self.settings = plan, work, {"command": ["python", "t.py"]}
        self.launches = type("Launches", (), {"launch": None})()
        self.launches.launch = work.launcher("speed")

    def run(self):
        for seed, rung in enumerate((self.plan[0], self.plan[1], self.plan[0])):
            self.launches.launch(rung, rung.recipe.replace(seed=seed), None, Path("."), None, 60.0)
            self.work.target = "val_loss<=1"
        return type("Result", (), {"best": "fused", "rungs": []})()


def test_the_other_node_runs_each_run_node_0_announces_in_lockstep(tmp_path):
    plan = [Rung("baseline", {}, Recipe()), Rung("fused", {"optimizer_impl": "fused"}, Recipe())]
    port = free_port()
    leader, other = FakeWork(), FakeWork()
    followed = {}
    thread = threading.Thread(target=lambda: followed.update(
        result=follow(plan, other, {"command": ["python", "t.py"]}, "speed", Nodes(2, 1, "127.0.0.1", port, 20.0),
                      say=lambda text: None)))
    thread.start()
    lead(FakeLadder(plan, leader), Nodes(2, 0, "127.0.0.1", port, 20.0))
    thread.join(30)
    assert followed["result"] == Followed(0)                                   # node 0's exit status
    mine = [entry[:5] for entry in leader.launched]
    assert mine == [entry[:5] for entry in other.launched] == [
        ("baseline", 0, None, 60.0, None), ("fused", 1, None, 60.0, "val_loss<=1"),
        ("baseline", 2, None, 60.0, "val_loss<=1")]                           # the work's state travels too
    for index, (ours, theirs) in enumerate(zip(leader.launched, other.launched)):
        assert (ours[5].rank, theirs[5].rank) == (0, 1)
        assert ours[5].endpoint == theirs[5].endpoint == f"127.0.0.1:{port + 1 + index}"
        assert ours[5].run_id == theirs[5].run_id


# --- a rendezvous that cannot complete: refused, in bounded time -------------------------------------

def refused(nodes: Nodes, key: str = "tfkey") -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(NodesError) as caught:
        NodeLink.open(nodes, key)
    return str(caught.value), time.monotonic() - started


def test_an_unreachable_endpoint_is_refused_within_the_timeout():
    port = free_port()                                          # nothing listens there
    message, took = refused(Nodes(2, 1, "127.0.0.1", port, SHORT_S))
    assert message.startswith(f"node 1 cannot reach the rendezvous endpoint 127.0.0.1:{port} within 1 s "
                              "(--rdzv-timeout): start node 0 first"), message
    assert took < SHORT_S + SLACK_S, took


def test_a_node_that_never_comes_is_named_within_the_timeout():
    message, took = refused(Nodes(2, 0, "127.0.0.1", free_port(), SHORT_S))
    assert message.startswith("--nnodes 2: node(s) 1 did not join the rendezvous at 127.0.0.1:"), message
    assert took < SHORT_S + SLACK_S, took


@pytest.mark.parametrize("count, key, message", [
    (3, "tfkey", "the nodes disagree on the node count: node 0 has --nnodes 2, node 1 has --nnodes 3"),
    (2, "tfother", "node 1 was started with another ablation than node 0"),
])
def test_nodes_that_disagree_are_refused_on_every_node(count, key, message):
    port = free_port()
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(other=refused(Nodes(count, 1, "127.0.0.1", port, 5.0), key)))
    thread.start()
    mine, took = refused(Nodes(2, 0, "127.0.0.1", port, 5.0))
    thread.join(10)
    assert mine.startswith(message) and seen["other"][0].startswith(message), (mine, seen)
    assert took < 5.0 and seen["other"][1] < 5.0 + SLACK_S


@pytest.mark.slow
def test_node_0_refuses_a_missing_node_from_the_command_line_before_any_folder_is_made(tmp_path, capsys):
    from trainfast.cli import main

    out = tmp_path / "report"
    started = time.monotonic()
    code = main(["ablate", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                 "--rdzv-timeout", "1", "--out", str(out), "--repeats", "1", "--",
                 sys.executable, str(ROOT / "tests" / "scripts" / "plain_loop.py")])
    took = time.monotonic() - started
    assert code == 2 and "node(s) 1 did not join the rendezvous" in capsys.readouterr().err
    assert not out.exists()
    assert took < 30, took          # the command's checks (one Python started), then the 1 s rendezvous


# --- two torchrun agents on this machine as two nodes (slow) ---------------------------------------

def two_nodes(*args: str, env: dict[str, str], logs: Path, timeout: float = 600) -> list[tuple[int, str]]:
    """`python ARGS` with {K} = 0, 1, started together; (exit status, output) of each. The output goes to files
    (a pipe nobody reads while both run would fill and stop the node that writes the most)."""
    logs.mkdir(parents=True, exist_ok=True)
    files = [open(logs / f"node{k}.log", "w+") for k in (0, 1)]
    procs = [subprocess.Popen([sys.executable, *(a.replace("{K}", str(k)) for a in args)], env=env, cwd=ROOT,
                              stdout=files[k], stderr=subprocess.STDOUT, text=True) for k in (0, 1)]
    try:
        codes = [p.wait(timeout) for p in procs]
        return [(code, (logs / f"node{k}.log").read_text()) for k, code in enumerate(codes)]
    finally:
        for p, f in zip(procs, files):
            p.kill()
            f.close()


def node_env(**extra: str) -> dict[str, str]:
    from conftest import torchrun_env

    return {**torchrun_env(), **extra}


TRAIN = ["--model", "test_vit", "--data", "synthetic", "--image-size", "16", "--batch-size", "64", "--log-every", "4"]


def train_on_two_nodes(out: Path, shards: Path, *flags: str) -> list[tuple[int, str]]:
    shards.mkdir(parents=True)
    return two_nodes("-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "{K}", "--nproc-per-node", "1",
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "train",
                     str(ROOT / "tests" / "scripts" / "node_train.py"), *TRAIN, "--out", str(out), *flags,
                     env=node_env(SHARD_DIR=str(shards)), logs=shards)


@pytest.mark.slow
def test_train_on_two_nodes_gives_each_global_rank_its_shard_writes_once_and_resumes(tmp_path):
    run = tmp_path / "shared" / "run"                     # the folder both nodes see
    first = train_on_two_nodes(run, tmp_path / "shards1", "--epochs", "1")
    assert [code for code, _ in first] == [0, 0], first[0][1][-3000:] + first[1][1][-3000:]
    ranks = [json.loads((tmp_path / "shards1" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert {r["node"] for r in ranks} == {"0", "1"}                              # one rank on each node
    shards = [r["epochs"][0] for r in ranks]
    assert [s["sampler_rank"] for s in shards] == [0, 1]                         # the global rank, not the local
    assert shards[0]["indices"] and not set(shards[0]["indices"]) & set(shards[1]["indices"])
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl", "model.pt", "recipe.json"]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1            # one writer: one epoch, one line
    assert sum(log.count("epoch 1:") for _, log in first) == 1
    # resumed from the shared folder: the second epoch only, written once again
    second = train_on_two_nodes(run, tmp_path / "shards2", "--epochs", "2", "--resume")
    assert [code for code, _ in second] == [0, 0], second[0][1][-3000:] + second[1][1][-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2], records
    assert sum(log.count("epoch 2:") for _, log in second) == 1
    assert not any("epoch 1:" in log for _, log in second)


@pytest.mark.slow
def test_ablate_as_two_node_commands_writes_one_results_folder_with_every_rung_on_both_nodes(tmp_path):
    outs = [tmp_path / "node0", tmp_path / "node1"]
    nodes = two_nodes("-m", "trainfast", "ablate", *TRAIN, "--epochs", "1", "--switches", "fused", "--repeats", "1",
                      "--noise-seeds", "1", "--settle-within", "0", "--timing-steps", "4", "--device", "cpu",
                      "--nnodes", "2", "--node-rank", "{K}", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                      "--rdzv-timeout", "60", "--out", str(tmp_path / "node{K}"), env=node_env(),
                      logs=tmp_path / "logs")
    assert [code for code, _ in nodes] == [0, 0], nodes[0][1][-3000:] + nodes[1][1][-3000:]
    assert not outs[1].exists()                                          # node 1 writes nothing
    assert "node 1 of 2: joined node 0" in nodes[1][1]
    rungs = json.loads((outs[0] / "results.json").read_text())["rungs"]
    assert [r["name"] for r in rungs] == ["baseline", "fused"]
    for rung in rungs:
        run = rung["runs"][0]
        assert run["world_size"] == 2 and [r["rank"] for r in run["ranks"]["ranks"]] == [0, 1], rung["name"]


def test_only_global_rank_0_tries_making_the_shared_run_folder(tmp_path):
    from trainfast.cliargs import check_out_folder

    out = tmp_path / "shared" / "run"
    check_out_folder(out, fresh=True, probe=False)          # another rank: nothing made, so nothing to remove
    assert not (tmp_path / "shared").exists()
    out.mkdir(parents=True)                                  # rank 0 made it for real meanwhile: left alone
    check_out_folder(out, fresh=True, probe=False)
    assert out.is_dir()
