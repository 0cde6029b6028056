"""The DDP gradient bucket size (techniques/ddp_buckets.py), a wrap switch: set on the DDP object two gloo ranks
build, read back from it in the run's record, ablated under --nproc 2, and not applicable in one process."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from dist_common import make_model, make_split  # noqa: E402

from trainfast.ablation.ladders import plan_rungs  # noqa: E402
from trainfast.ablation.work import mark_effects  # noqa: E402
from trainfast.distributed import free_port  # noqa: E402
from trainfast.recipe import Recipe, RecipeError  # noqa: E402
from trainfast.results import Effect, Status  # noqa: E402

CPU = torch.device("cpu")
MIB = 2 ** 20


def wrap_on_rank(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks (one thread each): a Session sets up the same model with the bucket size and without
    it; what each DDP object holds, and what the Session's proof reads back, written for the test."""
    from torch import nn

    from trainfast import Session

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    report = {}
    for name, recipe in (("asked", Recipe(ddp_bucket_mb=50.0, optimizer="sgd")), ("default", Recipe(optimizer="sgd"))):
        tf = Session(recipe, device="cpu")
        model, optimizer = tf.setup(make_model(), None)
        inputs, targets = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
        tf.backward(nn.functional.cross_entropy(model(inputs), targets))        # the buckets all-reduce once
        wrapped = tf.dist.wrapped
        report[name] = {"type": type(wrapped).__name__, "bucket_bytes_cap": wrapped.bucket_bytes_cap,
                        "read_back": tf.dist.wrap_state(),
                        "grad": tf.state.model.head.bias.grad.tolist()}
        tf.close()
    Path(out).write_text(json.dumps(report))


def test_two_gloo_ranks_build_ddp_with_the_bucket_size_and_read_it_back(tmp_path):
    ctx, port = mp.get_context("spawn"), free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [ctx.Process(target=wrap_on_rank, args=(r, port, str(outs[r]))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    ranks = [json.loads(out.read_text()) for out in outs]
    for report in ranks:
        assert report["asked"]["type"] == "DistributedDataParallel"
        assert report["asked"]["bucket_bytes_cap"] == 50 * MIB
        assert report["asked"]["read_back"] == {"ddp_bucket_mb": 50.0}
        assert report["default"]["read_back"] == {"ddp_bucket_mb": 25.0}        # unset: DDP's own default
    assert ranks[0]["asked"]["grad"] == ranks[1]["asked"]["grad"]              # all-reduced through the buckets


def test_without_nproc_the_rung_is_not_applicable_and_with_two_ranks_it_is_measured():
    plan = plan_rungs(Recipe(), ["ddp_buckets"], device=CPU)
    assert plan[1].changes == {"ddp_bucket_mb": 100.0}
    mark_effects(plan, CPU)                                    # one process: no DDP wrapper to act on
    assert plan[1].status == Status.NO_EFFECT and plan[1].effect == Effect.NOT_APPLICABLE
    assert "--nproc 2" in plan[1].reason
    plan = plan_rungs(Recipe(), ["ddp_buckets"], device=CPU)
    mark_effects(plan, CPU, ranks=2)
    assert plan[1].status != Status.NO_EFFECT and plan[1].effect == Effect.MEASURED


def test_the_bucket_size_must_be_positive():
    with pytest.raises(RecipeError, match="ddp_bucket_mb"):
        Recipe(ddp_bucket_mb=0)


@pytest.mark.slow
def test_ablate_nproc_2_runs_the_rung_and_its_record_reads_the_bucket_size_back(tmp_path):
    from trainfast.ablation import ablate

    result = ablate(make_model, make_split(), recipe=Recipe(optimizer="sgd", lr=0.05, batch_size=8, log_every=2),
                    rungs=["ddp_buckets"], device="cpu", out=tmp_path, show=False, nproc=2, noise_seeds=1,
                    repeats=1)
    baseline, rung = result.rungs
    assert rung.name == "ddp_buckets" and rung.status == "done", rung.result
    assert rung.result.world_size == 2
    assert rung.repeats[0]["wrap_switches"] == {"ddp_bucket_mb": 100.0}
    assert baseline.repeats[0]["wrap_switches"] == {"ddp_bucket_mb": 25.0}
