"""The Lightning adapter (frameworks/lightning.py): each switch reaches the Trainer (its precision and benchmark
arguments, the module at fit, what configure_optimizers() returns, the training loader) and is read back from
what the Trainer ended up with; the baseline turns off what the script turned on and says what it had; a script
whose own settings differ is overridden and reported; without Lightning the adapter does nothing."""
from __future__ import annotations

import functools
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning")

import fwkit  # noqa: E402
from fwkit import ROOT, measured_run, switches  # noqa: E402

from trainfast.ablation.proof import not_applied, script_settings, unsupported  # noqa: E402
from trainfast.frameworks import lightning as adapter  # noqa: E402
from trainfast.frameworks.board import UNSET, Board, FrameworkRecord  # noqa: E402

EXAMPLE = str(ROOT / "examples" / "lightning_module.py")
BASELINE = {"precision": "fp32", "set_to_none": False, "non_blocking": False, "pin_memory": False,
            "prefetch": False, "channels_last": False, "compile": False, "optimizer_impl": "default", "seed": 0}

# A script as a user writes it, with its own settings chosen on the command line: the package name, the
# Trainer's precision and benchmark, a fused AdamW with a scheduler, a compiled model, where the loader comes from.
VARIANT = textwrap.dedent('''
    import argparse, importlib, json
    import torch
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset

    p = argparse.ArgumentParser()
    p.add_argument("--package", default="lightning.pytorch")
    p.add_argument("--precision")
    p.add_argument("--benchmark", choices=["true", "false"])
    p.add_argument("--fused", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--loader", default="module", choices=["module", "fit", "datamodule"])
    a = p.parse_args()
    pl = importlib.import_module(a.package)

    def loader():
        g = torch.Generator().manual_seed(0)
        images, labels = torch.randn(64, 3, 16, 16, generator=g), torch.randint(0, 4, (64,), generator=g)
        return DataLoader(TensorDataset(images, labels), batch_size=8)

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                     nn.Linear(8, 4))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, i):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def configure_optimizers(self):
            if not a.fused:
                return torch.optim.AdamW(self.parameters(), lr=1e-3)
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3, fused=True)
            sched = torch.optim.lr_scheduler.StepLR(opt, 2)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    class WithLoader(Net):
        def train_dataloader(self):
            return loader()

    class Data(pl.LightningDataModule):
        def train_dataloader(self):
            return loader()

    kwargs = {}
    if a.precision:
        kwargs["precision"] = int(a.precision) if a.precision.isdigit() else a.precision
    if a.benchmark:
        kwargs["benchmark"] = a.benchmark == "true"
    model = WithLoader() if a.loader == "module" else Net()
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, **kwargs)
    fit = {"fit": {"train_dataloaders": loader()}, "datamodule": {"datamodule": Data()}}.get(a.loader, {})
    trainer.fit(torch.compile(model) if a.compile else model, **fit)
    scheds = [c.scheduler for c in trainer.lr_scheduler_configs]
    json.dump({"lr": trainer.optimizers[0].param_groups[0]["lr"],
               "scheduler_bound": all(s.optimizer is trainer.optimizers[0] for s in scheds)}, open("check.json", "w"))
''')


def variant(tmp_path: Path) -> str:
    path = tmp_path / "variant.py"
    path.write_text(VARIANT)
    return str(path)


# --- pure: configure_optimizers() results rewritten, schedulers rebound ------------------------------------

def params():
    return [nn.Parameter(torch.randn(4, 4)), nn.Parameter(torch.randn(4))]


def adamw(**flags) -> torch.optim.AdamW:
    return torch.optim.AdamW(params(), lr=1.0, **flags)


def fused(optimizer) -> bool:
    return bool(optimizer.param_groups[0].get("fused"))


FUSED, DEFAULT = {"optimizer_impl": "fused"}, {"optimizer_impl": "default"}     # the run's optimizer switches


def test_a_bare_optimizer_and_a_list_of_them_are_rebuilt_fused():
    record = FrameworkRecord("lightning", "x")
    opt = adamw()
    assert fused(adapter.switch_optim_conf(record, opt, FUSED))
    first, second = adamw(), adamw()
    out = adapter.switch_optim_conf(record, [first, second, first], FUSED)
    assert isinstance(out, list) and all(fused(o) for o in out)
    assert out[0] is out[2] and out[0] is not first            # one replacement per optimizer
    assert record.switches["optimizer implementation"].script == "default"
    assert not fused(first)                                     # the script's objects are left as they were


def test_two_lists_rebind_each_scheduler_to_its_optimizers_replacement():
    record = FrameworkRecord("lightning", "x")
    o1, o2 = adamw(), adamw()
    s1, s2 = torch.optim.lr_scheduler.StepLR(o1, 1, gamma=0.5), torch.optim.lr_scheduler.LambdaLR(o2, lambda e: 0.1)
    opts, scheds = adapter.switch_optim_conf(record, ([o1, o2], [s1, s2]), FUSED)
    assert scheds[0].optimizer is opts[0] and scheds[1].optimizer is opts[1]
    opts[0].step()
    s1.step()                                                   # the schedule now moves the optimizer that runs
    assert opts[0].param_groups[0]["lr"] == 0.5 and o1.param_groups[0]["lr"] == 1.0


def test_dicts_with_scheduler_configs_are_rewritten_and_rebound():
    record = FrameworkRecord("lightning", "x")
    o1, o2 = adamw(fused=True), adamw(fused=True)
    s1 = torch.optim.lr_scheduler.StepLR(o1, 1)
    s2 = torch.optim.lr_scheduler.ReduceLROnPlateau(o2)
    single = adapter.switch_optim_conf(record, {"optimizer": o1, "lr_scheduler": {"scheduler": s1,
                                                                                   "interval": "step"}}, DEFAULT)
    assert not fused(single["optimizer"]) and single["lr_scheduler"]["scheduler"].optimizer is single["optimizer"]
    assert single["lr_scheduler"]["interval"] == "step"
    many = adapter.switch_optim_conf(record, [{"optimizer": o1, "lr_scheduler": s1},
                                              {"optimizer": o2, "lr_scheduler": {"scheduler": s2, "monitor": "loss"}}],
                                     DEFAULT)
    assert s2.optimizer is many[1]["optimizer"] and not fused(many[1]["optimizer"])
    assert record.switches["optimizer implementation"].script == "fused"     # what the script had


def test_rewritten_results_still_parse_as_lightning_reads_them():
    from lightning.pytorch.core.optimizer import _configure_optimizers, _MockOptimizer

    record = FrameworkRecord("lightning", "x")
    opt = adamw()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    optimizers, schedulers, _ = _configure_optimizers(
        adapter.switch_optim_conf(record, ([opt], [sched]), FUSED))
    assert fused(optimizers[0]) and schedulers[0].optimizer is optimizers[0]
    mock = _MockOptimizer()                                     # configure_optimizers() returned None
    assert adapter.switch_optim_conf(record, mock, FUSED) is mock


# --- pure: the Trainer's arguments and the model at fit ----------------------------------------------------

@pytest.mark.parametrize("script, canonical", [(None, UNSET), ("bf16", "bf16-mixed"), (16, "16-mixed"),
                                               ("16-mixed", "16-mixed"), ("32", "32-true"), (32, "32-true")])
def test_the_scripts_precision_is_recorded_as_lightning_names_it(script, canonical):
    record = FrameworkRecord("lightning", "x")
    kwargs = {} if script is None else {"precision": script}
    adapter.switch_trainer_arguments(kwargs, record, {"precision": "bf16"})
    assert kwargs["precision"] == "bf16-mixed"
    assert record.switches["precision"].script == canonical


def test_trainer_arguments_switched_and_the_rest_unsupported_with_reasons():
    record = FrameworkRecord("lightning", "x")
    kwargs = {"benchmark": False, "precision": "bf16-mixed"}
    adapter.switch_trainer_arguments(kwargs, record, {**BASELINE, "cudnn_benchmark": True,
                                                      "precision_level": "master"})
    assert kwargs == {"benchmark": True, "precision": "32-true"}
    assert set(record.unsupported) == {"set_to_none", "non_blocking", "prefetch", "precision_level"}
    assert "seed" not in {s.field for s in record.switches.values()}
    from lightning.pytorch.plugins import MixedPrecision

    own = FrameworkRecord("lightning", "x")
    kwargs = {"plugins": [MixedPrecision("bf16-mixed", "cpu")]}
    adapter.switch_trainer_arguments(kwargs, own, {"precision": "fp32"})
    assert "precision" not in kwargs and "MixedPrecision" in own.unsupported["precision"]


class Conv(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x)


def test_compile_wraps_the_model_and_the_baseline_unwraps_the_scripts():
    record = FrameworkRecord("lightning", "x")
    model = Conv()
    out = adapter.switch_model(model, record, {"compile": True, "channels_last": True}, "lightning.pytorch")
    assert type(out).__name__ == "OptimizedModule" and out._orig_mod is model
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert record.switches["torch.compile"].script is False
    base = FrameworkRecord("lightning", "x")
    back = adapter.switch_model(torch.compile(model), base, BASELINE, "lightning.pytorch")
    assert back is model and not adapter.compiled(back)
    assert base.switches["torch.compile"].script is True
    assert model.conv.weight.is_contiguous()                   # the script's channels_last turned off
    assert (base.switches["memory format"].wanted, base.switches["memory format"].script) == (
        "contiguous", "channels_last")
    model.compile()                                             # compiled in place
    assert adapter.switch_model(model, base, {"compile": False}, "lightning.pytorch")._compiled_call_impl is None


def fake_trainer(precision: str, optimizer, loader, module, benchmark: bool = False):
    plugin = SimpleNamespace(precision=precision)
    trainer = SimpleNamespace(strategy=SimpleNamespace(precision_plugin=plugin, model=module), lightning_module=module,
                              optimizers=[optimizer], train_dataloader=loader)
    setattr(trainer, adapter.FIT_STATE, {"benchmark": benchmark})
    return trainer


def test_the_proof_says_not_applied_when_lightning_ended_up_elsewhere():
    record = FrameworkRecord("lightning", "x")
    adapter.switch_trainer_arguments({}, record, {"precision": "fp16", "cudnn_benchmark": True})
    loader = DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)
    adapter.switch_loader(record, loader, {"num_workers": 1})
    module = Conv()
    adapter.switch_models(record, module, {"channels_last": True}, "lightning")
    record.set("optimizer_impl", "optimizer implementation", "fused")
    # What a CPU does with "16-mixed" (bf16), a benchmark reset, the script's own loader and optimizer kept.
    adapter.read_back(record, fake_trainer("bf16-mixed", adamw(), {"a": [loader]}, Conv(), benchmark=False))
    proof = {k: (s.read_back, s.applied) for k, s in record.switches.items()}
    assert proof == {"precision": ("bf16-mixed", False), "benchmark": (False, False),
                     "DataLoader.num_workers": (0, False), "memory format": ("contiguous", False),
                     "optimizer implementation": ("default", False)}
    sections = {"lightning": record.to_dict()}
    assert "asked '16-mixed', read back 'bf16-mixed'" in not_applied({"precision": "fp16"}, sections)


# --- in process: a real fit through a patched Trainer subclass ---------------------------------------------

@pytest.fixture
def patched(monkeypatch):
    """A patched subclass of Lightning's Trainer, and Lightning's optimizer and loader parsing patched for this
    test only (restored after it): the real classes stay untouched in this process."""
    return functools.partial(fwkit.patched_lightning_trainer, monkeypatch)


class Tiny(L.LightningModule):
    def __init__(self, fused_: bool = False):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
        self.fused_ = fused_

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), fused=self.fused_ or None)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]


def tiny_loader(**kwargs) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 2, (16,))), batch_size=4, **kwargs)


def fit(Trainer, model, **script):
    trainer = Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **script)
    trainer.fit(model, train_dataloaders=tiny_loader(pin_memory=True))
    return trainer


def test_a_fit_gets_every_switch_and_proves_it(patched):
    board = Board({"precision": "bf16", "channels_last": True, "optimizer_impl": "fused", "cudnn_benchmark": True,
                   "num_workers": 1, "persistent_workers": True, "pin_memory": False, "seed": 0})
    trainer = fit(patched(board), Tiny(), benchmark=False)
    assert trainer.precision_plugin.precision == "bf16-mixed"
    proof = switches({"frameworks": board.to_dict()}, "lightning")
    assert {k: s["read_back"] for k, s in proof.items()} == {
        "precision": "bf16-mixed", "benchmark": True, "memory format": "channels_last",
        "optimizer implementation": "fused", "DataLoader.num_workers": 1, "DataLoader.persistent_workers": True,
        "DataLoader.pin_memory": False}
    assert all(s["applied"] for s in proof.values()), proof
    assert trainer.lr_scheduler_configs[0].scheduler.optimizer is trainer.optimizers[0]
    assert board.samples_per_step == 4
    assert board.overridden()["lightning.benchmark"] == [False, True]
    assert board.overridden()["lightning.DataLoader.pin_memory"] == [True, False]


def test_the_baseline_fit_turns_the_scripts_settings_off(patched):
    board = Board(dict(BASELINE))
    trainer = fit(patched(board), Tiny(fused_=True), precision="bf16-mixed")
    proof = switches({"frameworks": board.to_dict()}, "lightning")
    assert trainer.precision_plugin.precision == "32-true" and not fused(trainer.optimizers[0])
    assert proof["precision"]["script"] == "bf16-mixed" and proof["precision"]["applied"]
    assert proof["optimizer implementation"]["script"] == "fused"
    assert proof["optimizer implementation"]["read_back"] == "default"
    assert board.overridden() == {"lightning.precision": ["bf16-mixed", "32-true"],
                                  "lightning.optimizer implementation": ["fused", "default"],
                                  "lightning.DataLoader.pin_memory": [True, False]}


class WithTestStep(Tiny):
    def test_step(self, batch, i):
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self.net(x), y))


def test_the_proof_is_the_fits_also_after_a_test_and_keeps_the_process_wide_switches(patched):
    # Lightning's own examples test after they fit (trainer.test(ckpt_path="best")): the Trainer then drops its
    # training loader, and a run that ends by itself writes its proof at exit, after that. The loader read back
    # is the one the fit ran; the process-wide switches' readers (set before any fit) survive the fit's own.
    board = Board({**BASELINE, "passive_threads": False, "reuse_memory": False})
    trainer = fit(patched(board), WithTestStep())
    trainer.test(WithTestStep(), dataloaders=tiny_loader(), verbose=False)
    assert trainer.train_dataloader is None
    proof = switches({"frameworks": board.to_dict()}, "lightning")
    assert proof["DataLoader.pin_memory"]["read_back"] is False and proof["DataLoader.pin_memory"]["applied"] is True
    assert proof["OMP_WAIT_POLICY"]["applied"] is True and proof["MALLOC_MMAP_MAX_"]["applied"] is True
    assert not_applied(BASELINE | {"passive_threads": False, "reuse_memory": False},
                       {"lightning": board.to_dict()["lightning"]}) is None


# --- measured runs: the start-up hook patches an unmodified script -----------------------------------------

def assert_read_back(proof: dict, expected: dict) -> None:
    assert {k: proof[k]["read_back"] for k in expected} == expected, proof
    assert all(proof[k]["applied"] is True for k in expected), proof


@pytest.mark.slow
def test_the_examples_switches_reach_lightning_in_a_measured_run(tmp_path):
    fields = {"precision": "bf16", "channels_last": True, "optimizer_impl": "fused", "cudnn_benchmark": True,
              "num_workers": 1, "persistent_workers": True, "pin_memory": True, "prefetch_factor": 4, "seed": 0,
              "set_to_none": True, "non_blocking": True, "prefetch": True}
    result = measured_run([EXAMPLE, "--train-size", "256"], fields, tmp_path)
    section = result["frameworks"]["lightning"]
    assert_read_back(section["switches"], {
        "precision": "bf16-mixed", "benchmark": True, "memory format": "channels_last",
        "optimizer implementation": "fused", "DataLoader.num_workers": 1, "DataLoader.persistent_workers": True,
        "DataLoader.pin_memory": True, "DataLoader.prefetch_factor": 4})
    assert set(section["unsupported"]) == {"set_to_none", "non_blocking", "prefetch"}
    assert not_applied(fields, result["frameworks"]) is None
    assert unsupported({"set_to_none": True}, result["frameworks"]).startswith("Lightning's")
    assert result["steps_run"] == 8 and result["rate_unit"] == "samples/s"


@pytest.mark.slow
def test_compile_reaches_lightning_in_a_measured_run(tmp_path):
    result = measured_run([EXAMPLE, "--train-size", "128"], {"compile": True, "seed": 0}, tmp_path)
    proof = switches(result, "lightning")
    assert_read_back(proof, {"torch.compile": True})
    assert proof["torch.compile"]["script"] is False
    notes = result["frameworks"]["lightning"]["notes"]
    assert any(n.startswith("torch.compile: ") and not n.startswith("torch.compile: 0 ") for n in notes), notes


@pytest.mark.slow
def test_the_baseline_turns_off_what_the_script_turned_on(tmp_path):
    """Under the older package name: a bf16 Trainer, a compiled model, a fused AdamW with a step scheduler."""
    pytest.importorskip("pytorch_lightning")
    argv = [variant(tmp_path), "--package", "pytorch_lightning", "--precision", "bf16-mixed", "--fused", "--compile"]
    result = measured_run(argv, BASELINE, tmp_path)
    proof = switches(result, "lightning")
    assert_read_back(proof, {"precision": "32-true", "optimizer implementation": "default", "torch.compile": False,
                             "memory format": "contiguous", "DataLoader.pin_memory": False})
    assert {k: proof[k]["script"] for k in ("precision", "optimizer implementation", "torch.compile")} == {
        "precision": "bf16-mixed", "optimizer implementation": "fused", "torch.compile": True}
    assert result["overridden"] == {"lightning.precision": ["bf16-mixed", "32-true"],
                                    "lightning.optimizer implementation": ["fused", "default"],
                                    "lightning.torch.compile": [True, False]}
    assert "lightning precision='bf16-mixed'" in script_settings(result["frameworks"])
    import pytorch_lightning

    assert result["frameworks"]["lightning"]["version"] == pytorch_lightning.__version__
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["scheduler_bound"] and check["lr"] == pytest.approx(1e-3 * 0.1 ** 4)   # 8 steps, StepLR(2)


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["datamodule", "fit"])
def test_the_scripts_own_settings_are_overridden_and_reported(tmp_path, loader):
    fields = {"precision": "bf16", "cudnn_benchmark": True, "num_workers": 1, "persistent_workers": True,
              "optimizer_impl": "fused", "seed": 0}
    result = measured_run([variant(tmp_path), "--precision", "32", "--benchmark", "false", "--loader", loader],
                          fields, tmp_path)
    assert_read_back(switches(result, "lightning"), {
        "precision": "bf16-mixed", "benchmark": True, "DataLoader.num_workers": 1,
        "DataLoader.persistent_workers": True, "optimizer implementation": "fused"})
    assert result["overridden"] == {"lightning.precision": ["32-true", "bf16-mixed"],
                                    "lightning.benchmark": [False, True],
                                    "lightning.DataLoader.num_workers": [0, 1],
                                    "lightning.DataLoader.persistent_workers": [False, True],
                                    "lightning.optimizer implementation": ["default", "fused"]}


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="Lightning keeps 16-mixed on a GPU")
def test_fp16_on_a_cpu_is_reported_not_applied(tmp_path):
    result = measured_run([variant(tmp_path)], {"precision": "fp16", "seed": 0}, tmp_path)
    proof = switches(result, "lightning")["precision"]
    assert (proof["wanted"], proof["read_back"], proof["applied"]) == ("16-mixed", "bf16-mixed", False)
    assert "read back 'bf16-mixed'" in not_applied({"precision": "fp16"}, result["frameworks"])


ABSENT = textwrap.dedent('''
    import sys
    if sys.argv[1] == "blocked":             # as if neither package were installed
        sys.modules["lightning"] = sys.modules["pytorch_lightning"] = None
        try:
            import lightning
        except ImportError:
            pass
        else:
            raise SystemExit("lightning imported")
    import torch
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    loaded = [m for m in ("lightning", "pytorch_lightning") if sys.modules.get(m) is not None]
    assert not loaded, f"the adapter imported {loaded}"
''')


@pytest.mark.slow
@pytest.mark.parametrize("how", ["blocked", "unused"])
def test_without_lightning_the_adapter_is_inert(tmp_path, how):
    """Lightning not importable, or importable but not used: nothing is imported, patched or recorded, and the
    run is measured as any other."""
    script = tmp_path / "plain.py"
    script.write_text(ABSENT)
    result = measured_run([str(script), how], {**BASELINE, "precision": "bf16", "compile": True}, tmp_path)
    # no lightning section: the script's plain loop takes the switches as any plain loop does
    assert set(result["frameworks"]) == {"plain loop"} and result["overridden"] == {}
    assert result["steps_run"] == 3


def test_async_checkpoint_is_lightnings_own_plugin_and_is_proven(patched, tmp_path):
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    board = Board({"async_checkpoint": True})
    trainer = fit(patched(board), Tiny())
    assert isinstance(trainer.strategy.checkpoint_io, AsyncCheckpointIO)
    proof = switches({"frameworks": board.to_dict()}, "lightning")
    assert proof[adapter.ASYNC_IO]["read_back"] is True and proof[adapter.ASYNC_IO]["applied"]
    assert "async_checkpoint" not in board.to_dict()["lightning"]["unsupported"]
    trainer.save_checkpoint(tmp_path / "a.ckpt")              # written through the plugin, complete at teardown
    trainer.strategy.checkpoint_io.teardown()
    assert (tmp_path / "a.ckpt").stat().st_size > 0
    # a script's own CheckpointIO is wrapped, not replaced; the baseline unwraps a script's AsyncCheckpointIO
    own = TorchCheckpointIO()
    kwargs = {"plugins": [own]}
    adapter.switch_trainer_arguments(kwargs, FrameworkRecord("lightning", "x"), {"async_checkpoint": True})
    assert isinstance(kwargs["plugins"][0], AsyncCheckpointIO) and kwargs["plugins"][0].checkpoint_io is own
    record = FrameworkRecord("lightning", "x")
    kwargs = {"plugins": AsyncCheckpointIO(own)}
    adapter.switch_trainer_arguments(kwargs, record, {"async_checkpoint": False})
    assert kwargs["plugins"] == [own] and record.switches[adapter.ASYNC_IO].script is True


class Validated(Tiny):
    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))


def test_each_validation_during_fit_is_handed_on_as_a_point_of_the_curve(patched):
    seen = []
    board = Board({"seed": 0}, on_metrics=seen.append)
    trainer = patched(board)(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, val_check_interval=2)
    trainer.fit(Validated(), train_dataloaders=tiny_loader(), val_dataloaders=tiny_loader())
    during = [m for m in seen if "val_loss" in m]
    assert len(during) >= 4                           # twice an epoch for two epochs, then the fit's end; no sanity
    assert all(isinstance(m["val_loss"], float) for m in during)
