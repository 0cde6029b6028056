"""Distributed training on CPU with gloo, launched through torchrun's CLI as bounded subprocesses (the
built-in ablation's rungs under --nproc 2: test_ddp_switches.py). Several worker scenarios share one launch: importing
torch dominates a launch on a loaded 2-core machine."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from conftest import torchrun_env  # noqa: E402
from dist_common import MEAN, STD, make_model, make_split  # noqa: E402

from trainfast import Recipe, RecipeError, train  # noqa: E402
from trainfast.data.datasets import normalize, stats_tensors  # noqa: E402
from trainfast.data.loader import build_loader  # noqa: E402
from trainfast.distributed import Dist, ShardSampler, find_unused_parameters, free_port, rank_threads  # noqa: E402
from trainfast.recipe import validate_for_device  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "dist_worker.py")
LAUNCH_TIMEOUT = 480
STEPS, BATCH, LR = 20, 8, 0.05      # the worker's recipe: 320 samples, 2 ranks x 8 = 16 per step


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        log = proc.communicate(timeout=LAUNCH_TIMEOUT)[0]
    finally:
        proc.kill()
    return proc.returncode, log


def reports(out: Path, scenario: str) -> list[dict]:
    return [json.loads((out / scenario / f"rank{r}.json").read_text()) for r in range(2)]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def start(*args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", *args]
    return subprocess.Popen(cmd, env=torchrun_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def launch(out: Path, scenarios: str, nproc: int = 2) -> subprocess.Popen:
    return start("--nproc-per-node", str(nproc), "--master-port", str(free_port()), WORKER, str(out), scenarios)


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> dict[str, tuple[Path, int, str]]:
    """Every torchrun launch of this file at once (startup is mostly waiting on imports and rendezvous,
    and the hang run waits on its timeout): the scenarios, a run where rank 1 goes silent, two one-process
    "nodes" on localhost (a second ddp run of the same world of two, launched otherwise), and the CLI."""
    outs = {name: tmp_path_factory.mktemp(name) for name in ("main", "hang", "nodes", "cli")}
    rdzv = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "two-nodes", WORKER, str(outs["nodes"]), "ddp"]
    procs = {
        "main": launch(outs["main"], "ddp,accum,fsdp,unused,session,session_fsdp,nan"),
        "hang": launch(outs["hang"], "hang"),
        "nodes": start(*rdzv),
        "node1": start(*rdzv),
        "cli": start("--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "trainfast", "train",
                     "--epochs", "1", "--out", str(outs["cli"] / "run"), "--model", "test_vit", "--data", "synthetic",
                     "--image-size", "16", "--batch-size", "64", "--log-every", "4"),
    }
    return {name: (outs.get(name), *finish(proc)) for name, proc in procs.items()}


@pytest.fixture(scope="module")
def two_procs(launches) -> Path:
    out, _, log = launches["main"]
    # The nan scenario makes the worker exit non-zero on purpose; every scenario must have reported.
    for scenario in ("ddp", "accum", "fsdp", "unused", "session", "session_fsdp", "nan"):
        assert (out / scenario / "rank1.json").exists(), log[-4000:]
    return out


def one_process_reference(steps: int = STEPS, batch: int = 2 * BATCH) -> dict[str, torch.Tensor]:
    """A plain PyTorch loop on one process with the global batch 2B, in DistributedSampler's order for a
    world of one (the same permutation the two ranks split between them)."""
    from torch.utils.data import DistributedSampler

    split = make_split()
    order = list(DistributedSampler(split.train, num_replicas=1, rank=0, shuffle=True, seed=0))
    mean, std = stats_tensors(MEAN, STD)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=0.0)
    for k in range(steps):
        idx = order[k * batch:(k + 1) * batch]
        x = normalize(split.train.images[idx], mean, std)
        y = split.train.labels[idx]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def assert_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=lambda m: f"{k}: {m}")


# --- launched through torchrun ------------------------------------------------------------------------

@pytest.mark.slow
def test_two_processes_match_one_process_with_double_batch(two_procs):
    ranks = reports(two_procs, "ddp")
    assert [r["steps"] for r in ranks] == [STEPS, STEPS]
    reduced = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "step")
    assert [{k: h[k] for k in reduced} for h in ranks[0]["history"]] == \
        [{k: h[k] for k in reduced} for h in ranks[1]["history"]]         # reduced metrics agree on every rank
    assert_close(weights(two_procs / "ddp" / "model.pt"), one_process_reference())


@pytest.mark.slow
def test_grad_accumulation_gives_the_same_update(two_procs):
    # 2 ranks x 2 micro-batches of 4 with no_sync on the first: the same global batch of 16 per update.
    assert reports(two_procs, "accum")[0]["steps"] == STEPS
    assert_close(weights(two_procs / "accum" / "model.pt"), one_process_reference())


@pytest.mark.slow
def test_two_runs_are_bit_identical(two_procs, launches):
    """The second run: the two one-process nodes' (the same world of two, the same ranks, one thread each)."""
    out, code, log = launches["nodes"]
    assert code == 0, log[-4000:]
    first, second = weights(two_procs / "ddp" / "model.pt"), weights(out / "ddp" / "model.pt")
    assert all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.slow
def test_fsdp2_matches_ddp(two_procs):
    assert reports(two_procs, "fsdp")[0]["steps"] == STEPS
    assert_close(weights(two_procs / "fsdp" / "model.pt"), weights(two_procs / "ddp" / "model.pt"))


@pytest.mark.slow
def test_a_session_loop_under_torchrun_shards_its_loader_and_matches_one_process(two_procs):
    """A user's plain shuffled DataLoader, adopted: DistributedSampler with set_epoch, DDP, the reduced log."""
    ranks = reports(two_procs, "session")
    assert [(r["steps"], r["batches"], r["sampler"]) for r in ranks] == [(STEPS, STEPS, "DistributedSampler")] * 2
    assert ranks[0]["logged"] == ranks[1]["logged"] and [w["step"] for w in ranks[0]["logged"]] == [2, 4, 6, 8, 10,
                                                                                                   12, 14, 16, 18, 20]
    assert_close(weights(two_procs / "session" / "model.pt"), one_process_reference())


@pytest.mark.slow
def test_a_session_loop_under_fsdp2_remaps_the_users_optimizer_onto_the_shards(two_procs):
    assert reports(two_procs, "session_fsdp")[0]["steps"] == STEPS
    assert_close(weights(two_procs / "session_fsdp" / "model.pt"), weights(two_procs / "ddp" / "model.pt"))


@pytest.mark.slow
def test_nan_on_one_rank_stops_every_rank_at_the_same_step(two_procs):
    ranks = reports(two_procs, "nan")
    assert all(r["nonfinite"] for r in ranks), ranks
    # The worker poisons rank 1's 5th forward (step index 4); both ranks name that step and that rank.
    for r in ranks:
        assert "on rank(s) 1 at step 4" in r["error"], r["error"]
    assert "loss is nan" in ranks[1]["error"]


@pytest.mark.slow
def test_unused_parameter_is_named_in_the_warning(two_procs):
    ranks = reports(two_procs, "unused")
    warned = [w for w in ranks[0]["warnings"] if "no gradient" in w]
    assert warned and "spare.weight" in warned[0] and "spare.bias" in warned[0]
    assert not any("no gradient" in w for w in ranks[1]["warnings"])      # rank 0 alone logs
    assert ranks[0]["steps"] == STEPS                                      # and training went on


@pytest.mark.slow
def test_two_nodes_on_localhost_train(two_procs, launches):
    out, code, log = launches["nodes"]
    assert (code, launches["node1"][1]) == (0, 0), log[-3000:] + launches["node1"][2][-3000:]
    assert [r["world"] for r in reports(out, "ddp")] == [2, 2]
    # Two one-process nodes are the same world of two as one two-process node: the same weights.
    assert_close(weights(out / "ddp" / "model.pt"), weights(two_procs / "ddp" / "model.pt"))


@pytest.mark.slow
def test_a_silent_rank_is_named_within_the_timeout(launches):
    out, code, log = launches["hang"]        # rank 1 sleeps in its 5th forward; dist_timeout_s=15
    assert code != 0
    error = json.loads((out / "hang" / "rank0.json").read_text())["error"]
    assert "RankTimeoutError" in error and "Ranks 1 failed" in error, error


@pytest.mark.slow
def test_torchrun_cli_train_writes_one_run_folder(launches):
    out, code, log = launches["cli"]
    assert code == 0, log[-4000:]
    run = out / "run"
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl", "model.pt", "recipe.json"]
    record = json.loads((run / "metrics.jsonl").read_text())
    assert record["step"] > 0 and record["val_accuracy"] > 0
    assert log.count("epoch 1:") == 1                                      # printed by rank 0 only


# --- in process ------------------------------------------------------------------------------------

def test_shards_are_disjoint_cover_the_data_and_change_with_set_epoch():
    split = make_split(n=40)
    ranks = [Dist(torch.device("cpu"), rank=r, world_size=2) for r in range(2)]
    samplers = [d.train_sampler(split.train, seed=0) for d in ranks]
    epoch0 = [list(s) for s in samplers]
    assert not set(epoch0[0]) & set(epoch0[1])
    assert sorted(epoch0[0] + epoch0[1]) == list(range(40))
    for d in ranks:
        d.set_epoch(1)
    epoch1 = [list(s) for s in samplers]
    assert epoch1[0] != epoch0[0] and sorted(epoch1[0] + epoch1[1]) == list(range(40))
    # Evaluation shards count every held-out sample exactly once, with no padding.
    val = [list(ShardSampler(split.val, r, 2)) for r in range(2)]
    assert sorted(val[0] + val[1]) == list(range(len(split.val)))


def test_find_unused_parameters_names_them():
    from trainfast.run import first_step_loss
    from trainfast.tasks import build_task

    model = make_model(unused=True)
    loss_of = first_step_loss(build_task("classification", nn.CrossEntropyLoss()), make_split().train, 4,
                              torch.device("cpu"))
    assert find_unused_parameters(model, loss_of, torch.device("cpu")) == ["spare.weight", "spare.bias"]
    assert all(p.grad is None for p in model.parameters())              # probed on a copy


def test_distributed_recipe_fields_are_validated():
    with pytest.raises(RecipeError, match="strategy"):
        Recipe(strategy="zero3")
    with pytest.raises(RecipeError, match="grad_accum_steps"):
        Recipe(grad_accum_steps=0)
    with pytest.raises(RecipeError, match="fsdp"):
        validate_for_device(Recipe(strategy="fsdp", precision="fp16"), torch.device("cpu"))
    with pytest.raises(RecipeError, match="DataParallel"):
        validate_for_device(Recipe(strategy="dp"), torch.device("cpu"))


def test_single_process_fp32_is_bit_identical_to_a_plain_loop():
    split = make_split()
    recipe = Recipe(optimizer="sgd", lr=LR, weight_decay=0.01, batch_size=16, epochs=2, log_every=3)
    result = train(make_model(), split, recipe=recipe, device="cpu")
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=0.01)
    torch.manual_seed(recipe.seed)
    loader = build_loader(split.train, recipe, torch.device("cpu"), True, split)
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    trained = result.model.state_dict()
    assert all(torch.equal(trained[k], v) for k, v in model.state_dict().items())


def test_single_process_grad_accumulation_matches_the_big_batch():
    split = make_split()
    base = Recipe(optimizer="sgd", lr=LR, batch_size=16, log_every=5)
    big = train(make_model(), split, recipe=base, device="cpu").model.state_dict()
    accum = train(make_model(), split, recipe=base.replace(batch_size=8, grad_accum_steps=2), device="cpu")
    assert accum.state.step == 20
    assert_close(accum.model.state_dict(), big)


def test_accumulation_ends_with_the_epoch_in_a_short_update():
    """40 batches per epoch, accumulation 3: updates after batches 3, 6, ..., 39 and a short one after 40
    (its gradient still divided by 3, as Lightning does), so no gradient crosses into the next epoch and
    an epoch-end checkpoint holds the whole state. Checked against a plain loop doing exactly that."""
    split = make_split()
    recipe = Recipe(optimizer="sgd", lr=LR, batch_size=8, epochs=2, grad_accum_steps=3, log_every=5)
    result = train(make_model(), split, recipe=recipe, device="cpu")
    assert result.state.step == 2 * 14 and result.state.accumulated == 0
    assert all(p.grad is None or not p.grad.any() for p in result.model.parameters())   # zeroed after it
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=recipe.weight_decay)
    torch.manual_seed(recipe.seed)
    loader = build_loader(split.train, recipe, torch.device("cpu"), True, split)
    for _ in range(2):
        batches = list(loader)
        for i, (x, y) in enumerate(batches, start=1):
            (nn.functional.cross_entropy(model(x), y) / 3).backward()
            if i % 3 == 0 or i == len(batches):
                opt.step()
                opt.zero_grad()
    assert_close(result.model.state_dict(), model.state_dict())


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nn.DataParallel needs 2 or more CUDA devices")
def test_data_parallel_computes_the_loss_in_each_replica():
    split = make_split()
    recipe = Recipe(optimizer="sgd", lr=LR, batch_size=16, strategy="dp")
    dp = train(make_model(), split, recipe=recipe, device="cuda").model.state_dict()
    one = train(make_model(), split, recipe=recipe.replace(strategy="ddp"), device="cuda").model.state_dict()
    assert_close(dp, one)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nccl DDP needs 2 or more CUDA devices")
def test_nccl_ddp_on_two_gpus(tmp_path):
    proc = start("--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "trainfast", "train",
                 "--epochs", "1", "--out", str(tmp_path / "run"), "--model", "test_vit", "--data", "synthetic",
                 "--image-size", "16", "--batch-size", "64", "--device", "cuda")
    code, log = finish(proc)
    assert code == 0, log[-4000:]
    assert (tmp_path / "run" / "model.pt").exists()


def test_cpu_ranks_share_the_cores_unless_the_user_chose(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert rank_threads({"LOCAL_WORLD_SIZE": "2"}) == 4
    assert rank_threads({"LOCAL_WORLD_SIZE": "16"}) == 1
    assert rank_threads({}) == 8
    assert rank_threads({"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "8"}) is None
