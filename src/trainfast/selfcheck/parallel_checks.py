"""Several GPUs: DDP over NCCL with one process per visible GPU, launched the way `ablate --nproc` launches
(distributed.launch_local: torch.distributed.elastic, what torchrun uses), and single-process DataParallel.

One launch serves both DDP checks (starting the ranks dominates): each rank first trains two epochs of a
user's loop adopted with a Session (its DataLoader sharded by a DistributedSampler, set_epoch at every pass,
tf.log values reduced over ranks), then the built-in `train` with a NaN planted on the last rank, which every
rank must stop on at the same step. Each rank writes what it saw to rank<R>.json; the judges read them all.
The same worker runs over gloo on a CPU (the tests use that; the selfcheck itself requires NCCL's GPUs)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .common import MEAN, STD, small_net, tiny_split
from .judges import DP_MAX_DIFF, Verdict, judge_close, judge_nonfinite_stop, judge_reduced, judge_set_epoch

EPOCHS, BATCH, LOG_EVERY = 2, 8, 4
NAN_AT = 5                     # the forward call on the last rank that returns NaN logits (step index 4)


class Indexed(Dataset):
    """(uint8 image, label, index): the index tells which samples each rank saw in each epoch."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        image, label = self.base[i]
        return image, label, i


class NaNOnRank(nn.Module):
    """The model, except that on `rank` its `at`-th forward returns NaN logits."""

    def __init__(self, model: nn.Module, rank: int, at: int) -> None:
        super().__init__()
        self.model, self.calls = model, 0
        self.active, self.at = int(os.environ.get("RANK", 0)) == rank, at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = self.model(x)
        return out * float("nan") if self.active and self.calls == self.at else out


def session_epochs(device: str) -> dict:
    """A user's loop under the Session for EPOCHS passes: which samples this rank saw, its own per-step losses
    and the windows tf.log reduced over ranks."""
    from ..recipe import Recipe
    from ..session import Session

    tf = Session(Recipe(optimizer="sgd", lr=0.05, weight_decay=0.0, batch_size=BATCH, log_every=LOG_EVERY),
                 device=device, env=False)
    model = small_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Indexed(tiny_split().train), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = tf.setup(model, optimizer, loader, mean=MEAN, std=STD)
    orders, local = [], []
    for _ in range(EPOCHS):
        seen = []
        for images, labels, index in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            tf.backward(loss)
            optimizer.step()
            tf.log(loss=loss)
            local.append(float(loss.detach()))        # this rank's own value, for the judge (a sync: a check)
            seen += index.tolist()
        orders.append(seen)
    records = [r["loss"] for r in tf.flush_logs()]
    return {"orders": orders, "local": local, "records": records, "sampler": type(loader.sampler).__name__}


def nonfinite_run(device: str, world: int) -> str | None:
    """The built-in train() with NaN logits on the last rank: the error this rank stopped with."""
    from ..recipe import Recipe
    from ..trainer import train

    model = NaNOnRank(small_net(), rank=world - 1, at=NAN_AT)
    try:
        train(model, tiny_split(), recipe=Recipe(optimizer="sgd", lr=0.05, batch_size=BATCH, log_every=2),
              device=device)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def ddp_worker(out: str, device: str) -> None:
    """One rank (launched by launch_local, RANK/WORLD_SIZE/LOCAL_RANK in its environment). The process group
    is opened here, so the Session and train() both use it and leave it open."""
    import torch.distributed as dist

    from ..distributed import drain_collectives

    rank, world, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        torch.set_num_threads(1)           # ranks share the cores
        dist.init_process_group("gloo")
    report: dict = {"rank": rank, "world": world}
    try:
        report.update(session_epochs(device))
    except Exception as exc:
        report["session_error"] = f"{type(exc).__name__}: {exc}"
    report["nonfinite_error"] = nonfinite_run(device, world)
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    drain_collectives()                    # else a rank may abort at exit with collectives in flight
    dist.destroy_process_group()


def ddp_reports(ctx) -> list[dict]:
    """Every rank's report from the one launch (cached for both DDP checks): one rank per GPU, two on a CPU."""
    def launch() -> list[dict]:
        from ..distributed import launch_local

        out = ctx.out / "ddp"
        out.mkdir(parents=True, exist_ok=True)
        nproc = ctx.machine["gpus"] if ctx.device.type == "cuda" else 2
        launch_local(ddp_worker, (str(out), ctx.device.type), nproc, run_id="trainfast-selfcheck")
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    return ctx.once("ddp", launch)


def check_ddp(ctx) -> Verdict:
    reports = ddp_reports(ctx)
    errors = [f"rank {r['rank']}: {r['session_error']}" for r in reports if "session_error" in r]
    if errors:
        return Verdict(False, None, "", "; ".join(errors))
    shards = judge_set_epoch([r["orders"] for r in reports])
    reduced = judge_reduced([r["local"] for r in reports], [r["records"] for r in reports], LOG_EVERY)
    backend = "nccl" if ctx.device.type == "cuda" else "gloo"
    return Verdict(shards.ok and reduced.ok, float(len(reports)), f"ranks ({backend})",
                   f"{shards.detail}; {reduced.detail}")


def check_ddp_nonfinite(ctx) -> Verdict:
    reports = ddp_reports(ctx)
    return judge_nonfinite_stop([r.get("nonfinite_error") for r in reports], len(reports))


def check_data_parallel(ctx) -> Verdict:
    from ..distributed import ReplicaForward
    from ..recipe import Recipe
    from ..trainer import train

    split = tiny_split()
    recipe = Recipe(optimizer="sgd", lr=0.05, weight_decay=0.0, batch_size=16)
    dp = train(small_net, split, recipe=recipe.replace(strategy="dp"), device=str(ctx.device))
    one = train(small_net, split, recipe=recipe, device=str(ctx.device))
    if not isinstance(dp.state.forward.trained, ReplicaForward):
        return Verdict(False, None, "", f"strategy=dp trained through {type(dp.state.forward.trained).__name__}, "
                                        "not DataParallel with the loss in each replica")
    a, b = dp.model.state_dict(), one.model.state_dict()
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    gpus = torch.cuda.device_count()
    verdict = judge_close(diff, DP_MAX_DIFF, f"DataParallel on {gpus} GPUs (loss in each replica) vs one GPU")
    return verdict
