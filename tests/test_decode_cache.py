"""decode_cache: decode an image folder once, then read uint8 pixels. The crops must be the very bytes the
file path gives, bad files must still be skipped and counted, a changed folder must not read stale pixels,
an interrupted build must never be read, and a full disk must be refused before anything is written."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch
from test_data_pipeline import make_folder, tiny_model, write_jpegs

from trainfast import Recipe, train
from trainfast.data.datasets import DataError, Skipped
from trainfast.data.decoded_cache import cache_root, open_or_build, with_decode_cache
from trainfast.data.imagefolder import decode_bytes, load_imagefolder, read_bytes

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")


def items(dataset, seed: int = 0) -> list:
    torch.manual_seed(seed)               # the crops' random draws come from torch's RNG
    return [dataset[i] for i in range(len(dataset))]


def test_cached_crops_are_bit_identical_and_bad_files_still_skipped(tmp_path):
    broken = make_folder(tmp_path / "photos", per_class=6, bad=2, size=(60, 45))
    split = load_imagefolder(str(tmp_path / "photos"), image_size=24)
    cached = with_decode_cache(split, Recipe(decode_cache=True), log=lambda _: None)
    assert split.train.pixels is None                     # the caller's split is left as it was
    for plain, fast in ((split.train, cached.train), (split.val, cached.val)):
        assert fast.pixels is not None
        for a, b in zip(items(plain), items(fast)):
            if isinstance(a, Skipped):
                assert isinstance(b, Skipped) and a.path == b.path   # not cached: read, skipped, counted
            else:
                assert torch.equal(a[0], b[0]) and a[1] == b[1]
    cached_counts = cached.train.pixels.count + cached.val.pixels.count
    assert cached_counts == len(split.train) + len(split.val) - len(broken)


def test_training_with_the_cache_gives_the_same_weights(tmp_path):
    make_folder(tmp_path / "photos", per_class=8, size=(40, 30))
    split = load_imagefolder(str(tmp_path / "photos"), image_size=16)
    recipe = Recipe(batch_size=4, epochs=2, optimizer="sgd", lr=0.05)
    plain = train(tiny_model, split, recipe=recipe, device="cpu").model.state_dict()
    fast = train(tiny_model, split, recipe=recipe.replace(decode_cache=True), device="cpu").model.state_dict()
    assert all(torch.equal(plain[k], fast[k]) for k in plain)


def test_a_changed_folder_gets_a_new_cache_and_a_partial_build_is_never_read(tmp_path):
    paths = write_jpegs(tmp_path / "c0", 3, size=(30, 20))
    first = open_or_build(paths, log=lambda _: None)
    again = open_or_build(paths, log=lambda _: None)
    assert again.folder == first.folder                  # found, not rebuilt
    write_jpegs(tmp_path / "c0", 1, size=(30, 20), seed=7)   # img000 rewritten: new content, new mtime/size
    os.utime(paths[0], ns=(1, 1))                        # and a different modification time for sure
    changed = open_or_build(paths, log=lambda _: None)
    assert changed.folder != first.folder
    assert torch.equal(changed.get(0), decode_bytes(read_bytes(paths[0]), paths[0]))
    # An interrupted build leaves only .partial files: ignored, the cache is built again.
    fresh = write_jpegs(tmp_path / "c1", 2, size=(30, 20))
    built = open_or_build(fresh, log=lambda _: None)
    (built.folder / "index.npz").unlink()
    (built.folder / "pixels.u8").rename(built.folder / "pixels.u8.partial")
    rebuilt = open_or_build(fresh, log=lambda _: None)
    assert (rebuilt.folder / "index.npz").is_file()
    assert torch.equal(rebuilt.get(1), decode_bytes(read_bytes(fresh[1]), fresh[1]))


def test_not_enough_disk_is_refused_before_writing(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    paths = write_jpegs(tmp_path / "c0", 2, size=(30, 20))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10, 10, 100))   # 100 bytes free
    with pytest.raises(DataError, match="TRAINFAST_CACHE"):
        open_or_build(paths, log=lambda _: None)
    assert not list(cache_root().rglob("pixels.u8*"))


def test_other_ranks_wait_for_the_builder(tmp_path):
    paths = write_jpegs(tmp_path / "c0", 2, size=(30, 20))
    waited = {}
    waiter = threading.Thread(target=lambda: waited.update(pixels=open_or_build(paths, build=False, poll_s=0.01)))
    waiter.start()
    built = open_or_build(paths, log=lambda _: None)
    waiter.join(timeout=30)
    assert not waiter.is_alive() and waited["pixels"].folder == built.folder
    assert np.array_equal(waited["pixels"].offsets, built.offsets)


@pytest.mark.slow
def test_the_ablation_rung_is_no_effect_on_in_memory_data(tmp_path):
    from trainfast.ablation import TimingBudget, ablate

    # the baseline alone runs: one pass, a few timed steps (what is read is the rung's reason)
    result = ablate("resnet9", data="synthetic", image_size=8, rungs=["decode_cache"], noise_seeds=1, repeats=1,
                    recipe=Recipe(batch_size=16), device="cpu", out=tmp_path / "r", show=False, settle_within_s=0,
                    budget=TimingBudget(steps=4, seconds=1.0, floor=2, min_seconds=0.0))
    rung = result.rungs[1]
    assert rung.name == "decode_cache" and rung.status == "no-effect" and "image folders" in rung.reason


def test_parallel_build_writes_every_image_at_its_offset(tmp_path):
    paths = write_jpegs(tmp_path / "c0", 9, size=(31, 17)) + write_jpegs(tmp_path / "c1", 3, size=(20, 40), seed=3)
    (tmp_path / "c1" / "img000.jpg").write_bytes(b"not a jpeg")      # left out, read (and skipped) at train time
    logs = []
    pixels = open_or_build(paths, workers=2, log=logs.append)
    assert pixels.count == len(paths) - 1 and not pixels.cached[9]
    assert pixels.get(9) is None and any("could not be decoded" in line for line in logs)
    for i, path in enumerate(paths):
        if i != 9:
            assert torch.equal(pixels.get(i), decode_bytes(read_bytes(path), path))


def test_the_cache_is_made_once_before_the_runs_that_read_it(monkeypatch):
    """The ablation prepares what a switch's runs read from the declaration (Switch.prepare), once, from the first
    recipe that turns it on; a plan without it prepares nothing."""
    import trainfast.data.decoded_cache as decoded_cache
    from trainfast import techniques

    calls = []
    monkeypatch.setattr(decoded_cache, "with_decode_cache", lambda split, recipe: calls.append((split, recipe)))
    first = Recipe(decode_cache=True, num_workers=2)
    techniques.prepare_once("split", [Recipe(), first, Recipe(decode_cache=True)])
    assert calls == [("split", first)]
    techniques.prepare_once("split", [Recipe(), Recipe(num_workers=2)])
    assert len(calls) == 1
