"""The bad-file fraction is judged over the run (both splits, all passes, all ranks), never over a split
too small to support it; per-split skipped counts stay exact."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from test_data_pipeline import tiny_model, truncate, write_jpegs

from trainfast import Recipe, train
from trainfast.ablation.server import rung_context
from trainfast.data.badfiles import (MIN_SAMPLES, BadFileError, BadFileTally, Batch, GuardedLoader, join_run_tally,
                                     skipped_last_pass)
from trainfast.data.datasets import Skipped
from trainfast.data.imagefolder import load_imagefolder

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")

BAD = Skipped("x.jpg", "truncated")


def make_photo_folder(root: Path, count: int = 305) -> None:
    """Two classes of real JPEGs plus the readable oddities of real folders: a CMYK JPEG, a grayscale
    JPEG and a PNG named .jpg."""
    for c in range(2):
        write_jpegs(root / f"c{c}", count // 2 + c * (count % 2), seed=c, start=c * count)
    rgb = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    Image.fromarray(rgb).convert("CMYK").save(root / "c0" / "img000.jpg", format="JPEG")
    Image.fromarray(rgb).convert("L").save(root / "c0" / "img001.jpg", format="JPEG")
    Image.fromarray(rgb).save(root / "c1" / f"img{count:03d}.jpg", format="PNG")


def break_val_files(split, count: int) -> list[Path]:
    """Make `count` images of the held-out 20% unreadable (truncated, then zero bytes, alternately)."""
    paths = [path for path, _ in split.val.samples][-count:]
    for i, path in enumerate(paths):
        truncate(path) if i % 2 == 0 else path.write_bytes(b"")
    return paths


def test_bad_files_that_all_land_in_a_small_val_split_do_not_stop_the_run(tmp_path, caplog):
    # The folder: 305 images, 2 unreadable, both in the 61-image val split: 3.3% of that split,
    # 0.66% of what the run reads, under the default max_bad_fraction of 1%.
    make_photo_folder(tmp_path / "photos")
    split = load_imagefolder(str(tmp_path / "photos"), image_size=16)
    assert len(split.val) == 61
    broken = break_val_files(split, 2)
    recipe = Recipe(epochs=2, batch_size=61, num_workers=2, prefetch=True)    # 244 train: 4 full batches
    with caplog.at_level(logging.WARNING, logger="trainfast.data"):
        result = train(tiny_model, split, recipe=recipe, device="cpu")
    assert [r["epoch"] for r in result.history] == [1, 2]
    assert [r["skipped_files"] for r in result.history] == [0, 0]
    assert [r["val_skipped_files"] for r in result.history] == [2, 2]
    assert split.bad_files.seen == 2 * (244 + 61) and split.bad_files.skipped == 4
    for path in broken:
        assert str(path) in caplog.text


def test_the_run_wide_fraction_still_stops_a_run_above_it(tmp_path):
    # 5 unreadable of 305: 1.6% of the run, above 1%, all of them in val: stopped while reading val.
    make_photo_folder(tmp_path / "photos")
    split = load_imagefolder(str(tmp_path / "photos"), image_size=16)
    broken = break_val_files(split, 5)
    with pytest.raises(BadFileError, match="above max_bad_fraction=0.01") as info:
        train(tiny_model, split, recipe=Recipe(batch_size=61, prefetch=True), device="cpu")
    assert any(str(p) in str(info.value) for p in broken)


def test_train_and_val_loaders_share_one_run_tally_and_the_small_split_is_not_judged_alone():
    split = SimpleNamespace(bad_files=None)
    train_tally = BadFileTally(run=join_run_tally(split, 0.01, 240))
    val_tally = BadFileTally(run=join_run_tally(split, 0.01, 61))
    assert train_tally.run is val_tally.run is split.bad_files and split.bad_files.population == 301
    train_tally.record(Batch(None, None, 240))
    val_tally.record(Batch(None, None, 61, ((5, BAD), (40, BAD))))     # 2 of 61 = 3.3%, 2 of 301 = 0.66%
    val_tally.end_pass()
    train_tally.end_pass()
    assert (val_tally.last_pass_skipped, train_tally.last_pass_skipped) == (2, 0)
    assert (split.bad_files.seen, split.bad_files.skipped) == (301, 2)
    assert skipped_last_pass(GuardedLoader([], val_tally)) == 2           # the all-rank check passes too


def test_a_small_split_read_first_is_not_judged_below_min_samples():
    split = SimpleNamespace(bad_files=None)
    val_tally = BadFileTally(run=join_run_tally(split, 0.01, 61))
    BadFileTally(run=join_run_tally(split, 0.01, 240))
    val_tally.record(Batch(None, None, 61, ((0, BAD), (7, BAD))))
    val_tally.end_pass()                                                  # old rule: 2 of 61, stopped here
    assert skipped_last_pass(GuardedLoader([], val_tally)) == 2
    with pytest.raises(BadFileError, match="3 of 100"):                   # judged once 100 were read
        val_tally.record(Batch(None, None, 39, ((0, BAD),)))


def test_a_run_smaller_than_min_samples_is_judged_once_all_of_it_was_read():
    split = SimpleNamespace(bad_files=None)
    train_tally = BadFileTally(run=join_run_tally(split, 0.01, 24))
    val_tally = BadFileTally(run=join_run_tally(split, 0.01, 4))
    assert split.bad_files.min_samples() == 28 < MIN_SAMPLES
    train_tally.record(Batch(None, None, 24, ((1, BAD), (9, BAD), (17, BAD))))
    train_tally.end_pass()
    with pytest.raises(BadFileError, match="3 of 28"):                    # the exact share of the whole data
        val_tally.record(Batch(None, None, 4))


def test_a_small_folder_is_judged_in_its_first_epoch_though_full_batches_never_read_all_of_it(tmp_path):
    """A training loader drops its partial last batch, so an epoch reads less than the folder holds: the run is
    judged once it has read what one pass of each loader reads, not the whole folder (which never came)."""
    for c in range(2):
        write_jpegs(tmp_path / "photos" / f"c{c}", 13 - c, seed=c, start=c * 13)
    split = load_imagefolder(str(tmp_path / "photos"), image_size=16)
    broken = break_val_files(split, 1)
    one_pass = len(split.train) // 8 * 8 + len(split.val)
    assert one_pass < len(split.train) + len(split.val)
    with pytest.raises(BadFileError, match=f"1 of {one_pass} images read") as info:
        train(tiny_model, split, recipe=Recipe(epochs=1, batch_size=8), device="cpu")
    assert str(broken[0]) in str(info.value)


def test_a_loader_built_after_reading_began_counts_a_new_run():
    split = SimpleNamespace(bad_files=None)
    first = GuardedLoader([Batch(None, None, 4, ((0, BAD),))], BadFileTally(run=join_run_tally(split, 0.5, 4)))
    assert len(list(first)) == 1
    second = BadFileTally(run=join_run_tally(split, 0.01, 8))
    assert second.run is not first.tally.run and second.run is split.bad_files
    assert (second.run.seen, second.run.skipped, second.run.population) == (0, 0, 8)


# ------------------------------------------------------------------------------------------------
# two ranks (gloo): the fraction over all ranks, decided by every rank at once


def judge_on_rank(rank: int, init_file: str, bad_on_rank: list[int], out: str) -> None:
    """One rank: reads 60 images of which bad_on_rank[rank] are unreadable, then the collective check."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        bad = tuple((i, BAD) for i in range(0, 2 * bad_on_rank[rank], 2))    # never 10 in a row
        loader = GuardedLoader([Batch(None, None, 60, bad)], BadFileTally(run=join_run_tally(None, 0.01, 120)))
        list(loader)
        try:
            report = {"skipped": skipped_last_pass(loader)}
        except BadFileError as exc:
            report = {"error": str(exc)}
    finally:
        dist.destroy_process_group()
    Path(out).write_text(json.dumps(report))


def judge_on_two_ranks(tmp_path: Path, bad_on_rank: list[int]) -> list[dict]:
    ctx = rung_context()     # forked from the rung server, which imported torch and trainfast once for the test run
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [ctx.Process(target=judge_on_rank, args=(r, str(tmp_path / "rdzv"), bad_on_rank, str(outs[r])))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    return [json.loads(out.read_text()) for out in outs]


def test_all_ranks_stop_together_on_the_fraction_over_all_ranks(tmp_path):
    # 1 unreadable of 60 on each rank: neither rank stops alone (1 is not above 1% of the 120 both
    # read), the sum over ranks is 2 of 120 (1.7%): both ranks stop, at the same collective.
    reports = judge_on_two_ranks(tmp_path, [1, 1])
    assert all("2 of 120 images read (1.7%) on all ranks" in r.get("error", "") for r in reports), reports


def test_ranks_agree_to_go_on_under_the_fraction(tmp_path):
    # 1 of 120 over both ranks: under 1%; every rank gets the summed per-pass count.
    assert judge_on_two_ranks(tmp_path, [0, 1]) == [{"skipped": 1}, {"skipped": 1}]
