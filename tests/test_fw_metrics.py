"""A framework script's own evaluation, read where the framework keeps it (the Trainer's evaluate(), Lightning's
callback_metrics, accelerator.log), each compared with the value the test reads from the framework itself; the
metric the ablation judges, chosen in one place (ablation/metric.py) in the documented order; the switches a
DeepSpeed or FSDP configuration, a compiled submodule or a loader outside prepare() keep from a script, said
not applicable with the reason before the rung runs."""
from __future__ import annotations

import functools
import importlib
import sys
from types import SimpleNamespace

import fwkit
import pytest
import torch
from fwkit import ROOT
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainfast.ablation.metric import choose_metric
from trainfast.ablation.proof import unsupported
from trainfast.frameworks import common
from trainfast.frameworks.board import Board

sys.path.insert(0, str(ROOT / "examples"))


# --- the choice: --metric > the script's declared metric > tf.report's first > validation loss > none -----------

RUN = {"session": False, "reported": {"train_loss": 0.3, "eval_loss": 0.5, "eval_accuracy": 0.8},
       "declared_metric": {"name": "eval_accuracy", "goal": "max", "source": "the script's metric_for_best_model"}}


def test_metric_named_on_the_command_line_wins_with_its_goal():
    choice = choose_metric("eval_loss", None, RUN)
    assert (choice.name, choice.goal) == ("eval_loss", "min") and "--metric" in choice.why
    assert choose_metric("eval_loss", "max", RUN).goal == "max"


def test_the_scripts_declared_metric_comes_next_then_its_validation_loss_then_none():
    choice = choose_metric(None, None, RUN)
    assert (choice.name, choice.goal) == ("eval_accuracy", "max") and "metric_for_best_model" in choice.why
    undeclared = {**RUN, "declared_metric": None}
    assert (choose_metric(None, None, undeclared).name, choose_metric(None, None, undeclared).goal) \
        == ("eval_loss", "min")
    never_logged = {**RUN, "declared_metric": {"name": "eval_f1", "goal": "max", "source": "x"}}
    choice = choose_metric(None, None, never_logged)
    assert choice.name == "eval_loss" and "eval_f1" in choice.why and "never logged" in choice.why
    nothing = choose_metric(None, None, {"session": False, "reported": {"train_loss": 0.1}})
    assert nothing.name is None and "speed alone" in nothing.why


def test_a_session_scripts_first_reported_value_comes_before_a_validation_loss():
    run = {"session": True, "reported": {"val_top1": 0.7, "val_loss": 0.4}}
    assert choose_metric(None, None, run).name == "val_top1"
    for name in ("val_loss", "validation_loss", "val/loss", "eval_loss", "val_loss_epoch"):
        assert choose_metric(None, None, {"reported": {"train_loss": 1.0, name: 0.2}}).name == name
    # what Lightning's self.log and accelerator.log leave (tests/scripts/fw_hurt.py): the validation loss, minimized,
    # and the report's reason says so (the ablation's guard on them is test_fw_guard.py's, on the Trainer)
    for logged in ({"val_loss": 0.4}, {"eval_loss": 0.4}):
        choice = choose_metric(None, None, {"reported": {"train_loss": 1.0, **logged}, "declared_metric": None})
        assert (choice.name, choice.goal) == (*logged, "min") and "the validation loss" in choice.why, choice


# --- transformers' Trainer ----------------------------------------------------------------------------------------

def test_the_trainers_evaluate_metrics_and_metric_for_best_model_are_recorded(tmp_path):
    transformers = pytest.importorskip("transformers")
    from hf_trainer import ParityTokens, compute_metrics

    board = Board({"seed": 1})
    Args, Trainer = fwkit.patched_trainer_classes(board)
    config = transformers.BertConfig(vocab_size=128, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=64, num_labels=2)
    args = Args(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8, report_to="none",
                save_strategy="no", logging_strategy="no", disable_tqdm=True, metric_for_best_model="accuracy",
                use_cpu=True)
    trainer = Trainer(model=transformers.BertForSequenceClassification(config), args=args,
                      train_dataset=ParityTokens(32), eval_dataset=ParityTokens(24, seed=1),
                      compute_metrics=compute_metrics)
    trainer.train()
    returned = trainer.evaluate()
    assert board.metrics["eval_accuracy"] == pytest.approx(returned["eval_accuracy"])
    assert board.metrics["eval_loss"] == pytest.approx(returned["eval_loss"])
    assert "eval_runtime" not in board.metrics and "epoch" not in board.metrics
    assert board.declared["name"] == "eval_accuracy" and board.declared["goal"] == "max"
    assert choose_metric(None, None, {"reported": board.metrics, "declared_metric": board.declared}).name \
        == "eval_accuracy"


def test_a_deepspeed_or_fsdp_configuration_keeps_its_switches_from_the_trainer():
    pytest.importorskip("transformers")
    from trainfast.frameworks import hf

    for setting, value, owned in (("deepspeed", "ds_config.json", {"precision", "optimizer_impl"}),
                                  ("fsdp", "full_shard", {"precision"})):
        board = Board({"precision": "bf16", "optimizer_impl": "fused", "num_workers": 0})
        record = hf.record_of(board)
        # A stand-in for TrainingArguments (building real ones with deepspeed set needs the deepspeed package).
        args = SimpleNamespace(**{"deepspeed": None, "fsdp": None, setting: value}, bf16=False, fp16=False,
                               tf32=None, use_cpu=True, optim="adamw_torch", dataloader_num_workers=2)
        hf.switch_arguments(args, record, board.fields)
        assert owned <= set(record.unsupported) and setting in record.unsupported["precision"]
        assert args.bf16 is False and args.dataloader_num_workers == 0        # owned left alone; the rest switched
        assert (args.optim == "adamw_torch") == ("optimizer_impl" in owned)
        why = unsupported({"precision": "bf16"}, {"transformers": record.to_dict()})
        assert why and f"TrainingArguments.{setting}" in why


# --- Lightning ------------------------------------------------------------------------------------------------------

def lightning_trainer(board: Board, monkeypatch):
    L = pytest.importorskip("lightning")
    from trainfast.frameworks import lightning as adapter

    package = "lightning.pytorch"
    core = importlib.import_module(f"{package}.core.optimizer")
    source = importlib.import_module(f"{package}.trainer.connectors.data_connector")._DataLoaderSource
    monkeypatch.setattr(core, "_configure_optimizers", core._configure_optimizers)
    monkeypatch.setattr(source, "dataloader", source.dataloader)
    Trainer = type("Trainer", (L.Trainer,), {})
    record, fitting = functools.partial(adapter.record_of, board, package), {}
    adapter.patch_trainer(Trainer, board, package, record, fitting)
    adapter.patch_loader_source(source, board, record, fitting)
    return L, Trainer


def test_lightnings_logged_validation_metrics_and_checkpoint_monitor_are_recorded(monkeypatch, tmp_path):
    board = Board({"seed": 0})
    L, Trainer = lightning_trainer(board, monkeypatch)
    from lightning_module import ConvNet

    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=str(tmp_path), monitor="val_acc", mode="max")
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, accelerator="cpu", devices=1,
                      logger=False, callbacks=[checkpoint], enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(ConvNet(train_size=64, batch_size=16))
    logged = trainer.callback_metrics
    assert board.metrics["val_loss"] == pytest.approx(logged["val_loss"].item())
    assert board.metrics["val_acc"] == pytest.approx(logged["val_acc"].item())
    assert board.declared == {"name": "val_acc", "goal": "max",
                              "source": "the script's ModelCheckpoint(monitor='val_acc', mode='max')"}
    again = trainer.validate(ConvNet(train_size=64, batch_size=16), verbose=False)[0]   # another model's numbers
    assert board.metrics["val_loss"] == pytest.approx(again["val_loss"])


@pytest.mark.parametrize("strategy, plugin", [("deepspeed_stage_2", "deepspeed"),
                                              (type("FSDPStrategy", (), {})(), "fsdp")])
def test_a_deepspeed_or_fsdp_strategy_keeps_its_switches_from_lightning(strategy, plugin):
    pytest.importorskip("lightning")
    from trainfast.frameworks import lightning as adapter

    board = Board({"precision": "bf16", "optimizer_impl": "fused", "cudnn_benchmark": False})
    record = board.framework("lightning", "x")
    kwargs = {"strategy": strategy, "precision": "32-true"}
    adapter.switch_trainer_arguments(kwargs, record, board.fields)
    assert kwargs["precision"] == "32-true" and kwargs["benchmark"] is False      # owned left alone; rest switched
    assert plugin in record.unsupported["precision"] and "Trainer(strategy=" in record.unsupported["precision"]
    assert ("optimizer_impl" in record.unsupported) == (plugin == "deepspeed")


def test_a_submodule_the_script_compiled_makes_the_compile_switch_not_applicable():
    pytest.importorskip("lightning")
    from trainfast.frameworks import lightning as adapter

    model = nn.Sequential(nn.Linear(2, 2), torch.compile(nn.Linear(2, 2)))
    record = Board({}).framework("lightning", "x")
    assert adapter.switch_model(model, record, {"compile": True}, "lightning.pytorch") is model
    assert "compile" not in [s.field for s in record.switches.values()]
    assert "submodule (1)" in record.unsupported["compile"]
    assert unsupported({"compile": True}, {"lightning": record.to_dict()}) == record.unsupported["compile"]


# --- Accelerate -----------------------------------------------------------------------------------------------------

@pytest.fixture
def accelerator_class(monkeypatch):
    pytest.importorskip("accelerate")
    with fwkit.fresh_accelerate_state(monkeypatch):
        yield fwkit.patched_accelerator


def test_values_given_to_accelerator_log_are_recorded_as_logged(accelerator_class):
    board = Board({"precision": "fp32"})
    accelerator = accelerator_class(board)()
    model = accelerator.prepare(nn.Linear(4, 2))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    loss = nn.functional.cross_entropy(model(x), y)
    accelerator.log({"eval_loss": loss, "eval_accuracy": 0.25, "note": "text"}, step=0)
    assert board.metrics == {"eval_loss": pytest.approx(loss.item()), "eval_accuracy": 0.25}


def test_a_deepspeed_plugin_keeps_precision_and_optimizer_from_the_accelerator(accelerator_class):
    from trainfast.frameworks import accel

    board = Board({"precision": "bf16", "optimizer_impl": "fused", "cudnn_benchmark": False})
    record = accel.record_of(board)
    plugin = type("DeepSpeedPlugin", (), {})()          # a stand-in: the deepspeed package is not installed
    kw = accel.switch_arguments({"deepspeed_plugin": plugin}, record, board.fields)
    assert "mixed_precision" not in kw \
        and "the script's Accelerator(deepspeed_plugin=...)" in record.unsupported["precision"]
    assert "DeepSpeed wraps and steps the optimizer" in record.unsupported["optimizer_impl"]
    assert "torch.backends.cudnn.benchmark" in record.switches          # what the plugin does not own is switched


def test_the_fsdp_setting_of_accelerates_environment_keeps_the_precision(accelerator_class, monkeypatch):
    from trainfast.frameworks import accel

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    record = accel.record_of(Board({}))
    accel.switch_arguments({}, record, {"precision": "bf16"})
    assert "ACCELERATE_USE_FSDP=true" in record.unsupported["precision"]


def test_loader_switches_are_not_applicable_when_no_loader_passes_through_prepare(accelerator_class):
    board = Board({"num_workers": 2, "non_blocking": True, "precision": "fp32"})
    accelerator = accelerator_class(board)()
    model, optimizer = accelerator.prepare(nn.Linear(4, 2), torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1))
    for x, y in DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4):
        accelerator.backward(nn.functional.cross_entropy(model(x), y))
    sections = {"accelerate": board.to_dict()["accelerate"]}
    assert unsupported({"num_workers": 0}, sections).startswith("no training loader passed through")
    assert unsupported({"non_blocking": False}, sections).startswith("no training loader passed through")
    assert unsupported({"precision": "bf16"}, sections) is None


def test_the_compile_switch_leaves_a_model_with_a_compiled_submodule_as_the_script_made_it(accelerator_class):
    board = Board({"compile": True})
    accelerator = accelerator_class(board)()
    model = nn.Sequential(nn.Linear(2, 2), torch.compile(nn.Linear(2, 2)))
    prepared = accelerator.prepare(model)
    assert not common.is_compiled(prepared) and str(accelerator.state.dynamo_plugin.backend.value).lower() == "no"
    record = board.to_dict()["accelerate"]
    assert "compile" in record["unsupported"] and "dynamo_backend" not in record["switches"]


# --- seeds through the framework's own seed setting -----------------------------------------------------------------

@pytest.fixture
def kept_rng():
    """The seed functions seed Python's, numpy's and torch's generators: restored after, so the tests that
    follow in this process draw what they would have drawn."""
    import random

    import numpy as np

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def test_lightnings_seed_everything_seeds_with_the_runs_seed_and_proves_it(monkeypatch, kept_rng):
    pytest.importorskip("lightning")
    from lightning.fabric.utilities import seed as seed_module

    from trainfast.frameworks import lightning as adapter

    monkeypatch.setattr(seed_module, "seed_everything", seed_module.seed_everything)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    board = Board({"seed": 5})
    adapter.patch_seed("lightning.pytorch", board, seed_module)
    assert seed_module.seed_everything(0) == 5 and torch.initial_seed() == 5
    switch = board.to_dict()["lightning"]["switches"]["seed_everything"]
    assert (switch["script"], switch["wanted"], switch["read_back"], switch["applied"]) == (0, 5, 5, True)


def test_accelerates_set_seed_seeds_with_the_runs_seed_and_proves_it(monkeypatch, kept_rng):
    pytest.importorskip("accelerate")
    from accelerate.utils import random as random_module

    from trainfast.frameworks import accel

    monkeypatch.setattr(random_module, "set_seed", random_module.set_seed)
    board = Board({"seed": 7})
    accel.patch_seed(random_module, board)
    random_module.set_seed(0)
    assert torch.initial_seed() == 7
    switch = board.to_dict()["accelerate"]["switches"]["set_seed"]
    assert (switch["script"], switch["wanted"], switch["read_back"], switch["applied"]) == (0, 7, 7, True)


def test_the_tables_metric_column_is_the_judged_metric_not_the_first_logged():
    """A Lightning script logs train_loss before val_loss; the ablation judges val_loss (metric.choose_metric), and the
    table's column must name what its numbers are."""
    from conftest import scored_rung

    from trainfast.report.table import Columns, headers

    rung = scored_rung("baseline", [100.0] * 2, 1.4)
    for run in rung.repeats:
        run["reported"] = {"train_loss": 1.5, "val_loss": 1.4}
    settings = {"command": ["python", "train.py"], "measure": "full", "metric": {"name": None, "goal": None}}
    columns = Columns.for_settings(settings, [rung], {"name": "val_loss", "goal": "min", "why": "the validation loss"})
    assert "val_loss (Δ)" in headers(columns) and not any("train_loss" in h for h in headers(columns))
