"""Checkpoint files: atomic writes under SIGKILL, partial-file cleanup, checksum fallback, safe loading
(a crafted pickle never runs), safe YAML, the non-finite policies, and resume refusals."""
from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_conv
from torch import nn

from trainfast import Recipe, train
from trainfast.checkpoint import (HEADER, CheckpointError, CorruptCheckpoint, UnsafeCheckpoint, checkpoint_path,
                                  list_checkpoints, load_newest, prune, read_checkpoint, remove_partials, safe_load,
                                  write_checkpoint)
from trainfast.data.datasets import load_synthetic
from trainfast.engine import train_one_epoch
from trainfast.measure import Meter, NonFiniteLossError
from trainfast.session import build_state


@pytest.fixture(scope="module")
def split():
    return load_synthetic(image_size=8, n=400)          # 320 training images: 20 steps of 16 per epoch


# --- kill the writer mid-save ------------------------------------------------------------------------

# 16 MB per checkpoint: most of a save's time is spent writing, so kills land mid-write. Made in the
# parent: the forked writer must not run parallel torch ops (OpenMP's thread pool does not survive fork).
BIG = torch.arange(4_000_000, dtype=torch.float32)


def _writer(folder: str, ready) -> None:
    """A run's writer: clean up at startup, continue after the newest checkpoint, save forever."""
    torch.set_num_threads(1)
    folder = Path(folder)
    remove_partials(folder)
    newest = list_checkpoints(folder)
    step = int(newest[0].stem.split("-")[1]) if newest else 0
    while True:
        step += 1
        write_checkpoint({"step": step, "tag": torch.tensor([step]), "w": BIG}, checkpoint_path(folder, step))
        prune(folder, 2)
        ready.set()


def test_kill_during_save_keeps_newest_complete_and_cleans_partials(tmp_path):
    ctx = multiprocessing.get_context("fork")           # torch is already imported: a fork starts in ms
    partials_seen = 0
    last_step = 0
    for point in range(10):
        ready = ctx.Event()
        writer = ctx.Process(target=_writer, args=(str(tmp_path), ready), daemon=True)
        writer.start()
        assert ready.wait(60), "the writer never completed a save"
        time.sleep(random.Random(point).uniform(0.0, 0.4))
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        partials = list(tmp_path.glob(".*.tmp"))
        partials_seen += bool(partials)
        listed = list_checkpoints(tmp_path)
        assert not any(p.name.startswith(".") for p in listed)          # partial files are never candidates
        assert 1 <= len(listed) <= 3                                     # keep=2, plus one not yet pruned
        path, payload = load_newest(tmp_path, log=pytest.fail)           # no corrupt file among the complete ones
        assert path == listed[0] and payload["step"] > last_step
        assert payload["tag"].item() == payload["step"] and torch.equal(payload["w"], BIG)
        last_step = payload["step"]
    assert partials_seen > 0, "no kill landed mid-write: the test did not exercise partial files"
    removed = remove_partials(tmp_path)                                  # what the next run does at startup
    assert len(removed) == len(list(tmp_path.glob(".*.tmp"))) + len(removed) and not list(tmp_path.glob(".*.tmp"))


# --- corrupt and crafted files --------------------------------------------------------------------------

def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_flipped_byte_is_detected_and_previous_checkpoint_used(tmp_path):
    for step in (5, 10):
        write_checkpoint({"step": step, "w": torch.arange(1000.0) * step}, checkpoint_path(tmp_path, step))
    newest = checkpoint_path(tmp_path, 10)
    _flip_byte(newest, HEADER.size + (newest.stat().st_size - HEADER.size) // 2)
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        read_checkpoint(newest)
    messages = []
    path, payload = load_newest(tmp_path, log=messages.append)
    assert path == checkpoint_path(tmp_path, 5) and payload["step"] == 5
    assert torch.equal(payload["w"], torch.arange(1000.0) * 5)
    assert len(messages) == 1 and "step-000000010.ckpt" in messages[0] and "checksum mismatch" in messages[0]


def test_truncated_checkpoint_is_corrupt(tmp_path):
    path = checkpoint_path(tmp_path, 1)
    write_checkpoint({"step": 1, "w": torch.ones(100)}, path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CorruptCheckpoint, match="truncated"):
        read_checkpoint(path)


class _CreatesFile:
    """Unpickling this calls open(path, 'w'): a stand-in for any code a crafted checkpoint could run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_crafted_checkpoint_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = {"step": 3, "model": {"w": torch.ones(2)}, "x": _CreatesFile(str(marker))}
    # With a valid header and checksum (an attacker can compute those): weights_only refuses it.
    path = checkpoint_path(tmp_path, 3)
    write_checkpoint(evil, path)
    with pytest.raises(UnsafeCheckpoint, match=r"python object (io|builtins)\.open") as info:
        read_checkpoint(path)
    assert "weights_only=True" in str(info.value) and str(path) in str(info.value)
    assert not marker.exists()
    # A resume does not fall back past it to an older file: tampering stops the run.
    write_checkpoint({"step": 1}, checkpoint_path(tmp_path, 1))
    with pytest.raises(UnsafeCheckpoint):
        load_newest(tmp_path, log=lambda m: None)
    assert not marker.exists()
    # A plain torch.save file (no header), e.g. a model.pt from a stranger, through safe_load.
    plain = tmp_path / "model.pt"
    torch.save(evil, plain)
    with pytest.raises(UnsafeCheckpoint, match=r"python object (io|builtins)\.open"):
        safe_load(plain)
    assert not marker.exists()


# A YAML config with a python object tag is refused: tests/test_recipe.py::test_yaml_python_object_tag_is_refused


# --- resume through train() -----------------------------------------------------------------------------

def test_resume_falls_back_past_a_corrupt_checkpoint_and_refuses_a_changed_recipe(tmp_path, split, capsys):
    recipe = Recipe(epochs=1, batch_size=16, save_every=5, keep_checkpoints=2)
    train(tiny_conv, split, recipe=recipe, device="cpu", out=tmp_path)
    folder = tmp_path / "checkpoints"
    assert [p.name for p in list_checkpoints(folder)] == ["step-000000020.ckpt", "step-000000015.ckpt"]
    with pytest.raises(CheckpointError, match="--resume auto"):          # a fresh run must not mix with old files
        train(tiny_conv, split, recipe=recipe, device="cpu", out=tmp_path)
    with pytest.raises(CheckpointError, match=r"lr: 0\.002 -> 0\.1"):
        train(tiny_conv, split, recipe=recipe.replace(lr=0.1), device="cpu", out=tmp_path, resume="auto")
    newest = checkpoint_path(folder, 20)
    _flip_byte(newest, newest.stat().st_size - 100)
    capsys.readouterr()
    result = train(tiny_conv, split, recipe=recipe.replace(epochs=2), device="cpu", out=tmp_path, resume="auto")
    err = capsys.readouterr().err
    assert "step-000000020.ckpt" in err and "checksum mismatch" in err and "resumed from step-000000015.ckpt" in err
    assert result.state.step == 40 and [r["epoch"] for r in result.history] == [1, 2]


# --- a full disk -----------------------------------------------------------------------------------

class FullDisk:
    """A file that takes `room` bytes, then fails as a full disk does (ENOSPC)."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __call__(self, data) -> int:
        import errno

        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)


def test_a_full_disk_is_named_and_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    """torch.save's zip writer turns the disk's ENOSPC into a RuntimeError ("unexpected pos"); the error the
    user gets names the file, the system's reason and the free space, and nothing half-written is left."""
    from trainfast import checkpoint
    from trainfast.checkpoint import WriteError

    path = checkpoint_path(tmp_path, 1)
    write_checkpoint({"step": 1, "w": BIG}, path)
    before = path.read_bytes()
    monkeypatch.setattr(checkpoint._HashingWriter, "write",
                        lambda self, data, full=FullDisk(1_000_000): full(data) and self.f.write(data))
    with pytest.raises(WriteError, match=r"step.*could not be written: No space left on device; [\d,]+ MiB free there"
                       ) as info:
        write_checkpoint({"step": 1, "w": BIG * 2}, path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before                                  # the previous file, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]    # no partial temp file


def test_train_stops_on_a_full_disk_with_the_file_named(tmp_path, monkeypatch, capsys):
    """`trainfast train` whose checkpoint cannot be written: exit 1, one line naming the checkpoint and why,
    no traceback."""
    from trainfast import checkpoint
    from trainfast.cli import main

    monkeypatch.setattr(checkpoint._HashingWriter, "write",
                        lambda self, data, full=FullDisk(10_000): full(data) and self.f.write(data))
    assert main(["train", "--image-size", "8", "--epochs", "1", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("trainfast train: error: [Errno 28] ")
    assert ".ckpt: could not be written: No space left on device" in err and "Traceback" not in err
    assert not list((tmp_path / "run" / "checkpoints").glob("*"))       # no checkpoint, not even a partial one


def test_cli_resume_needs_a_run_folder(capsys):
    from trainfast.cli import main

    assert main(["train", "--resume", "auto", "--epochs", "1"]) == 2
    assert "--resume needs --out DIR" in capsys.readouterr().err


def test_stop_policy_raises_and_keeps_last_good_checkpoint(tmp_path, split):
    calls = {"n": 0}

    def loss_fn(outputs, targets):                       # the loss turns NaN from the 13th step on
        calls["n"] += 1
        loss = nn.functional.cross_entropy(outputs, targets)
        return loss * float("nan") if calls["n"] >= 13 else loss

    recipe = Recipe(epochs=1, batch_size=16, save_every=5, log_every=4)
    with pytest.raises(NonFiniteLossError, match="step 12"):
        train(tiny_conv, split, loss_fn=loss_fn, recipe=recipe, device="cpu", out=tmp_path)
    listed = list_checkpoints(tmp_path / "checkpoints")
    assert [p.name for p in listed] == ["step-000000010.ckpt", "step-000000005.ckpt"]   # no save at 15
    payload = read_checkpoint(listed[0])
    assert all(torch.isfinite(v).all() for v in payload["model"].values() if v.is_floating_point())


def test_skip_policy_leaves_parameters_unchanged_and_counts_exactly(split):
    recipe = Recipe(batch_size=16, nonfinite="skip", max_consecutive_skips=3, log_every=5)
    torch.manual_seed(0)
    state = build_state(tiny_conv(), recipe, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(12)]
    bad_steps = {2, 5, 6, 9}
    snapshots = []

    def loss_fn(outputs, targets):
        step = state.step
        snapshots.append([p.detach().clone() for p in state.model.parameters()])
        loss = nn.functional.cross_entropy(outputs, targets)
        return loss * float("inf") if step in bad_steps else loss

    meter = Meter(torch.device("cpu"), recipe.log_every, stop_on_nonfinite=False)
    train_one_epoch(state, batches, loss_fn, meter)
    snapshots.append([p.detach().clone() for p in state.model.parameters()])
    for step in range(12):
        same = all(torch.equal(a, b) for a, b in zip(snapshots[step], snapshots[step + 1]))
        assert same == (step in bad_steps), f"step {step}"
    assert state.nonfinite.metrics() == {"nonfinite_skipped": 4}
    assert sum(not torch.isfinite(torch.tensor(v)) for v in meter.stats.losses) == 4
    assert state.step == 12 and state.scheduler.last_epoch == 12

    bad_steps.update({13, 14, 15})                      # three in a row: abort
    with pytest.raises(NonFiniteLossError, match="3 consecutive"):
        train_one_epoch(state, batches, loss_fn, Meter(torch.device("cpu"), 5, stop_on_nonfinite=False))
    assert state.nonfinite.metrics() == {"nonfinite_skipped": 7}
