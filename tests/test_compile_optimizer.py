"""compile_optimizer (techniques/compile_optimizer.py): the optimizer's step compiled in place, read back from the
optimizer; the learning rate a tensor, so a warm-up does not compile the step again; off, training is the plain
loop's; the framework adapters set it on the optimizer they are handed and read it back; where it cannot act
(no C++ compiler for inductor, the low-bit Adam, the Trainer's own optimizer) it says why."""
from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from trainfast import Recipe, Session, techniques
from trainfast.frameworks.board import Board, FrameworkRecord
from trainfast.frameworks.common import mark_shared_switches, prove_optimizers, switch_optimizers
from trainfast.session import build_state
from trainfast.techniques.compile import effect
from trainfast.techniques.compile_optimizer import compile_step, is_compiled

CPU = torch.device("cpu")
needs_compiler = pytest.mark.skipif(not effect(CPU).acts, reason="inductor needs a C++ compiler on a CPU")
LABEL = "compiled optimizer step"


def model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    generator = torch.Generator().manual_seed(1)
    return model, torch.randn(32, 8, generator=generator), torch.randn(32, 1, generator=generator)


def optimizer_with_warmup(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return optimizer, torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.25, total_iters=3)


def plain_loop(steps: int) -> list[torch.Tensor]:
    model, x, y = model_and_data()
    optimizer, scheduler = optimizer_with_warmup(model)
    for _ in range(steps):
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return [p.detach().clone() for p in model.parameters()]


def session_loop(recipe: Recipe, steps: int):
    model, x, y = model_and_data()
    optimizer, scheduler = optimizer_with_warmup(model)
    tf = Session(recipe, device="cpu")
    model, stepped, scheduler = tf.setup(model, optimizer, scheduler=scheduler)
    for _ in range(steps):
        tf.backward(((model(x) - y) ** 2).mean())
        stepped.step()
        stepped.zero_grad()
        scheduler.step()
    return [p.detach().clone() for p in model.parameters()], optimizer, stepped.optimizer


def graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def test_off_the_session_trains_as_the_plain_loop_and_leaves_the_step_alone():
    weights, optimizer, stepped = session_loop(Recipe(), steps=5)
    assert stepped is optimizer and not is_compiled(stepped)
    assert all(torch.equal(a, b) for a, b in zip(weights, plain_loop(steps=5)))


@needs_compiler
def test_on_the_users_optimizer_runs_a_compiled_step_that_a_warmup_does_not_recompile():
    torch._dynamo.reset()
    before = graphs()
    weights, optimizer, stepped = session_loop(Recipe(compile_optimizer=True), steps=5)
    assert stepped is optimizer and is_compiled(stepped)             # in place: the scheduler kept its optimizer
    assert isinstance(stepped.param_groups[0]["lr"], torch.Tensor)
    assert float(stepped.param_groups[0]["lr"]) == pytest.approx(1e-2)  # the warm-up ran through the tensor
    assert graphs() - before == 1                                    # one graph for every rate of the warm-up
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(weights, plain_loop(steps=5)))


def test_the_built_in_run_compiles_the_step_of_the_optimizer_it_builds():
    model, _, _ = model_and_data()
    state = build_state(model, Recipe(compile_optimizer=True, warmup_steps=2), CPU)
    assert is_compiled(state.optimizer.optimizer)
    assert not is_compiled(build_state(model_and_data()[0], Recipe(), CPU).optimizer.optimizer)


@needs_compiler
def test_an_adapter_compiles_the_scripts_optimizer_in_place_reads_it_back_and_undoes_it():
    record = Board({}).framework("lightning", "x")
    model, x, y = model_and_data()
    optimizer, scheduler = optimizer_with_warmup(model)
    assert switch_optimizers(record, optimizer, {"compile_optimizer": True}, scheduler) is optimizer
    prove_optimizers(record, [optimizer])
    assert record.switches[LABEL].applied and record.switches[LABEL].script is False
    loss = optimizer.step(lambda: ((model(x) - y) ** 2).mean().backward() or torch.tensor(1.0))   # Lightning's closure
    assert float(loss) == 1.0 and model[0].weight.grad is not None
    baseline = Board({}).framework("lightning", "x")
    assert switch_optimizers(baseline, optimizer, {"compile_optimizer": False}) is optimizer
    assert not is_compiled(optimizer) and baseline.switches[LABEL].script is True
    assert compile_step(optimizer, False) is optimizer                                  # twice: nothing to undo


def test_where_it_cannot_act_it_says_why(monkeypatch):
    hf = FrameworkRecord("transformers", "x")
    mark_shared_switches(hf, {"compile_optimizer": True})
    assert "TrainingArguments has no setting" in hf.unsupported["compile_optimizer"]
    monkeypatch.setattr(shutil, "which", lambda name: None)
    why = techniques.device_model_effect("compile_optimizer", CPU, None)
    assert not why.acts and "no C++ compiler" in why.reason


def test_the_low_bit_adam_rules_it_out():
    pytest.importorskip("torchao")
    record = Board({}).framework("accelerate", "x")
    model, _, _ = model_and_data()
    optimizer = torch.optim.AdamW(model.parameters())
    rebuilt = switch_optimizers(record, optimizer, {"optimizer_state": "8bit", "compile_optimizer": True})
    assert type(rebuilt).__name__ == "AdamW8bit" and not is_compiled(rebuilt)
    assert "no other optimizer switch acts on it" in record.unsupported["compile_optimizer"]
