"""The switches every framework adapter applies the same way (frameworks/common.py), on plain torch objects."""
from __future__ import annotations

import timm
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainfast.frameworks.board import UNSET, Board
from trainfast.frameworks.common import switch_loader, switch_models, switch_optimizers
from trainfast.techniques.memory_format import memory_format_of
from trainfast.techniques.optimizer import impl_of


def record():
    return Board({}).framework("x", "1")


class Wrapper(nn.Module):              # a LightningModule or a script's own wrapper around a library model
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.net = inner


def test_checkpointing_finds_the_library_model_inside_a_wrapper_and_turns_it_on_and_off():
    rec = record()
    model = Wrapper(timm.create_model("resnet18", num_classes=2))
    switch_models(rec, model, {"activation_checkpointing": True}, "lightning")
    assert rec.to_dict()["switches"]["activation checkpointing"]["applied"] is True
    rec = record()
    switch_models(rec, model, {"activation_checkpointing": False}, "lightning")
    out = rec.to_dict()["switches"]["activation checkpointing"]
    assert out["applied"] is True and out["script"] is True and out["read_back"] is False
    rec = record()
    switch_models(rec, Wrapper(nn.Linear(2, 2)), {"activation_checkpointing": True}, "lightning")
    assert "no checkpointing switch" in rec.unsupported["activation_checkpointing"]


def test_memory_format_off_turns_back_the_scripts_channels_last_and_says_it_had_it():
    rec = record()
    model = switch_models(rec, nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last), {"channels_last": False},
                          "accelerate")
    assert memory_format_of(model) == "contiguous" and rec.switches["memory format"].script == "channels_last"
    rec = record()
    switch_models(rec, nn.Conv2d(3, 8, 3), {"channels_last": True}, "accelerate")
    assert rec.switches["memory format"].script == UNSET          # contiguous: every model's default


def test_the_loader_is_rebuilt_with_the_same_batches_and_the_optimizer_with_its_scheduler():
    rec = record()
    data = TensorDataset(torch.arange(20.0))
    loader = DataLoader(data, batch_size=4, shuffle=False, drop_last=True)
    rebuilt = switch_loader(rec, loader, {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 3})
    assert rebuilt.num_workers == 1 and rebuilt.persistent_workers and rebuilt.prefetch_factor == 3
    assert [b[0].tolist() for b in rebuilt] == [b[0].tolist() for b in loader]
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    new = switch_optimizers(rec, opt, {"optimizer_impl": "default"}, sched)
    assert new is not opt and impl_of(new) == "default" and sched.optimizer is new
    assert rec.switches["optimizer implementation"].script == "fused"


def test_low_bit_states_rebuild_a_scripts_adamw_and_say_what_they_cannot_rebuild():
    """optimizer_state as Lightning's and Accelerate's adapters apply it: the script's AdamW becomes torchao's
    AdamW8bit with its scheduler rebound, read back from the optimizer; the implementation switch beside it is
    said not to apply; an SGD is left as it is, why said."""
    import pytest

    pytest.importorskip("torchao")
    from trainfast.frameworks.common import prove_optimizers
    from trainfast.techniques import owner

    MOMENTS = owner("optimizer_state").optimizer.label

    rec = record()
    model = nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    new = switch_optimizers(rec, opt, {"optimizer_impl": "fused", "optimizer_state": "8bit"}, sched)
    assert type(new).__name__ == "AdamW8bit" and sched.optimizer is new
    prove_optimizers(rec, [new])
    assert rec.switches[MOMENTS].applied and rec.switches[MOMENTS].script == "full"
    assert "no foreach/fused choice" in rec.unsupported["optimizer_impl"]
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert switch_optimizers(rec, sgd, {"optimizer_state": "4bit"}) is sgd
    assert "is not torch's Adam or AdamW" in rec.unsupported["optimizer_state"]
