"""Activation checkpointing (techniques/checkpointing.py): the model's own switch, the same gradients, and the
opt-in memory rung ruled out on a model without a switch."""
from __future__ import annotations

import timm
import torch

from trainfast.ablation.ladders import RUNGS
from trainfast.models import build_model
from trainfast.recipe import Recipe
from trainfast.session.build import build_state
from trainfast.tasks.effects import data_effect
from trainfast.techniques.checkpointing import is_checkpointing, set_checkpointing


def grads(checkpointing: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=4, drop_rate=0.0)
    state = build_state(model, Recipe(activation_checkpointing=checkpointing), torch.device("cpu"))
    assert is_checkpointing(state.model) is checkpointing
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    state.forward(x).square().mean().backward()
    return [p.grad.clone() for p in state.model.parameters()]


def test_checkpointing_recomputes_the_same_gradients():
    for a, b in zip(grads(False), grads(True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_batch_norm_statistics_are_updated_once_a_step_as_without_checkpointing():
    """The recomputation runs each block's forward again inside backward: its batch norms must not update their
    running statistics a second time (momentum twice a step, num_batches_tracked double)."""
    def trained(checkpointing: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = timm.create_model("resnet10t", num_classes=3)
        state = build_state(model, Recipe(activation_checkpointing=checkpointing), torch.device("cpu"))
        optimizer = torch.optim.SGD(state.model.parameters(), lr=0.1)
        x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 3, (4,))
        for _ in range(2):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(state.forward(x), y).backward()
            optimizer.step()
        return state.model.state_dict()

    plain, checkpointed = trained(False), trained(True)
    assert checkpointed["layer4.0.bn1.num_batches_tracked"] == 2
    for name, value in plain.items():
        torch.testing.assert_close(checkpointed[name], value, msg=name)


def test_the_switch_turns_off_as_well_as_on_and_is_read_back():
    model = timm.create_model("resnet18", num_classes=2)
    set_checkpointing(model, True)
    assert is_checkpointing(model)
    set_checkpointing(model, False)
    assert not is_checkpointing(model)


def test_the_memory_rung_is_opt_in_and_not_applicable_without_a_switch():
    assert RUNGS["checkpointing"] == {"activation_checkpointing": True}
    own = data_effect("activation_checkpointing", torch.device("cpu"), build_model("resnet9", 10))
    assert not own.acts and not own.applies and "no checkpointing switch" in own.reason
    assert data_effect("activation_checkpointing", torch.device("cpu"), timm.create_model("resnet18")).acts
