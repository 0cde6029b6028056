"""The DDP wrap switches, the gradient bucket size (techniques/ddp_buckets.py), gradients as views into the
buckets (techniques/bucket_view.py), the static graph (techniques/static_graph.py) and the bf16 communication hook
(techniques/compress_hook.py): each set on the DDP object two gloo ranks build, read back from it in the run's
record, ablated under --nproc 2, and not applicable in one process. One launch of two ranks serves them all."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from dist_common import make_model, make_split  # noqa: E402

from trainfast.ablation.ladders import plan_rungs  # noqa: E402
from trainfast.ablation.server import rung_context  # noqa: E402
from trainfast.ablation.work import mark_effects  # noqa: E402
from trainfast.distributed import drain_collectives, free_port  # noqa: E402
from trainfast.recipe import Recipe, RecipeError  # noqa: E402
from trainfast.results import EffectLabel, Status  # noqa: E402
from trainfast.techniques.switch import RunContext  # noqa: E402

CPU = torch.device("cpu")
MIB = 2 ** 20
# every DDP wrap switch as a run with none of them reads it back: DDP's own defaults
DDP_DEFAULTS = {"strategy": "ddp", "ddp_bucket_mb": 25.0, "gradient_as_bucket_view": False, "static_graph": False,
                "bf16_compress_hook": False, "fp16_compress_hook": False, "powersgd_rank": 0}


def wrap_on_rank(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks (one thread each): a Session sets up the same model with the bucket size and without
    it, then with gradients as bucket views; what each DDP object holds, and what the Session's proof reads back,
    written for the test."""
    from torch import nn

    from trainfast import Session

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    # One process group for every Session below (each uses it and leaves it open): a group opened and closed per
    # Session would rebuild its rendezvous store on the same port each time, racing the other rank
    torch.distributed.init_process_group("gloo")
    report = {}
    for name, recipe in (("asked", Recipe(ddp_bucket_mb=50.0, optimizer="sgd")), ("default", Recipe(optimizer="sgd")),
                         ("views", Recipe(gradient_as_bucket_view=True, optimizer="sgd")),
                         ("static", Recipe(static_graph=True, optimizer="sgd")),
                         ("compressed", Recipe(bf16_compress_hook=True, optimizer="sgd")),
                         ("fp16", Recipe(fp16_compress_hook=True, optimizer="sgd")),
                         ("powersgd", Recipe(powersgd_rank=1, optimizer="sgd"))):
        tf = Session(recipe, device="cpu")
        model, optimizer = tf.setup(make_model(), None)
        inputs, targets = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
        for _ in range(3 if name == "powersgd" else 1):        # PowerSGD compresses from the second all-reduce on
            tf.state.model.zero_grad()
            tf.backward(nn.functional.cross_entropy(model(inputs), targets))    # the buckets all-reduce once
        wrapped = tf.dist.wrapped
        report[name] = {"type": type(wrapped).__name__, "bucket_bytes_cap": wrapped.bucket_bytes_cap,
                        "static_graph": wrapped.static_graph,
                        "read_back": tf.dist.wrap_state(),
                        "grad": tf.state.model.head.bias.grad.tolist(),
                        "grad_rank": int(torch.linalg.matrix_rank(tf.state.model.body[1].weight.grad)),
                        # one flat bucket holds every gradient of this small model: as views they share its storage
                        "grad_storages": len({p.grad.untyped_storage().data_ptr()
                                              for p in tf.state.model.parameters()}),
                        "parameters": len(list(tf.state.model.parameters()))}
        tf.close()
    for name, recipe in (("fsdp", Recipe(strategy="fsdp", optimizer="sgd")),
                         ("fsdp_kept", Recipe(strategy="fsdp", reshard_after_forward=False, optimizer="sgd"))):
        tf = Session(recipe, device="cpu")
        model, optimizer = tf.setup(make_model(), None)
        loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.tensor([0, 1, 2, 3]))
        block = tf.state.model.body._get_fsdp_state()._fsdp_param_group        # the first block, after its forward
        report[name] = {"type": type(tf.dist.wrapped).__name__, "read_back": tf.dist.wrap_state(),
                        "gathered_after_forward": block.is_unsharded}
        tf.backward(loss)
        tf.close()
    drain_collectives()
    torch.distributed.destroy_process_group()
    Path(out).write_text(json.dumps(report))


def test_two_gloo_ranks_build_ddp_with_each_wrap_switch_and_read_it_back(tmp_path):
    # The ranks fork from the rung server (ablation/server.py), which has imported torch and trainfast once for the
    # whole test run: two fresh interpreters would import them, and this module's own imports, each.
    ctx, port = rung_context(), free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [ctx.Process(target=wrap_on_rank, args=(r, port, str(outs[r]))) for r in range(2)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=240)
            assert p.exitcode == 0
    finally:
        for p in procs:                  # a rank left waiting on a failed one is not left behind
            if p.is_alive():
                p.kill()
    ranks = [json.loads(out.read_text()) for out in outs]
    for report in ranks:
        assert report["asked"]["type"] == "DistributedDataParallel"
        assert report["asked"]["bucket_bytes_cap"] == 50 * MIB
        assert report["asked"]["read_back"] == {**DDP_DEFAULTS, "ddp_bucket_mb": 50.0}
        assert report["default"]["read_back"] == DDP_DEFAULTS           # unset: DDP's own defaults, read back from it
        assert report["views"]["read_back"] == {**DDP_DEFAULTS, "gradient_as_bucket_view": True}
        assert report["static"]["read_back"]["static_graph"] and report["static"]["static_graph"]
        assert report["compressed"]["read_back"] == {**DDP_DEFAULTS, "bf16_compress_hook": True}
        assert report["fp16"]["read_back"] == {**DDP_DEFAULTS, "fp16_compress_hook": True}
        # the all-reduced sum went through bf16 (fp16): the gradient is that type's rounding of the plain one
        plain, rounded = torch.tensor(report["default"]["grad"]), torch.tensor(report["compressed"]["grad"])
        assert torch.equal(rounded, rounded.bfloat16().float()) and torch.allclose(plain, rounded, rtol=1e-2)
        halved = torch.tensor(report["fp16"]["grad"])
        assert torch.equal(halved, halved.half().float()) and torch.allclose(plain, halved, rtol=1e-3)
        assert not torch.equal(halved, plain)
        # PowerSGD at rank 1: the matrix all-reduced is the product of two thin factors, rank 1 where DDP's is not
        assert report["powersgd"]["read_back"] == {**DDP_DEFAULTS, "powersgd_rank": 1}
        assert report["powersgd"]["grad_rank"] == 1 and report["default"]["grad_rank"] > 1
        # the strategy read back from the wrapper each run built; under FSDP2 only its switches are read
        assert report["fsdp"]["type"].startswith("FSDP")
        assert report["fsdp"]["read_back"] == {"strategy": "fsdp", "reshard_after_forward": True}
        assert not report["fsdp"]["gathered_after_forward"]          # resharded after its forward: FSDP2's default
        assert report["fsdp_kept"]["read_back"] == {"strategy": "fsdp", "reshard_after_forward": False}
        assert report["fsdp_kept"]["gathered_after_forward"]         # kept for the backward: ZeRO-2
        assert report["default"]["grad_storages"] == report["default"]["parameters"]     # a buffer per gradient
        assert report["views"]["grad_storages"] == 1                                     # the bucket's, viewed
    for name in ("asked", "views", "static", "compressed", "fp16", "powersgd"):
        assert ranks[0][name]["grad"] == ranks[1][name]["grad"]                # all-reduced through the buckets


@pytest.mark.parametrize("rung, changes", [("ddp_buckets", {"ddp_bucket_mb": 100.0}),
                                           ("gradient_as_bucket_view", {"gradient_as_bucket_view": True}),
                                           ("static_graph", {"static_graph": True}),
                                           ("bf16_compress_hook", {"bf16_compress_hook": True}),
                                           ("fp16_compress_hook", {"fp16_compress_hook": True,
                                                                   "bf16_compress_hook": False}),
                                           ("powersgd", {"powersgd_rank": 2, "bf16_compress_hook": False,
                                                         "fp16_compress_hook": False}),
                                           ("fsdp", {"strategy": "fsdp"}),
                                           ("no_reshard_after_forward", {"reshard_after_forward": False})])
def test_without_nproc_the_rung_is_not_applicable_and_with_two_ranks_it_is_measured(rung, changes):
    plan = plan_rungs(Recipe(), [rung], device=CPU)
    assert plan[1].changes == changes
    mark_effects(plan, RunContext(CPU))                        # one process: no DDP wrapper to act on
    assert plan[1].status == Status.NO_EFFECT and plan[1].effect == EffectLabel.NOT_APPLICABLE
    assert "--nproc 2" in plan[1].reason
    plan = plan_rungs(Recipe(), [rung], device=CPU)
    mark_effects(plan, RunContext(CPU, ranks=2))
    assert plan[1].status != Status.NO_EFFECT and plan[1].effect == EffectLabel.MEASURED


def test_under_fsdp_the_ddp_rungs_are_not_applicable_and_train_says_so_in_one_process():
    from trainfast.cli import idle_switches

    plan = plan_rungs(Recipe(strategy="fsdp"), ["ddp_buckets", "gradient_as_bucket_view"], device=CPU)
    mark_effects(plan, RunContext(CPU, ranks=2, strategy="fsdp"))
    assert all(r.effect == EffectLabel.NOT_APPLICABLE and "strategy=fsdp" in r.reason for r in plan[1:])
    notes = idle_switches(Recipe(gradient_as_bucket_view=True), CPU, None)    # `trainfast train` without torchrun
    assert any(n.startswith("--gradient-as-bucket-view has no effect here") and "--nproc 2" in n for n in notes)


def test_the_reshard_rung_is_not_applicable_under_ddp_and_measured_below_the_fsdp_rung():
    plan = plan_rungs(Recipe(), ["no_reshard_after_forward"], device=CPU)
    mark_effects(plan, RunContext(CPU, ranks=2, strategy="ddp"))
    assert plan[1].effect == EffectLabel.NOT_APPLICABLE and "strategy=ddp" in plan[1].reason
    plan = plan_rungs(Recipe(), ["fsdp", "no_reshard_after_forward"], device=CPU)
    mark_effects(plan, RunContext(CPU, ranks=2, strategy="ddp"))    # each rung judged under its own wrapper
    assert [r.effect for r in plan[1:]] == [EffectLabel.MEASURED] * 2
    assert plan[2].recipe.strategy == "fsdp" and not plan[2].recipe.reshard_after_forward


def test_one_communication_hook_at_a_time_and_a_later_hook_rung_swaps_the_one_above_it():
    with pytest.raises(RecipeError, match="one communication hook"):
        Recipe(bf16_compress_hook=True, fp16_compress_hook=True)
    with pytest.raises(RecipeError, match="powersgd_rank"):
        Recipe(powersgd_rank=1, bf16_compress_hook=True)
    plan = plan_rungs(Recipe(), ["bf16_compress_hook", "fp16_compress_hook"], device=CPU)
    assert plan[1].recipe.bf16_compress_hook and not plan[1].recipe.fp16_compress_hook
    assert plan[2].recipe.fp16_compress_hook and not plan[2].recipe.bf16_compress_hook


def test_the_bucket_size_must_be_positive():
    with pytest.raises(RecipeError, match="ddp_bucket_mb"):
        Recipe(ddp_bucket_mb=0)


@pytest.mark.slow
def test_ablate_nproc_2_runs_the_rungs_and_their_records_read_the_settings_back(tmp_path):
    """Two runs, every wrap setting read back in a record: the ladder's own recipe asks for bigger buckets and
    gradients as views (its baseline runs with them), the rung adds the bf16 hook on top. A baseline with nothing
    set reads DDP's defaults in test_two_gloo_ranks_build_ddp_with_each_wrap_switch_and_read_it_back, from the same
    DDP object a run's record reads."""
    from trainfast.ablation import TimingBudget, ablate

    base = Recipe(optimizer="sgd", lr=0.05, batch_size=8, log_every=2, ddp_bucket_mb=100.0,
                  gradient_as_bucket_view=True)
    # what is read is each run's wrap settings, not its rate: a few timed steps, not 16 stretched to 2 s
    result = ablate(make_model, make_split(), recipe=base, rungs=["bf16_compress_hook"], device="cpu",
                    out=tmp_path, show=False, nproc=2, noise_seeds=1, repeats=1, settle_within_s=0,
                    budget=TimingBudget(steps=4, seconds=1.0, floor=2, min_seconds=0.0))
    baseline, compressed = result.rungs
    for rung in (baseline, compressed):
        # each run trains the recipe's epoch on two ranks: 320 samples, 2 x 8 a step
        assert rung.status == "done" and rung.result.world_size == 2 and rung.result.steps == 20, rung.result
    assert (tmp_path / "results.json").exists()
    asked = {**DDP_DEFAULTS, "ddp_bucket_mb": 100.0, "gradient_as_bucket_view": True}
    assert baseline.repeats[0]["wrap_switches"] == asked
    assert compressed.repeats[0]["wrap_switches"] == {**asked, "bf16_compress_hook": True}
    # every run measured each rank (the built-in run gathers them at its end) and, nothing planted, names none slow
    for rung in (baseline, compressed):
        ranks = rung.repeats[0]["ranks"]
        assert [r["rank"] for r in ranks["ranks"]] == [0, 1] and ranks["straggler"] is None, ranks
        assert rung.result.ranks["straggler"] is None
