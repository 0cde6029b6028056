"""The input pipeline: uint8 transport equals the float32 reference, per-(rank, worker, epoch) seeds,
unreadable files skipped and counted, thresholds, folder errors, num_workers=auto, bench-data."""
from __future__ import annotations

import logging
import pickle
import random

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

from trainfast import Recipe, RecipeError, train
from trainfast.data.badfiles import BadFileError, BadFileTally, Batch, GuardedLoader, collate_skipping, reduce_count
from trainfast.data.datasets import DataError, Skipped, load_synthetic
from trainfast.data.imagefolder import ImageFiles, load_imagefolder, scan_folder
from trainfast.data.loader import build_loader, choose_num_workers, resolve_num_workers
from trainfast.data.pipeline import build_batches
from trainfast.session import seed_everything

CPU = torch.device("cpu")
# The reference crops decode with torchvision.io (deprecated since torchvision 0.29 in favour of TorchCodec, which
# trainfast decodes with): an independent decoder the product's pixels must equal. Its warning is silenced here only.
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")


def write_jpegs(folder, count: int, size=(40, 30), seed: int = 0, start: int = 0) -> list:
    """Real JPEG files (smooth colour gradients plus noise, so they compress like photos)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(start, start + count):
        w, h = size
        base = np.linspace(0, 255, w)[None, :, None] * rng.uniform(0.2, 1.0, 3)[None, None, :]
        pixels = np.clip(base + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
        path = folder / f"img{i:03d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    return paths


def truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def make_folder(root, per_class: int, classes: int = 2, bad: int = 0, size=(40, 30)) -> list:
    """root/<class>/*.jpg; truncates `bad` files spread over the classes; returns the truncated paths."""
    paths = []
    for c in range(classes):
        paths += write_jpegs(root / f"c{c}", per_class, size, seed=c, start=c * per_class)
    broken = paths[1::max(1, len(paths) // max(1, bad))][:bad]
    for p in broken:
        truncate(p)
    return broken


def tiny_model(num_classes: int = 2, size: int = 16) -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(3 * 16, num_classes))


# ------------------------------------------------------------------------------------------------
# uint8 transport + on-device normalization == float32 reference


def test_uint8_transport_with_device_normalization_equals_float32_reference(tmp_path):
    from torchvision.transforms import v2

    make_folder(tmp_path / "photos", per_class=8)
    split = load_imagefolder(str(tmp_path / "photos"), image_size=24)
    fast = Recipe(batch_size=4, prefetch=True)
    plain = Recipe(batch_size=4, prefetch=False)

    def first_batches(recipe, n=3):
        seed_everything(0)        # same crops: the main process's RNG draws them (num_workers=0)
        batches = build_batches(split.train, split, recipe, CPU, train=True)
        out = []
        for inputs, targets in batches:
            out.append((inputs.clone(), targets.clone()))
            if len(out) == n:
                break
        return out

    on_device = first_batches(fast)
    on_host = first_batches(plain)
    # The uint8 crops themselves, then torchvision's float32 reference per sample on the same crops.
    seed_everything(0)
    raw = build_loader(split.train, fast, CPU, True, split)
    reference = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(split.mean, split.std)])
    for (fast_x, fast_y), (host_x, host_y), (crops, crop_y) in zip(on_device, on_host, raw):
        assert crops.dtype == torch.uint8            # what travels through workers and collate
        assert fast_x.dtype == host_x.dtype == torch.float32
        assert torch.equal(fast_y, host_y) and torch.equal(fast_y, crop_y)
        torch.testing.assert_close(fast_x, host_x, atol=1e-6, rtol=0)
        expected = torch.stack([reference(c) for c in crops])
        torch.testing.assert_close(fast_x, expected, atol=1e-6, rtol=0)


def test_train_crop_is_uint8_square_and_val_crop_is_centred(tmp_path):
    paths = write_jpegs(tmp_path / "c0", 1, size=(50, 30))
    train_item = ImageFiles([(paths[0], 0)], 16, train=True)[0]
    val_a, val_b = ImageFiles([(paths[0], 0)], 16)[0], ImageFiles([(paths[0], 0)], 16)[0]
    assert train_item[0].dtype == torch.uint8 and train_item[0].shape == (3, 16, 16)
    assert torch.equal(val_a[0], val_b[0])          # deterministic


def reference_train_crop(path, size: int) -> torch.Tensor:
    """What TrainCrop must equal when no DCT reduction applies: decode the whole file with
    torchvision.io.decode_jpeg (libjpeg-turbo, as TorchCodec), then torchvision's RandomResizedCrop parameters,
    resize and flip."""
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms import RandomResizedCrop
    from torchvision.transforms.v2 import functional as TF

    image = decode_jpeg(read_file(str(path)))
    top, left, h, w = RandomResizedCrop.get_params(image, (0.08, 1.0), (3 / 4, 4 / 3))
    image = TF.resized_crop(image, top, left, h, w, [size, size], antialias=True)
    return image.flip(-1) if torch.rand(1).item() < 0.5 else image


def test_train_crop_equals_full_decode_reference_when_no_reduction_applies(tmp_path):
    from trainfast.data.imagefolder import TrainCrop

    paths = write_jpegs(tmp_path / "c0", 6, size=(50, 40))   # a 50x40 image never has a crop >= 2 x 24
    crop = TrainCrop(24)
    for i, path in enumerate(paths):
        torch.manual_seed(i)
        expected = reference_train_crop(path, 24)
        torch.manual_seed(i)
        assert torch.equal(crop(path), expected)     # same decoder, same draws, same kernels: same bytes


def test_reduced_jpeg_decode_applies_only_where_the_crop_allows_and_keeps_the_geometry(tmp_path):
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms.v2 import functional as TF

    from trainfast.data.imagefolder import dct_reduction, decode_jpeg_region

    assert dct_reduction(447, 1000, 224) == 1 and dct_reduction(448, 448, 224) == 2
    assert dct_reduction(900, 1800, 224) == 4 and dct_reduction(4000, 3000, 224) == 8
    # A smooth image (two gradients + mild noise) at 4-8x the output size: every box below allows a reduction.
    rng = np.random.default_rng(0)
    x, y = np.meshgrid(np.linspace(0, 1, 128), np.linspace(0, 1, 96))
    pixels = np.stack([200 * x + 20, 200 * y + 20, 120 * x * y + 60], axis=-1) + rng.normal(0, 3, (96, 128, 3))
    path = tmp_path / "smooth.jpg"
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)
    full = decode_jpeg(read_file(str(path)))
    for box in [(0, 0, 128, 96), (5, 7, 69, 71), (30, 10, 94, 74)]:
        with Image.open(path) as image:
            region = decode_jpeg_region(image, box, 16)
            reduced_size = image.size
        expected_reduction = dct_reduction(box[2] - box[0], box[3] - box[1], 16)
        assert expected_reduction > 1
        assert reduced_size == (-(-128 // expected_reduction), -(-96 // expected_reduction))
        assert region.dtype == torch.uint8 and min(region.shape[1:]) >= 16
        ours = TF.resize(region, [16, 16], antialias=True).float()
        reference = TF.resize(full[:, box[1]:box[3], box[0]:box[2]], [16, 16], antialias=True).float()
        # The same picture: DCT-domain downscale vs antialiased resize, box edges rounded to the reduced
        # grid (<= half an output pixel). The steepest gradient here rises ~6 levels per output pixel
        # (1.56 per source pixel, 4 source pixels each), so < 4 levels apart means aligned within ~0.6
        # output pixel, where two crops 64 source pixels apart differ by > 30 levels.
        assert (ours - reference).abs().mean() < 4.0
    far = TF.resize(full[:, 0:64, 64:128], [16, 16], antialias=True).float()
    near = TF.resize(full[:, 0:64, 0:64], [16, 16], antialias=True).float()
    assert (far - near).abs().mean() > 30.0


def test_train_crop_on_a_large_jpeg_decodes_reduced_to_the_right_size(tmp_path):
    from trainfast.data.imagefolder import TrainCrop, ValCrop

    path = write_jpegs(tmp_path, 1, size=(400, 300))[0]
    torch.manual_seed(0)
    outputs = [TrainCrop(32)(path) for _ in range(20)] + [ValCrop(32)(path)]
    assert all(o.shape == (3, 32, 32) and o.dtype == torch.uint8 and o.is_contiguous() for o in outputs)


# ------------------------------------------------------------------------------------------------
# seeding


class Draws(Dataset):
    """Item i -> (first draws of torch, python and numpy RNGs in this worker, worker id)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index):
        info = torch.utils.data.get_worker_info()
        draws = torch.tensor([torch.rand(1).item(), random.random(), float(np.random.rand())], dtype=torch.float64)
        return draws, info.id if info is not None else -1


def collect_worker_draws(seed: int, rank: int, persistent: bool) -> dict:
    recipe = Recipe(batch_size=1, num_workers=2, prefetch=True, seed=seed, persistent_workers=persistent)
    loader = build_loader(Draws(), recipe, CPU, False, split=None, rank=rank)
    first = {}
    for epoch in range(2):
        for draws, worker in loader:
            first.setdefault((rank, int(worker), epoch), tuple(draws[0].tolist()))
    return first


def test_an_evaluation_with_no_more_batches_than_workers_reads_in_process():
    # Workers would have no second batch to prepare, and kept alive they make the next epoch copy every page it
    # writes (eval_workers); a larger evaluation keeps them.
    from trainfast.data.loader import eval_workers

    assert eval_workers(32, 32, 2) == 0 and eval_workers(159, 128, 2) == 0 and eval_workers(64, 32, 2) == 0
    assert eval_workers(65, 32, 2) == 2 and eval_workers(10_000, 64, 4) == 4 and eval_workers(8, 4, 0) == 0
    recipe = Recipe(batch_size=4, num_workers=2, persistent_workers=True, prefetch=True)
    small, large = Draws(), torch.utils.data.ConcatDataset([Draws()] * 3)
    assert build_loader(small, recipe, CPU, False, split=None).loader.num_workers == 0          # 4 samples: 1 batch
    assert build_loader(large, recipe, CPU, False, split=None).loader.num_workers == 2
    assert build_loader(small, recipe, CPU, True, split=None).loader.num_workers == 2     # training: as asked


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_streams_differ_per_rank_worker_epoch_and_repeat_across_runs(persistent):
    runs = []
    for _ in range(2):
        draws = {}
        for rank in (0, 1):
            draws.update(collect_worker_draws(seed=7, rank=rank, persistent=persistent))
        runs.append(draws)
    assert runs[0] == runs[1]                                   # repeatable with the same seed
    assert len(runs[0]) == 8                                    # 2 ranks x 2 workers x 2 epochs
    for rng in range(3):                                        # torch, python, numpy: each one differs
        values = [v[rng] for v in runs[0].values()]
        assert len(set(values)) == len(values), f"RNG {rng} repeats across (rank, worker, epoch)"
    other_seed = collect_worker_draws(seed=8, rank=0, persistent=persistent)
    assert all(other_seed[k] != runs[0][k] for k in other_seed)


# ------------------------------------------------------------------------------------------------
# unreadable files


def test_truncated_jpegs_train_to_the_end_with_exact_skipped_count(tmp_path, caplog):
    root = tmp_path / "photos"
    bad_train = make_folder(root / "train", per_class=12, bad=3)      # 24 images, 3 truncated
    bad_val = make_folder(root / "val", per_class=4, bad=1)           # 8 images, 1 truncated
    split = load_imagefolder(str(root), image_size=16)
    # 24 train images, batch 8: drop_last drops nothing, so every bad file is read every epoch.
    recipe = Recipe(epochs=2, batch_size=8, num_workers=2, prefetch=True, max_bad_fraction=0.2)
    with caplog.at_level(logging.WARNING, logger="trainfast.data"):
        result = train(tiny_model, split, recipe=recipe, device="cpu")
    assert [r["skipped_files"] for r in result.history] == [3, 3]       # summed over both workers
    assert [r["val_skipped_files"] for r in result.history] == [1, 1]
    assert result.state.step == 2 * 3                                   # no batch lost: 3 per epoch
    logged = caplog.text
    for path in bad_train + bad_val:
        assert str(path) in logged


def test_the_plain_path_skips_too(tmp_path):
    bad = make_folder(tmp_path / "p", per_class=4, bad=2)
    split = load_imagefolder(str(tmp_path / "p"), image_size=16)
    recipe = Recipe(batch_size=4, prefetch=False, max_bad_fraction=0.5)
    batches = build_batches(split.train, split, recipe, CPU, train=False)
    val = build_batches(split.val, split, recipe, CPU, train=False)
    seen = sum(len(y) for _, y in batches) + sum(len(y) for _, y in val)
    assert seen == 8 - len(bad)
    assert batches.loader.tally.last_pass_skipped + val.loader.tally.last_pass_skipped == len(bad)


def test_default_threshold_aborts_with_the_last_files_named(tmp_path):
    root = tmp_path / "photos"
    bad = make_folder(root / "train", per_class=12, bad=3)
    make_folder(root / "val", per_class=2)
    split = load_imagefolder(str(root), image_size=16)
    with pytest.raises(BadFileError, match="above max_bad_fraction=0.01") as info:
        train(tiny_model, split, recipe=Recipe(batch_size=8, prefetch=True), device="cpu")
    assert any(str(p) in str(info.value) for p in bad)


def test_consecutive_bad_files_abort_before_the_fraction_is_meaningful(tmp_path):
    root = tmp_path / "photos"
    make_folder(root, per_class=8, bad=16)                              # every file unreadable
    split = load_imagefolder(str(root), image_size=16)
    batches = build_batches(split.train, split, Recipe(batch_size=4, prefetch=True, max_bad_fraction=0.9),
                            CPU, train=True)
    with pytest.raises(BadFileError, match="10 unreadable images in a row"):
        list(batches)


def test_tally_counts_positions_and_checks_fraction_after_min_samples():
    bad = Skipped("x.jpg", "truncated")
    tally = BadFileTally(max_fraction=0.03)
    tally.record(Batch(None, None, 4, ((0, bad), (3, bad))))          # 50%, but only 4 samples seen
    assert (tally.seen, tally.skipped, tally.consecutive) == (4, 2, 1)
    tally.record(Batch(None, None, 96, ((0, bad),)))                   # position 0 follows position 3
    assert tally.consecutive == 0 and tally.skipped == 3               # 3 of 100: at the limit, not above
    with pytest.raises(BadFileError, match="4 of 104"):
        tally.record(Batch(None, None, 4, ((2, bad),)))


def test_collate_drops_skipped_samples_and_batch_survives_pickling_and_pinning():
    good = (torch.zeros(3, 2, 2, dtype=torch.uint8), 1)
    batch = collate_skipping([good, Skipped("a.jpg", "bad"), good])
    inputs, targets = batch
    assert inputs.shape == (2, 3, 2, 2) and targets.tolist() == [1, 1]
    assert batch.size == 3 and batch.skipped == ((1, Skipped("a.jpg", "bad")),)
    again = pickle.loads(pickle.dumps(batch))                           # the worker -> main process queue
    assert isinstance(again, Batch) and again.skipped == batch.skipped and torch.equal(again[0], inputs)
    empty = collate_skipping([Skipped("a.jpg", "bad")])
    guarded = GuardedLoader([empty, batch], BadFileTally(max_fraction=0.9))
    assert [len(y) for _, y in guarded] == [2]                          # the all-bad batch is dropped
    assert guarded.tally.last_pass_skipped == 2


def test_reduce_count_sums_over_ranks_when_distributed(tmp_path):
    import torch.distributed as dist

    assert reduce_count(3) == 3
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        assert reduce_count(5) == 5
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------
# folder errors, before training starts


def test_folder_errors_are_clear(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        scan_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no class subfolders"):
        scan_folder(tmp_path / "empty")
    flat = tmp_path / "flat"
    write_jpegs(flat, 2)
    with pytest.raises(DataError, match="no class subfolders"):
        scan_folder(flat)
    mixed = tmp_path / "mixed"
    write_jpegs(mixed / "cat", 2)
    (mixed / "cat" / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match=r"non-image file.*notes\.txt"):
        load_imagefolder(str(mixed))
    hollow = tmp_path / "hollow"
    write_jpegs(hollow / "cat", 2)
    (hollow / "dog").mkdir()
    with pytest.raises(DataError, match="without images: dog"):
        scan_folder(hollow)
    (tmp_path / "none" / "cat").mkdir(parents=True)
    with pytest.raises(DataError, match="contain no images"):
        scan_folder(tmp_path / "none")
    single = tmp_path / "single"
    write_jpegs(single / "cat", 2)
    with pytest.raises(DataError, match=r"one class folder \(cat/\): a classifier needs two or more"):
        load_imagefolder(str(single))
    halves = tmp_path / "halves"
    for c in ("cat", "dog"):
        write_jpegs(halves / "train" / c, 2)
    with pytest.raises(DataError, match="has train/ but no val/: give both"):
        load_imagefolder(str(halves))               # read as one class named "train", it trained to val acc 1.0
    write_jpegs(halves / "val" / "cat", 2)
    write_jpegs(halves / "val" / "fish", 2)
    with pytest.raises(DataError, match=r"different class folders \(only in train/: dog; only in val/: fish\)"):
        load_imagefolder(str(halves))


def test_every_format_and_mode_a_torchvision_folder_holds_decodes_to_rgb(tmp_path):
    """The extensions torchvision's ImageFolder reads (and GIF), in the modes photo folders hold: grey, CMYK,
    palette, alpha, 16-bit; each becomes uint8 [3, size, size], none skipped."""
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 70, 3), dtype=np.uint8))
    files = {"grey.jpg": rgb.convert("L"), "cmyk.JPG": rgb.convert("CMYK"), "alpha.png": rgb.convert("RGBA"),
             "deep.png": Image.fromarray(np.arange(3500, dtype=np.uint16).reshape(50, 70) * 18),
             "palette.gif": rgb.convert("P"), "photo.webp": rgb, "scan.tif": rgb, "scan.tiff": rgb.convert("L"),
             "frame.ppm": rgb, "frame.pgm": rgb.convert("L"), "old.bmp": rgb}
    (tmp_path / "cat").mkdir()
    for name, image in files.items():
        image.save(tmp_path / "cat" / name)
    write_jpegs(tmp_path / "dog", 2)
    split = load_imagefolder(str(tmp_path), image_size=24)
    images = [split.val[i] for i in range(len(split.val))] + [split.train[i] for i in range(len(split.train))]
    assert len(images) == len(files) + 2
    for image, _ in images:
        assert not isinstance(image, Skipped), image
        assert image.dtype == torch.uint8 and image.shape == (3, 24, 24)


def test_hidden_files_are_ignored(tmp_path):
    write_jpegs(tmp_path / "cat", 2)
    (tmp_path / "cat" / ".DS_Store").write_bytes(b"\0\1")
    samples, classes = scan_folder(tmp_path)
    assert classes == ["cat"] and len(samples) == 2


# ------------------------------------------------------------------------------------------------
# num_workers="auto"


def test_num_workers_accepts_auto_and_refuses_other_words():
    assert Recipe(num_workers="auto").num_workers == "auto"
    with pytest.raises(RecipeError, match="num_workers='many'"):
        Recipe(num_workers="many")
    with pytest.raises(RecipeError, match="num_workers=-1"):
        Recipe(num_workers=-1)
    with pytest.raises(RecipeError, match="max_bad_fraction"):
        Recipe(max_bad_fraction=1.5)


def test_cli_flag_takes_a_number_or_auto():
    from trainfast.cli import build_parser, recipe_from_args

    parser = build_parser()
    assert recipe_from_args(parser.parse_args(["train", "--num-workers", "auto"])).num_workers == "auto"
    assert recipe_from_args(parser.parse_args(["train", "--num-workers", "2"])).num_workers == 2
    with pytest.raises(SystemExit):                   # argparse: invalid int value: 'lots'
        parser.parse_args(["train", "--num-workers", "lots"])


def test_auto_measures_candidates_and_leaves_the_rngs_untouched():
    split = load_synthetic(image_size=8, n=256)
    recipe = Recipe(batch_size=16, num_workers="auto", persistent_workers=True, prefetch=True)
    seed_everything(3)
    chosen = choose_num_workers(split.train, recipe, CPU, candidates=[0, 1])
    after = (torch.rand(1).item(), random.random(), float(np.random.rand()))
    seed_everything(3)
    assert after == (torch.rand(1).item(), random.random(), float(np.random.rand()))
    assert chosen in (0, 1)
    resolved = resolve_num_workers(Recipe(num_workers=3), split, CPU)
    assert resolved.num_workers == 3                                   # a number is left alone


# ------------------------------------------------------------------------------------------------
# report and bench-data


def test_report_shows_data_wait_for_every_rung():
    from trainfast.report import data_wait_line
    from trainfast.results import Rung, RungResult

    rungs = [Rung("baseline", {}, Recipe(), status="done", result=RungResult(data_wait_fraction=0.45)),
             Rung("prefetch", {"prefetch": True}, Recipe(prefetch=True), status="done",
                  result=RungResult(data_wait_fraction=0.05)),
             Rung("compile", {"compile": True}, Recipe(compile=True), status="no-effect")]
    line = data_wait_line(rungs)
    assert "baseline (fp32) 45% (input-bound)" in line and "+prefetch 5%" in line
    assert "compile" not in line


def test_report_says_when_a_rung_ran_above_the_ceiling():
    from trainfast.report import above_ceiling_note
    from trainfast.results import Rung, RungResult

    rungs = [Rung("baseline", {}, Recipe(), status="done", result=RungResult(ceiling_fraction=0.8)),
             Rung("channels_last", {"channels_last": True}, Recipe(channels_last=True), status="done",
                  result=RungResult(ceiling_fraction=1.3))]
    assert above_ceiling_note(rungs[:1]) is None
    note = above_ceiling_note(rungs)
    assert note.startswith("+channels_last ran above 100% of the measured matmul peak") and "baseline" not in note


def test_bench_data_runs_both_pipelines_and_refuses_other_data(tmp_path):
    from trainfast.bench_data import bench_data
    from trainfast.cli import main

    make_folder(tmp_path / "photos", per_class=8)
    lines = []
    results = bench_data(f"imagefolder:{tmp_path / 'photos'}", batch_size=4, num_workers=0, image_size=16,
                         passes=1, device="cpu", print_fn=lines.append)
    assert all(r.median > 0 and len(r.rates) == 1 for r in results.values())
    from trainfast.data.imagefolder import default_decoder

    # with TorchCodec the default decoder, the same pipeline decoding with torchvision.io is a row of its own
    assert len(results) == (5 if default_decoder() == "torchcodec" else 4)
    assert any(name.startswith("trainfast + decode_cache") for name in results)
    assert default_decoder() != "torchcodec" or any("torchvision decoding whole files" in name for name in results)
    assert sum("ratio" in line for line in lines) == 2      # the JPEG path and the cache, each vs torchvision
    assert main(["bench-data", "--data", "digits"]) == 2


# ------------------------------------------------------------------------------------------------
# recycled CPU buffers for on-device normalization


def test_host_buffers_are_reused_only_when_nothing_holds_them():
    from trainfast.techniques.prefetch import HostBuffers

    pool = HostBuffers(CPU)
    first = pool.take((2, 3))
    second = pool.take((2, 3))
    assert second is not first                       # `first` is still held by a name
    del first
    again = pool.take((2, 3))
    assert again is pool.buffers[0]                  # released: recycled
    view = again[0]
    del again
    assert pool.take((2, 3)) is not pool.buffers[0]  # a view keeps it alive
    del view
    weight = torch.randn(3, 2, requires_grad=True)
    saved = pool.take((2, 3)).fill_(1.0)
    loss = (saved @ weight).sum()                    # autograd saves `saved` for backward
    del saved
    assert pool.take((2, 3)) is not pool.buffers[0]
    loss.backward()
    assert pool.take((2, 3)) is pool.buffers[0]
    assert HostBuffers(torch.device("cuda")).take((2, 3)) is None   # CUDA: the caching allocator's job
    fresh = HostBuffers(CPU)
    with torch.inference_mode():                     # first used by evaluate() ...
        fresh.take((4,)).fill_(1.0)
    fresh.take((4,)).copy_(torch.arange(4))          # ... then by training: must not be an inference tensor


@pytest.mark.cuda
def test_cuda_prefetcher_side_stream_gives_the_cpu_batches(tmp_path):
    make_folder(tmp_path / "photos", per_class=8)
    split = load_imagefolder(str(tmp_path / "photos"), image_size=24)
    recipe = Recipe(batch_size=4, prefetch=True)

    def batches(device):
        seed_everything(0)
        built = build_batches(split.train, split, recipe, device, train=True)
        return built, [(x.cpu(), y.cpu()) for x, y in built]

    cuda_batches, on_cuda = batches(torch.device("cuda"))
    assert cuda_batches.loader.pin_memory                    # prefetch pins: the side-stream copy is async
    _, on_cpu = batches(CPU)
    for (gx, gy), (cx, cy) in zip(on_cuda, on_cpu):
        assert torch.equal(gy, cy)
        torch.testing.assert_close(gx, cx, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_ablation_prefetch_rung_reads_the_folder_and_reports_waiting_and_skips(tmp_path):
    import json

    from trainfast.ablation import TimingBudget, ablate

    root = tmp_path / "photos"
    make_folder(root / "train", per_class=16, bad=2)
    truncate(root / "train" / "c0" / "img000.jpg")   # the very first file too: the FLOP probe must skip it
    make_folder(root / "val", per_class=4)
    result = ablate("resnet9", data=f"imagefolder:{root}", image_size=16, rungs=["prefetch"],
                    recipe=Recipe(batch_size=8, num_workers=1, max_bad_fraction=0.2, log_every=2),
                    device="cpu", out=tmp_path / "report", show=False, repeats=1, noise_seeds=1,
                    # what is read is the folder and the waiting, not the rate: one pass, a few timed steps
                    settle_within_s=0, budget=TimingBudget(steps=4, seconds=1.0, floor=2, min_seconds=0.0))
    assert [r.status for r in result.rungs] == ["done", "done"], [r.result.error for r in result.rungs]
    data = json.loads((tmp_path / "report" / "results.json").read_text())
    for rung in data["rungs"]:
        assert rung["skipped_files"] == 3 and rung["num_workers"] == 1
        assert 0 <= rung["data_wait_fraction"] < 1
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Time waiting for data" in report and "+prefetch" in report
    assert "3 unreadable image(s) skipped" in report


def test_pinned_memory_only_on_cuda_and_always_with_the_prefetcher():
    from trainfast.techniques.transfer import pin_memory_for

    cuda = torch.device("cuda")                       # a device object: no GPU needed to build it
    assert not pin_memory_for(Recipe(pin_memory=True, prefetch=True), CPU)
    assert pin_memory_for(Recipe(prefetch=True), cuda)          # side-stream copies need pinned memory
    assert pin_memory_for(Recipe(pin_memory=True), cuda)
    assert not pin_memory_for(Recipe(), cuda)


def test_an_empty_or_garbage_file_is_skipped_with_a_reason_a_person_can_read(tmp_path):
    for c in ("cat", "dog"):
        write_jpegs(tmp_path / c, 3)
    (tmp_path / "cat" / "empty.jpg").write_bytes(b"")
    (tmp_path / "dog" / "garbage.bmp").write_bytes(b"this is not an image" * 10)     # a format Pillow decodes
    split = load_imagefolder(str(tmp_path), image_size=16)
    files = ImageFiles(split.train.samples + split.val.samples, 16)
    reasons = {item.path.rsplit("/", 1)[-1]: item.reason for item in (files[i] for i in range(len(files)))
               if isinstance(item, Skipped)}
    assert reasons["empty.jpg"] == "OSError: empty file (0 bytes)"
    assert "not an image Pillow can read" in reasons["garbage.bmp"] and "BytesIO" not in reasons["garbage.bmp"]
