"""The wrap switches (DDP's bucket size, gradients as bucket views) through each framework's own DDP settings
(frameworks/wrapping.py): set on the settings object the framework builds its DDP from, the script's own value
recorded, the baseline back at DDP's default, and read back from that object in one process (no wrapper), or from
the DistributedDataParallel object where there is one."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from trainfast.frameworks.board import UNSET, Board, FrameworkRecord
from trainfast.frameworks.wrapping import prove_ddp_settings

ON = {"ddp_bucket_mb": 100.0, "gradient_as_bucket_view": True}
OFF = {"ddp_bucket_mb": None, "gradient_as_bucket_view": False}     # a baseline: DDP's own defaults


def proof(record: FrameworkRecord) -> dict[str, tuple]:
    switches = record.to_dict()["switches"]
    return {k: (s["wanted"], s["script"], s["read_back"], s["applied"]) for k, s in switches.items()}


def test_accelerate_sets_its_ddp_kwargs_handler_and_reads_it_back(monkeypatch):
    pytest.importorskip("accelerate")
    import fwkit
    from accelerate.utils import DistributedDataParallelKwargs

    with fwkit.fresh_accelerate_state(monkeypatch):
        board = Board(dict(ON))
        acc = fwkit.patched_accelerator(board)()
        acc.prepare(nn.Linear(4, 2))
        assert acc.ddp_handler.bucket_cap_mb == 100.0 and acc.ddp_handler.gradient_as_bucket_view
        assert proof(board.frameworks["accelerate"]) == {"bucket_cap_mb": (100.0, UNSET, 100.0, True),
                                                         "gradient_as_bucket_view": (True, UNSET, True, True)}
    with fwkit.fresh_accelerate_state(monkeypatch):
        board = Board(dict(OFF))       # the script's own handler turned back to DDP's defaults, its values said
        script = DistributedDataParallelKwargs(bucket_cap_mb=50, gradient_as_bucket_view=True)
        acc = fwkit.patched_accelerator(board)(kwargs_handlers=[script])
        acc.prepare(nn.Linear(4, 2))
        assert acc.ddp_handler is script and script.to_kwargs() == {}
        assert proof(board.frameworks["accelerate"]) == {"bucket_cap_mb": (25.0, 50.0, 25.0, True),
                                                         "gradient_as_bucket_view": (False, True, False, True)}


def test_accelerate_registers_the_communication_hook_the_run_asks_for_and_only_that_one(monkeypatch):
    pytest.importorskip("accelerate")
    import fwkit
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    with fwkit.fresh_accelerate_state(monkeypatch):
        board = Board({"bf16_compress_hook": False, "fp16_compress_hook": False, "powersgd_rank": 2})
        acc = fwkit.patched_accelerator(board)()
        acc.prepare(nn.Linear(4, 2))
        handler = acc.ddp_handler
        assert handler.comm_hook == DDPCommunicationHookType.POWER_SGD
        assert handler.comm_state_option == {"matrix_approximation_rank": 2, "start_powerSGD_iter": 2}
        # one process: read from the handler (no DDP object)
        assert proof(board.frameworks["accelerate"]) == {"comm_hook=bf16": (False, UNSET, False, True),
                                                         "comm_hook=fp16": (False, UNSET, False, True),
                                                         "comm_hook=power_sgd": (True, UNSET, True, True)}
    with fwkit.fresh_accelerate_state(monkeypatch):
        board = Board({"bf16_compress_hook": False})      # a baseline: the script's own fp16 hook taken off, said
        script = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)
        fwkit.patched_accelerator(board)(kwargs_handlers=[script]).prepare(nn.Linear(4, 2))
        assert script.comm_hook == DDPCommunicationHookType.NO
        assert proof(board.frameworks["accelerate"]) == {"comm_hook=bf16": (False, False, False, True)}


def test_lightning_sets_its_ddp_strategy_and_says_when_the_trainer_builds_no_ddp(monkeypatch):
    pytest.importorskip("lightning")
    import fwkit
    from lightning.pytorch.strategies import DDPStrategy

    board = Board(dict(ON))
    Trainer = fwkit.patched_lightning_trainer(monkeypatch, board)
    trainer = Trainer(strategy=DDPStrategy(bucket_cap_mb=50), accelerator="cpu", devices=1, logger=False)
    assert trainer.strategy._ddp_kwargs == {"bucket_cap_mb": 100.0, "gradient_as_bucket_view": True}
    record = board.frameworks["lightning"]
    prove_ddp_settings(record, None, trainer.strategy._ddp_kwargs.get)      # not fitted: no DDP object yet
    assert proof(record) == {"bucket_cap_mb": (100.0, 50.0, 100.0, True),
                             "gradient_as_bucket_view": (True, UNSET, True, True)}
    board = Board(dict(ON))
    fwkit.patched_lightning_trainer(monkeypatch, board)(accelerator="cpu", devices=1, logger=False)
    unsupported = board.frameworks["lightning"].to_dict()["unsupported"]
    assert set(unsupported) == set(ON) and "builds no DistributedDataParallel" in unsupported["ddp_bucket_mb"]


def test_the_trainer_takes_the_bucket_size_from_its_arguments_and_has_no_setting_for_views(tmp_path):
    transformers = pytest.importorskip("transformers")
    from trainfast.frameworks import hf

    args = transformers.TrainingArguments(output_dir=str(tmp_path), ddp_bucket_cap_mb=10, report_to="none")
    record = FrameworkRecord("transformers", transformers.__version__)
    hf.switch_arguments(args, record, {**ON, "static_graph": True})
    assert args.ddp_bucket_cap_mb == 100.0 and args.ddp_static_graph
    prove_ddp_settings(record, None, lambda k: getattr(args, k))
    assert proof(record) == {"ddp_bucket_cap_mb": (100.0, 10.0, 100.0, True),
                             "ddp_static_graph": (True, UNSET, True, True)}
    assert "no setting" in record.unsupported["gradient_as_bucket_view"]


def test_the_proof_is_read_from_the_ddp_object_where_there_is_one(tmp_path):
    import torch.distributed as dist

    record = FrameworkRecord("accelerate", "x")
    record.set("ddp_bucket_mb", "bucket_cap_mb", 100.0)
    record.set("gradient_as_bucket_view", "gradient_as_bucket_view", True)
    record.set("bf16_compress_hook", "comm_hook=bf16", True)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        wrapped = nn.parallel.DistributedDataParallel(nn.Linear(4, 2), bucket_cap_mb=100.0)
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        wrapped.register_comm_hook(None, bf16_compress_hook)          # as Accelerate's handler registers it
        # the settings say views, the DDP object has none: the object is what is proven
        prove_ddp_settings(record, torch.compile(wrapped), lambda k: True)
    finally:
        dist.destroy_process_group()
    assert proof(record) == {"bucket_cap_mb": (100.0, UNSET, 100.0, True),
                             "gradient_as_bucket_view": (True, UNSET, False, False),
                             "comm_hook=bf16": (True, UNSET, True, True)}


@pytest.mark.slow
def test_ablate_nproc_2_on_an_accelerate_script_reads_both_back_from_its_ddp(tmp_path):
    """examples/accelerate_loop.py (it does not import trainfast) under `trainfast ablate --nproc 2 --switches
    ddp_buckets,bf16_compress_hook`: every rung runs, each record reads every setting back from the
    DistributedDataParallel object Accelerate built (the baseline's DDP defaults, then each rung's, the hook's rung
    keeping the bigger buckets above it). Gradients as views set on Accelerate's handler and read back from a DDP
    object: test_accelerate_sets_its_ddp_kwargs_handler_and_reads_it_back, test_the_proof_is_read_from_the_ddp_..."""
    pytest.importorskip("accelerate")
    import os
    import sys

    import fwkit

    from trainfast.ablation import TimingBudget, ablate_command
    from trainfast.results import Status

    result = ablate_command([sys.executable, os.path.join(fwkit.ROOT, "examples", "accelerate_loop.py"),
                             "--epochs", "1", "--train-size", "256"],
                            device="cpu", nproc=2, out=tmp_path / "ablation",
                            rungs=["ddp_buckets", "bf16_compress_hook"], repeats=1, noise_seeds=1, show=False,
                            settle_within_s=0, budget=TimingBudget(steps=4, seconds=1.0, floor=2, min_seconds=0.0))
    rungs = {r.name: r for r in result.rungs}
    assert all(r.status == Status.DONE for r in rungs.values()), {n: (r.status, r.reason) for n, r in rungs.items()}
    read = {name: {k: (s["read_back"], s["applied"])
                   for k, s in rung.repeats[0]["frameworks"]["accelerate"]["switches"].items() if k != "set_seed"}
            for name, rung in rungs.items()}
    hook_off = {"comm_hook=bf16": (False, True)}
    assert read == {"baseline": {"bucket_cap_mb": (25.0, True), **hook_off},
                    "ddp_buckets": {"bucket_cap_mb": (100.0, True), **hook_off},
                    # registered on the DDP object Accelerate built, read back from it
                    "bf16_compress_hook": {"bucket_cap_mb": (100.0, True), "comm_hook=bf16": (True, True)}}
    assert all(rung.repeats[0]["world_size"] == 2 for rung in rungs.values())
