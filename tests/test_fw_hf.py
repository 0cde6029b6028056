"""The transformers adapter (frameworks/hf.py): each switch reaches the Trainer through its own arguments and is
read back from what the Trainer built; the baseline turns off what the script turned on and says what it had;
without transformers the adapter does nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from fwkit import ROOT, measured_run, switches  # noqa: E402
from fwkit import patched_trainer_classes as patched_classes  # noqa: E402

from trainfast.frameworks.board import Board  # noqa: E402

sys.path.insert(0, str(ROOT / "examples"))


def tiny_trainer(Args, Trainer, tmp_path: Path, **script_args):
    from hf_trainer import ParityTokens

    config = transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, num_labels=2)
    args = Args(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=8, report_to="none",
                save_strategy="no", logging_strategy="no", disable_tqdm=True, **script_args)
    return Trainer(model=transformers.BertForSequenceClassification(config), args=args,
                   train_dataset=ParityTokens(64))


def test_the_run_switches_reach_the_trainer_and_are_read_back(tmp_path):
    board = Board({"precision": "bf16", "optimizer_impl": "fused", "num_workers": 1, "pin_memory": False,
                   "persistent_workers": True, "seed": 3})
    Args, Trainer = patched_classes(board)
    trainer = tiny_trainer(Args, Trainer, tmp_path, optim="adamw_torch")
    assert trainer.args.bf16 and trainer.args.optim.value == "adamw_torch_fused"
    assert trainer.args.dataloader_num_workers == 1 and trainer.args.seed == 3
    trainer.train()
    proof = switches({"frameworks": board.to_dict()}, "transformers")
    assert all(s["applied"] for s in proof.values()), proof
    assert proof["bf16"]["read_back"] is True                    # the Accelerator's mixed_precision
    assert proof["optim"]["read_back"] == "adamw_torch_fused"     # the optimizer's own fused flag
    assert proof["dataloader_num_workers"]["read_back"] == 1      # the training loader's workers
    assert proof["dataloader_persistent_workers"]["read_back"] is True
    assert proof["optim"]["script"] == "adamw_torch"


def test_the_baseline_turns_off_what_the_script_turned_on_and_reports_it(tmp_path):
    board = Board({"precision": "fp32", "compile": False, "optimizer_impl": "default", "num_workers": 0,
                   "prefetch_factor": None})
    Args, Trainer = patched_classes(board)
    trainer = tiny_trainer(Args, Trainer, tmp_path, use_cpu=True, bf16=True, torch_compile_backend="inductor",
                           optim="adamw_torch_fused", dataloader_num_workers=2, dataloader_prefetch_factor=4)
    args = trainer.args
    assert not args.bf16 and not args.torch_compile and args.optim.value == "adamw_torch"
    assert args.dataloader_num_workers == 0 and args.dataloader_prefetch_factor is None
    trainer.train()
    proof = switches({"frameworks": board.to_dict()}, "transformers")
    assert all(s["applied"] for s in proof.values()), proof
    assert proof["torch_compile"]["read_back"] is False and proof["bf16"]["read_back"] is False
    assert proof["optim"]["read_back"] == "adamw_torch"
    assert board.overridden() == {"transformers.bf16": [True, False],
                                  "transformers.torch_compile_backend": ["inductor", None],
                                  "transformers.optim": ["adamw_torch_fused", "adamw_torch"],
                                  "transformers.dataloader_num_workers": [2, 0],
                                  "transformers.dataloader_prefetch_factor": [4, None]}


def test_a_switch_the_trainer_has_no_setting_for_is_marked_unsupported(tmp_path):
    board = Board({"optimizer_impl": "fused", "set_to_none": True, "channels_last": True, "prefetch": True})
    Args, Trainer = patched_classes(board)
    tiny_trainer(Args, Trainer, tmp_path, optim="sgd")
    record = board.to_dict()["transformers"]
    assert set(record["unsupported"]) == {"optimizer_impl", "set_to_none", "channels_last", "prefetch"}
    assert "'sgd'" in record["unsupported"]["optimizer_impl"]
    assert "optim" not in record["switches"]


def test_a_switch_that_does_not_take_effect_reads_back_as_not_applied(tmp_path):
    """The Trainer's arguments changed after the adapter set them (as a script's own code might): the proof is
    what the Trainer built, not what was asked."""
    board = Board({"optimizer_impl": "fused"})
    Args, Trainer = patched_classes(board)
    trainer = tiny_trainer(Args, Trainer, tmp_path)
    trainer.args.optim = transformers.training_args.OptimizerNames("adamw_torch")
    trainer.train()
    optim = switches({"frameworks": board.to_dict()}, "transformers")["optim"]
    assert optim["applied"] is False and optim["read_back"] == "adamw_torch"


def test_without_transformers_the_adapters_do_nothing(tmp_path):
    code = ("import sys\nsys.modules['transformers'] = None\n"
            "from trainfast.frameworks import install\n"
            "class Probe: sections = {}\n"
            "board = install(Probe(), {'precision': 'bf16', 'compile': True})\n"
            "try:\n    import transformers.trainer\nexcept ImportError:\n    pass\n"
            "print(board.to_dict(), Probe.sections['frameworks'] is board)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "{} True" and "Traceback" not in out.stderr


@pytest.mark.slow
def test_the_example_under_the_probe_is_switched_and_timed_by_its_optimizer_steps(tmp_path):
    """Every switch of the compile rung proven in the example's own run; the probe's step clock agrees with a
    clock read by the Trainer's own callback around the same steps (within 5%)."""
    script = tmp_path / "timed.py"
    script.write_text(
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(ROOT / 'examples')!r})\n"
        "import transformers, hf_trainer\n"
        "ends = []\n"
        "class Clock(transformers.TrainerCallback):\n"
        "    def on_step_end(self, *a, **k):\n"
        "        ends.append(time.perf_counter())\n"
        "init = transformers.Trainer.__init__\n"
        "def with_clock(self, *a, **k):\n"
        "    init(self, *a, **k)\n"
        "    self.add_callback(Clock())\n"
        "transformers.Trainer.__init__ = with_clock\n"
        "import atexit\n"
        "atexit.register(lambda: json.dump(ends, open('ends.json', 'w')))\n"
        "sys.argv = ['hf_trainer.py', '--train-size', '1024', '--output-dir', 'out']\n"
        "hf_trainer.main()\n")
    fields = {"precision": "bf16", "compile": True, "optimizer_impl": "fused", "num_workers": 0, "seed": 0}
    result = measured_run([str(script)], fields, tmp_path)
    proof = switches(result, "transformers")
    assert proof["torch_compile"]["applied"] and proof["optim"]["read_back"] == "adamw_torch_fused"
    assert proof["bf16"]["applied"] and result["compile"]["frames"] > 0
    # the run ended by itself (full mode): the loader is read back at exit, after the script dropped it
    assert result["stopped"] == "script ended" and proof["dataloader_num_workers"]["applied"] is True
    import json

    ends = json.loads((tmp_path / "ends.json").read_text())
    timing = result["timing"]
    assert result["steps_run"] == len(ends) == 32
    timed = timing["timed_steps"]
    wall = ends[-1] - ends[-1 - timed]       # the callback's clock around the same timed steps
    assert abs(timing["timed_seconds"] - wall) / wall < 0.05, (timing["timed_seconds"], wall)
    # tokens/s: its batches are token ids (instruments/batches.py), each step's predicted tokens counted on the
    # device, more than the Trainer's 32 rows a step; the rate is their sum over the timed seconds
    assert result["rate_unit"] == "tokens/s" and result["unit"] == "tokens" and result["batches"]["task"] == "lm"
    assert all(n > 32 for n in timing["step_samples"])
    clean = [b for b in timing["blocks"] if not b["disturbed"]] or timing["blocks"]
    assert result["throughput"] == pytest.approx(sum(b["samples"] for b in clean) / timing["timed_seconds"], rel=1e-6)


def test_activation_checkpointing_reaches_the_model_and_the_baseline_turns_it_off(tmp_path):
    board = Board({"activation_checkpointing": True})
    Args, Trainer = patched_classes(board)
    trainer = tiny_trainer(Args, Trainer, tmp_path)
    trainer.train()
    assert trainer.model.is_gradient_checkpointing
    assert switches({"frameworks": board.to_dict()}, "transformers")["activation_checkpointing"]["applied"] is True
    board = Board({"activation_checkpointing": False})
    Args, Trainer = patched_classes(board)
    trainer = tiny_trainer(Args, Trainer, tmp_path, gradient_checkpointing=True)
    trainer.train()
    proof = switches({"frameworks": board.to_dict()}, "transformers")["activation_checkpointing"]
    assert not trainer.model.is_gradient_checkpointing and proof["applied"] is True and proof["script"] is True


def test_a_second_trainer_is_the_one_read_back_and_other_read_backs_are_kept(tmp_path):
    board = Board({"cudnn_benchmark": False, "optimizer_impl": "fused"})
    Args, Trainer = patched_classes(board)
    tiny_trainer(Args, Trainer, tmp_path / "a", optim="adamw_torch")
    second = tiny_trainer(Args, Trainer, tmp_path / "b", optim="adamw_torch")
    second.train()
    proof = switches({"frameworks": board.to_dict()}, "transformers")
    assert proof["torch.backends.cudnn.benchmark"]["applied"] is True      # switch_cudnn_benchmark's own reader
    assert proof["optim"]["read_back"] == "adamw_torch_fused"             # the second Trainer's optimizer


@pytest.mark.slow
def test_an_ablation_of_the_example_proves_its_rungs_and_reports_the_scripts_settings(hf_trainer_ablation):
    out, results, _ = hf_trainer_ablation       # conftest: the one ablation of the example test_track reads too
    rungs = {r["name"]: r for r in results["rungs"]}
    assert rungs["set_to_none"]["status"] == "no-effect" and rungs["set_to_none"]["effect"] == "not-applicable"
    for name in ("baseline", "amp", "fused"):
        assert rungs[name]["status"] == "done", rungs[name]
        proof = switches(rungs[name]["runs"][0], "transformers")
        assert all(s["applied"] for s in proof.values()), proof
    assert results["settings"]["framework"].startswith("transformers ")
    assert "transformers optim='adamw_torch_fused'" in results["settings"]["script_settings"]
    report = (out / "report.md").read_text()
    assert "the framework's own settings" in report and "adamw_torch_fused" in report


def test_low_bit_states_go_through_the_trainers_own_optim_and_are_read_back(tmp_path):
    """optimizer_state through TrainingArguments.optim (adamw_torch_8bit: the Trainer builds torchao's AdamW8bit
    itself), read back from the optimizer it stepped; the baseline takes a script's own 4-bit AdamW back to
    adamw_torch and says what the script had."""
    pytest.importorskip("torchao")
    board = Board({"optimizer_state": "8bit", "optimizer_impl": "fused"})
    Args, Trainer = patched_classes(board)
    trainer = tiny_trainer(Args, Trainer, tmp_path, optim="adamw_torch_fused")
    assert trainer.args.optim.value == "adamw_torch_8bit"
    trainer.train()
    assert type(trainer.optimizer.optimizer).__name__ == "AdamW8bit"
    record = board.to_dict()["transformers"]
    assert record["switches"]["optim"] == {"field": "optimizer_state", "setting": "optim", "wanted": "adamw_torch_8bit",
                                           "script": "adamw_torch_fused", "read_back": "adamw_torch_8bit",
                                           "applied": True}
    assert "no foreach/fused choice" in record["unsupported"]["optimizer_impl"]
    baseline = Board({"optimizer_state": "full"})
    Args, Trainer = patched_classes(baseline)
    assert tiny_trainer(Args, Trainer, tmp_path, optim="adamw_torch_4bit").args.optim.value == "adamw_torch"
    assert baseline.to_dict()["transformers"]["switches"]["optim"]["script"] == "adamw_torch_4bit"


def test_batch_scale_scales_the_trainers_batch_lr_and_warmup_and_reads_them_back(tmp_path):
    """batch_scale through the Trainer's own arguments, with the built-in run's arithmetic (sqrt lr, warm-up / k),
    read back from the loader it iterates and the optimizer its scheduler started; accumulation scales
    gradient_accumulation_steps instead, recorded for scale_by, and a warm-up ratio is left alone."""
    import math

    board = Board({"batch_scale": 2})
    Args, Trainer = patched_classes(board)
    trainer = tiny_trainer(Args, Trainer, tmp_path, learning_rate=1e-3, warmup_steps=5, use_cpu=True)
    assert trainer.args.per_device_train_batch_size == 16 and trainer.args.warmup_steps == 3
    assert trainer.args.learning_rate == pytest.approx(1e-3 * math.sqrt(2))
    trainer.train()
    proof = switches({"frameworks": board.to_dict()}, "transformers")
    assert {s: (p["script"], p["applied"]) for s, p in proof.items()} == {
        "per_device_train_batch_size": (8, True), "learning_rate": (1e-3, True), "warmup_steps": (5, True)}
    assert {p["field"] for p in proof.values()} == {"batch_scale"}
    accum = Board({"batch_scale": 4, "scale_by": "accumulation", "lr_scaling": "linear"})
    Args, Trainer = patched_classes(accum)
    args = tiny_trainer(Args, Trainer, tmp_path, learning_rate=1e-3, warmup_steps=0.1, use_cpu=True).args
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.warmup_steps) == (8, 4, 0.1)
    assert args.learning_rate == pytest.approx(4e-3)
    record = accum.to_dict()["transformers"]
    assert record["switches"]["gradient_accumulation_steps"]["field"] == "scale_by"
    assert record["switches"]["learning_rate"]["field"] == "lr_scaling" and "warmup_steps" not in record["switches"]
    assert any("ratio" in note for note in record["notes"])
