"""Kill a training run (SIGKILL) in the middle of an epoch, resume it, and compare with a run that was
never interrupted (run at the same time, in its own folder: the two share nothing but the cores): every tensor of
model, optimizer, scheduler and scaler bit-identical, and the losses logged after the resume identical."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from trainfast import Recipe
from trainfast.checkpoint import list_checkpoints, read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH, EPOCHS, SAVE_EVERY = 20, 2, 5


def run_child(out: Path, recipe: Recipe, kill_steps: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, str(ROOT / "tests" / "resume_child.py"), str(out),
                           json.dumps(recipe.to_dict()), ",".join(map(str, kill_steps))],
                          env=env, capture_output=True, text=True, timeout=300)


def step_losses(path: Path) -> dict[int, float]:
    """step -> loss; a step logged twice (before the kill and again after the resume) must agree."""
    seen: dict[int, float] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        assert seen.setdefault(rec["step"], rec["loss"]) == rec["loss"], f"step {rec['step']} logged twice, differently"
    return seen


def assert_tree_equal(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_tree_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_tree_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.slow
@pytest.mark.parametrize("num_workers,seed", [(0, 1), (2, 2)])
def test_sigkill_mid_epoch_then_resume_is_bit_exact(tmp_path, num_workers, seed):
    # With workers, persistent ones: their DataLoader draws its base seed once, which the data-order
    # state must account for when a resume starts a fresh iterator.
    recipe = Recipe(epochs=EPOCHS, batch_size=16, precision="fp16", warmup_steps=7, log_every=1,
                    save_every=SAVE_EVERY, keep_checkpoints=2, num_workers=num_workers,
                    persistent_workers=num_workers > 0, seed=seed)
    # Kill 1: a seeded step inside the first epoch, not on a checkpoint: the resume continues mid-epoch
    # and redoes the steps since the last save. Kill 2: just after the epoch-end checkpoint.
    kills = (random.Random(seed).choice([s for s in range(SAVE_EVERY + 1, STEPS_PER_EPOCH) if s % SAVE_EVERY]),
             STEPS_PER_EPOCH + 2)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    with ThreadPoolExecutor(1) as beside:        # the uninterrupted run beside the killed one: its own folder
        uninterrupted = beside.submit(run_child, straight, recipe)
        for kill_step in kills:
            run = run_child(killed, recipe, kills)
            assert run.returncode == -signal.SIGKILL, run.stderr
            saved = max(int(p.stem.split("-")[1]) for p in list_checkpoints(killed / "checkpoints"))
            assert saved == kill_step - kill_step % SAVE_EVERY
        last = run_child(killed, recipe, kills)
        done = uninterrupted.result()
    assert done.returncode == 0, done.stderr
    assert last.returncode == 0, last.stderr
    assert f"resumed from step-{STEPS_PER_EPOCH:09d}.ckpt (step {STEPS_PER_EPOCH}, epoch 2, batch 0" in last.stderr

    a = read_checkpoint(list_checkpoints(straight / "checkpoints")[0])
    b = read_checkpoint(list_checkpoints(killed / "checkpoints")[0])
    assert a["step"] == b["step"] == STEPS_PER_EPOCH * EPOCHS
    for part in ("model", "optimizer", "scheduler", "precision", "ranks"):
        assert_tree_equal(a[part], b[part], part)
    assert a["precision"]["scaler"]["scale"] > 0            # fp16: the GradScaler state took part
    losses_a, losses_b = step_losses(straight / "losses.jsonl"), step_losses(killed / "losses.jsonl")
    assert sorted(losses_a) == list(range(1, STEPS_PER_EPOCH * EPOCHS + 1))
    assert losses_a == losses_b
    # The epoch records (including the resumed epoch's mean train loss) are identical too.
    records = [(straight / "metrics.jsonl").read_text().splitlines(),
               (killed / "metrics.jsonl").read_text().splitlines()]

    def strip(r):
        return {k: v for k, v in json.loads(r).items() if k not in ("epoch_time_s", "data_wait_s")}

    assert [strip(r) for r in records[0]] == [strip(r) for r in records[1]]


def run_torchrun(out: Path, kill_rank: int = -1, kill_step: int = -1) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    out.mkdir(parents=True)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "1", str(ROOT / "tests" / "dist_child.py"), str(out), str(kill_rank),
                           str(kill_step)], env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
def test_torchrun_restart_after_a_killed_rank_matches_uninterrupted_run(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    kill_step = random.Random(5).choice([7, 9, 11, 13, 15])          # mid-epoch (10 steps per epoch), not a save
    with ThreadPoolExecutor(1) as beside:        # the uninterrupted job beside the killed one: its own folder, port
        uninterrupted = beside.submit(run_torchrun, straight)
        restarted = run_torchrun(killed, kill_rank=1, kill_step=kill_step)
        done = uninterrupted.result()
    assert done.returncode == 0, done.stderr[-3000:]
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert (killed / "killed-once").exists()
    assert "resumed from step-" in restarted.stderr                   # the restarted workers continued
    a = torch.load(straight / "model.pt", weights_only=True)
    b = torch.load(killed / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ca = read_checkpoint(list_checkpoints(straight / "checkpoints")[0])
    cb = read_checkpoint(list_checkpoints(killed / "checkpoints")[0])
    assert ca["world_size"] == cb["world_size"] == 2 and ca["step"] == cb["step"] == 20
    for part in ("optimizer", "scheduler", "ranks"):
        assert_tree_equal(ca[part], cb[part], part)
    assert step_losses(straight / "losses-rank0.jsonl") == step_losses(killed / "losses-rank0.jsonl")
