"""torchrun worker for tests/test_resume.py: data-parallel training on 2 CPU processes (gloo) with
checkpoints written by rank 0 and resume="auto", so torchrun --max-restarts continues a killed run.

The process-group setup, the DDP wrapping and the epoch loop below are the minimum this test needs, written
independently of distributed.py."""
from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from resume_child import tiny_model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from trainfast import Recipe
from trainfast.checkpoint import atomic_save, build_checkpointer
from trainfast.data.datasets import load_synthetic
from trainfast.data.pipeline import build_batches
from trainfast.distributed import drain_collectives
from trainfast.engine import train_one_epoch
from trainfast.measure import Meter
from trainfast.session import build_state, seed_everything


def init_process_group() -> None:
    """gloo on torchrun's env. Every restart attempt gets its own key prefix in the store: with torch
    2.14 and --standalone, a restarted worker otherwise read the killed round's gloo addresses from the
    reused store and failed with "connectFullMesh ... Connection refused" (seen here)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_hosts_store and rank == 0, timeout=timedelta(seconds=120))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"trainfast/attempt_{attempt}", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))


def all_gather(obj):
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def main(out: str, kill_rank: int, kill_step: int) -> None:
    torch.set_num_threads(1)
    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    out_dir = Path(out)
    recipe = Recipe(epochs=2, batch_size=16, save_every=4, log_every=1)
    device = torch.device("cpu")
    split = load_synthetic(image_size=8, n=400)          # 320 images, 160 per rank: 10 steps of 16 per epoch
    seed_everything(recipe.seed)
    state = build_state(tiny_model(), recipe, device)
    state.forward = DistributedDataParallel(state.model)
    sampler = DistributedSampler(split.train, world, rank, shuffle=True, seed=recipe.seed, drop_last=True)
    batches = build_batches(split.train, split, recipe, device, train=True, sampler=sampler, rank=rank)
    checkpoints = build_checkpointer(out_dir, recipe, batches, rank=rank, gather=all_gather)
    checkpoints.start(state, "auto")
    marker = out_dir / "killed-once"
    losses = open(out_dir / f"losses-rank{rank}.jsonl", "a", buffering=1)

    def on_window(step, stats):
        losses.write(json.dumps({"step": step, "loss": stats.losses[-1]}) + "\n")
        if rank == kill_rank and step == kill_step and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)

    for epoch in range(state.epoch, recipe.epochs):
        sampler.set_epoch(epoch)
        meter = Meter(device, recipe.log_every, on_window=on_window, first_step=state.step)
        checkpoints.begin_epoch(state, meter)
        train_one_epoch(state, batches, torch.nn.functional.cross_entropy, meter, after_step=checkpoints.after_step)
        checkpoints.end_epoch(state)
    if rank == 0:
        atomic_save(state.model.state_dict(), out_dir / "model.pt")
    dist.barrier()
    drain_collectives()         # else a rank may abort at exit ("terminate called without an active exception")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
