"""async_checkpoint: checkpoints written in a background thread hold exactly what a synchronous save holds, the
state as it was at the save (not as the next steps changed it), and fail loudly."""
from __future__ import annotations

import threading

import pytest
import torch
from conftest import tiny_conv
from torch import nn

from trainfast import Recipe, Session, train
from trainfast import checkpoint as ckpt
from trainfast.checkpoint import list_checkpoints, read_checkpoint
from trainfast.data.datasets import load_synthetic
from trainfast.techniques.background_save import BackgroundWriter, SyncWriter, checkpoint_writer, host_copy


@pytest.fixture(scope="module")
def split():
    return load_synthetic(image_size=8, n=200)          # 160 training images: 10 steps of 16 per epoch


def weights(result) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in result.model.state_dict().items()}


def test_the_switch_picks_the_writer():
    assert isinstance(checkpoint_writer(Recipe()), SyncWriter)
    assert isinstance(checkpoint_writer(Recipe(async_checkpoint=True)), BackgroundWriter)


def test_background_checkpoints_equal_synchronous_ones_and_the_run_is_unchanged(tmp_path, split):
    recipe = Recipe(epochs=2, batch_size=16, save_every=4, keep_checkpoints=3)
    sync = train(tiny_conv, split, recipe=recipe, device="cpu", out=tmp_path / "sync")
    background = train(tiny_conv, split, recipe=recipe.replace(async_checkpoint=True), device="cpu",
                       out=tmp_path / "async")
    for a, b in zip(weights(sync).values(), weights(background).values()):
        assert torch.equal(a, b)                         # the loop's arithmetic is untouched
    names = [p.name for p in list_checkpoints(tmp_path / "sync" / "checkpoints")]
    assert names == [p.name for p in list_checkpoints(tmp_path / "async" / "checkpoints")]
    assert len(names) == 3                               # pruned to keep_checkpoints once each save was complete
    for name in names:
        a = read_checkpoint(tmp_path / "sync" / "checkpoints" / name)
        b = read_checkpoint(tmp_path / "async" / "checkpoints" / name)
        assert a["step"] == b["step"] and a["position"] == b["position"]
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), (name, key)
        for (ka, va), (kb, vb) in zip(a["optimizer"]["state"].items(), b["optimizer"]["state"].items()):
            assert torch.equal(va["exp_avg"], vb["exp_avg"])


def test_loader_workers_forked_while_a_save_is_written(tmp_path, split):
    """Workers that are not persistent are forked at every epoch start, right after the epoch-end save began in
    its thread: the run completes with the same weights as with synchronous saves."""
    recipe = Recipe(epochs=3, batch_size=16, num_workers=2, save_every=3)
    sync = train(tiny_conv, split, recipe=recipe, device="cpu", out=tmp_path / "sync")
    background = train(tiny_conv, split, recipe=recipe.replace(async_checkpoint=True), device="cpu",
                       out=tmp_path / "async")
    for a, b in zip(weights(sync).values(), weights(background).values()):
        assert torch.equal(a, b)
    assert len(list_checkpoints(tmp_path / "async" / "checkpoints")) == 2


def test_a_resume_from_a_background_checkpoint_is_bit_exact(tmp_path, split):
    recipe = Recipe(epochs=2, batch_size=16, async_checkpoint=True)
    whole = train(tiny_conv, split, recipe=recipe, device="cpu")
    train(tiny_conv, split, recipe=recipe.replace(epochs=1), device="cpu", out=tmp_path)
    resumed = train(tiny_conv, split, recipe=recipe, device="cpu", out=tmp_path, resume="auto")
    for a, b in zip(weights(whole).values(), weights(resumed).values()):
        assert torch.equal(a, b)


def test_the_file_holds_the_state_at_the_save_not_what_the_loop_did_next(tmp_path, monkeypatch):
    """The writer is held until the loop has changed the weights in place: the file still has the old ones."""
    release, started = threading.Event(), threading.Event()
    real_write = ckpt.write_checkpoint

    def slow_write(payload, path):
        started.set()
        release.wait(10)
        real_write(payload, path)

    monkeypatch.setattr(ckpt, "write_checkpoint", slow_write)
    tf = Session(Recipe(async_checkpoint=True), device="cpu")
    model = nn.Linear(4, 2)
    model, optimizer = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = model.weight.detach().clone()
    monkeypatch.setattr("trainfast.session.write_checkpoint", slow_write)
    tf.save(tmp_path / "a.ckpt")
    assert started.wait(10)
    with torch.no_grad():
        model.weight.add_(1.0)                           # what the next optimizer step does, in place
    assert not (tmp_path / "a.ckpt").exists()            # still being written
    release.set()
    tf.wait_saved()
    saved = read_checkpoint(tmp_path / "a.ckpt")["model"]["weight"]
    assert torch.equal(saved, before) and not torch.equal(saved, model.weight.detach())
    tf.close()


def test_a_failed_background_save_is_raised_and_said(tmp_path, split, monkeypatch, capsys):
    def failing_write(payload, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "write_checkpoint", failing_write)
    with pytest.raises(OSError, match="No space left"):
        train(tiny_conv, split, recipe=Recipe(epochs=1, batch_size=16, async_checkpoint=True), device="cpu",
              out=tmp_path)
    assert "the background save failed: OSError" in capsys.readouterr().err
    assert not list_checkpoints(tmp_path / "checkpoints")


def test_one_save_in_flight_and_its_error_raised_at_the_next():
    writer, order = BackgroundWriter(), []
    gate = threading.Event()
    writer.save("first", lambda name: (gate.wait(10), order.append(name)))
    gate.set()
    writer.save("second", order.append)                  # waits for the first before starting
    writer.wait()
    assert order == ["first", "second"]
    writer.save(0, lambda zero: 1 / zero)
    with pytest.raises(ZeroDivisionError):
        writer.save("third", order.append)
    writer.wait()                                        # the error was handed over once
    assert order == ["first", "second"]


def test_host_copy_copies_tensors_and_keeps_the_structure():
    t = torch.ones(3)
    payload = {"a": [t, (t, 2)], "b": "x", "c": {"d": t}}
    copied = host_copy(payload)
    t.add_(1)
    assert torch.equal(copied["a"][0], torch.ones(3)) and copied["a"][1][1] == 2 and copied["b"] == "x"
    assert torch.equal(copied["c"]["d"], torch.ones(3)) and isinstance(copied["a"][1], tuple)


@pytest.mark.slow
def test_the_ablation_times_saves_only_when_asked_and_rules_the_rung_out_otherwise(tmp_path, digits16):
    from conftest import ablate_one_switch

    unasked = ablate_one_switch(digits16, "async_checkpoint", Recipe(batch_size=64), tmp_path / "a")
    rung = next(r for r in unasked.rungs if r.name == "async_checkpoint")
    assert rung.status == "no-effect" and "--save-every" in rung.reason
    asked = ablate_one_switch(digits16, "async_checkpoint", Recipe(batch_size=64, save_every=4), tmp_path / "b")
    for rung in asked.rungs:
        assert rung.status == "done", (rung.name, rung.status)
        record = rung.repeats[0]
        assert record["checkpoint_saves"] >= 3                     # every 4 steps, in the timed steps too
        assert record["checkpoint_loop_s"] > 0
    assert not list(tmp_path.glob("b/**/*.ckpt"))                    # the rungs' saves went to deleted folders
