"""`trainfast train` writes a run folder: metrics per epoch, the recipe used, the final weights."""
import json

import torch

from trainfast.checkpoint import safe_load
from trainfast.cli import main
from trainfast.models import build_model


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    """`trainfast ARGV` through the CLI's main() in this process (an interpreter's start saved per run): its
    exit code, stdout and stderr. test_a_bad_out_folder_is_refused... runs the entry point itself."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_train_writes_run_folder(tmp_path, capsys):
    from trainfast.techniques.precision import slow_half_reason

    out = tmp_path / "run"
    # bf16 where the CPU computes it fast; fp32 on one without half hardware (bf16 steps there are ~13x slower)
    precision = "fp32" if slow_half_reason(torch.device("cpu"), "bf16") else "bf16"
    code, _, err = run_main(["train", "--image-size", "16", "--epochs", "2", "--precision", precision, "--set-to-none",
                             "--out", str(out)], capsys)
    assert code == 0, err
    lines = (out / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["epoch"] for r in records] == [1, 2]
    assert records[-1]["val_accuracy"] > 0.5
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["precision"] == precision and recipe["set_to_none"] is True and recipe["epochs"] == 2
    weights = safe_load(out / "model.pt")
    model = build_model("resnet9", 10)
    model.load_state_dict(weights)
    assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())


def test_model_refused_for_its_input_before_the_bar(tmp_path, capsys):
    """A named model that cannot take the image size is refused with the flag and the size it takes, before any
    step, with no progress bar drawn and no run folder written."""
    out = tmp_path / "run"
    code, stdout, stderr = run_main(["train", "--model", "convnext_atto", "--image-size", "16", "--epochs", "1",
                                     "--out", str(out)], capsys)
    assert code != 0
    assert "--model convnext_atto cannot take 16x16 images (--image-size 16)" in stderr
    assert "it takes --image-size 32" in stderr
    assert "Traceback" not in stderr
    assert "train" not in stdout                         # the bar ("train ━━ 0/22") never started
    assert not (out / "metrics.jsonl").exists()


def test_a_batch_larger_than_the_training_set_is_refused_not_trained_as_nothing(tmp_path, capsys):
    """Full batches only: a batch larger than the training set would make an epoch of no step (a loss of 0, a
    model never trained, a timed run that waits for ever). Refused with the flag, the size and the way out."""
    out = tmp_path / "run"
    code, _, stderr = run_main(["train", "--image-size", "16", "--batch-size", "5000", "--out", str(out)], capsys)
    assert code == 2 and "Traceback" not in stderr, stderr
    assert "--batch-size 5000 is larger than the training set's" in stderr and "at most" in stderr
    assert not (out / "metrics.jsonl").exists() and not (out / "model.pt").exists()


def test_a_bad_out_folder_is_refused_before_any_work_naming_the_flag(tmp_path, capsys):
    """A file where the folder should be, a path under a file, a run folder holding an earlier run's checkpoints:
    each refused with --out named, no traceback, before the bar or a step; a folder only probed is removed. Each
    through main() in this process (an interpreter's start saved each: `python -m trainfast` exits with main()'s
    status, as the end-to-end tests run it)."""
    (tmp_path / "file").write_text("not a folder")
    earlier = tmp_path / "earlier" / "checkpoints"
    earlier.mkdir(parents=True)
    (earlier / "step-000000002.ckpt").write_bytes(b"")
    cases = ((tmp_path / "file", "is a file, not a folder"),
             (tmp_path / "file" / "sub", "the folder cannot be made there (Not a directory)"),
             (tmp_path / "earlier", "holds checkpoints of an earlier run (step-000000002.ckpt)"))
    for out, message in cases:
        code = main(["train", "--image-size", "16", "--model", "convnext_atto", "--out", str(out)])
        stdout, stderr = capsys.readouterr()
        assert code == 2 and f"--out {out}" in stderr and message in stderr, stderr
        assert "Traceback" not in stderr and "train" not in stdout
    from trainfast.cliargs import check_out_folder

    check_out_folder(tmp_path / "new" / "deep", fresh=True)               # can be made: nothing left behind
    assert not (tmp_path / "new").exists()


def test_a_switch_that_cannot_act_here_is_said_not_passed_over():
    """A recipe moves between machines: CUDA-only switches are accepted on the CPU, with a note each."""
    from trainfast.cli import idle_switches
    from trainfast.recipe import Recipe

    notes = idle_switches(Recipe(non_blocking=True, pin_memory=True, cudnn_benchmark=True, channels_last=True),
                          torch.device("cpu"), None)
    assert [n.split(" has no effect here")[0] for n in notes] == ["--non-blocking", "--pin-memory", "--cudnn-benchmark"]
    assert all("on cpu it changes nothing" in n for n in notes)
    assert idle_switches(Recipe(strategy="fsdp"), torch.device("cpu"), None) == [
        "--strategy fsdp has no effect here: one process has nothing to shard over (start it under torchrun "
        "--nproc-per-node N)"]
