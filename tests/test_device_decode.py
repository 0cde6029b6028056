"""device_decode: the workers read bytes and draw crops, the device decodes, crops, resizes, flips, normalizes.

Everything but nvJPEG itself is checked on the CPU: the device half runs on `device="cpu"` through the
decoders' CPU paths, so its crops can be compared with the host path's on the same draws. The GPU decoder's
pixels are checked by the test marked `cuda` (make test-cuda)."""
from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import torch
from PIL import Image
from test_data_pipeline import truncate, write_jpegs
from test_exif_orientation import write_photo

from trainfast import Recipe
from trainfast.data.badfiles import BadFileTally
from trainfast.data.datasets import load_synthetic
from trainfast.data.device import build_device_batches
from trainfast.data.device_decode import DeviceDecoder, host_decoded_last_pass
from trainfast.data.encoded import EncodedImage, encode_on_workers, encodes, jpeg_header, strip_exif
from trainfast.data.imagefolder import ImageFiles, exif_orientation, load_imagefolder, read_bytes
from trainfast.data.loader import build_loader
from trainfast.tasks.effects import data_effect

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")
CPU = torch.device("cpu")


def photo_folder(root, count: int = 6, size=(96, 64)) -> None:
    """Two classes of JPEGs, every EXIF orientation among them (1-8), not square: a width/height swap shows."""
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(count):
            write_photo(root / c / f"p{i}.jpg", orientation=1 + (i + 4 * (c == "dog")) % 8, size=size)


def device_samples(dataset, indices, seed: int, device=CPU) -> torch.Tensor:
    """The device path's samples: the encoding dataset's items (drawn after seeding), decoded on `device`."""
    encoded = encode_on_workers(dataset)
    torch.manual_seed(seed)
    items = [encoded[i][0] for i in indices]
    assert all(isinstance(item, EncodedImage) for item in items)
    images, kept = DeviceDecoder(device).decode(_batch(items))
    assert kept == list(range(len(items)))
    return images.cpu()


def host_samples(dataset, indices, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.stack([dataset[i][0] for i in indices])


def _batch(items):
    from trainfast.data.encoded import EncodedBatch

    return EncodedBatch(items)


@pytest.mark.parametrize("train", [True, False])
def test_device_path_on_cpu_gives_the_host_paths_crops_for_the_same_draws(tmp_path, train):
    photo_folder(tmp_path)
    split = load_imagefolder(str(tmp_path), image_size=32)
    dataset = ImageFiles(split.train.samples + split.val.samples, 32, train=train)
    indices = list(range(len(dataset)))
    for seed in (0, 1):
        ours, host = device_samples(dataset, indices, seed), host_samples(dataset, indices, seed)
        assert ours.shape == host.shape == (len(indices), 3, 32, 32) and ours.dtype == torch.uint8
        per_image = (ours.float() - host.float()).abs().mean(dim=(1, 2, 3))
        assert per_image.max().item() <= 2.0, per_image      # levels of 255, per image (not only on average)
    # and the draws do move the crops: another seed gives other training crops
    if train:
        assert not torch.equal(device_samples(dataset, indices, 0), device_samples(dataset, indices, 1))


def test_boxes_come_from_torchvisions_sampler_on_the_upright_size(tmp_path):
    """Same seed, same box and flip as TrainCrop: the box drawn on the upright (w, h), mapped into the stored
    pixels. A stored 96x64 photo with orientation 6 is upright 64x96: a box drawn on the stored size would
    reach past the upright width, and the crops above would differ."""
    from torchvision.transforms import RandomResizedCrop

    from trainfast.data.imagefolder import CROP_RATIO, CROP_SCALE, stored_box

    for orientation in (1, 6):
        path = write_photo(tmp_path / f"o{orientation}.jpg", orientation, size=(96, 64))
        dataset = ImageFiles([(path, 0)], 32, train=True)
        encoded = encode_on_workers(dataset)
        upright = (96, 64) if orientation == 1 else (64, 96)
        boxes, flips = [], 0
        for seed in range(300):
            torch.manual_seed(seed)
            item = encoded[0][0]
            torch.manual_seed(seed)
            top, left, h, w = RandomResizedCrop.get_params(torch.empty(0, upright[1], upright[0]), CROP_SCALE,
                                                           CROP_RATIO)
            expected_flip = torch.rand(1).item() < 0.5
            assert item.box == stored_box((left, top, left + w, top + h), orientation, (96, 64))
            assert item.flip == expected_flip and item.orientation == orientation
            boxes.append(item.box)
            flips += item.flip
        areas = [(right - left) * (b - t) / (96 * 64) for left, t, right, b in boxes]
        assert 0.08 * 0.95 <= min(areas) and max(areas) <= 1.0 and np.mean(areas) > 0.3   # scale (0.08, 1)
        assert 100 < flips < 200                                                          # p = 0.5


def test_header_parsing_reads_size_orientation_and_sends_what_nvjpeg_cannot_take_to_the_host(tmp_path):
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 50, 3), dtype=np.uint8))
    cases = {"rgb.jpg": rgb, "grey.jpg": rgb.convert("L"), "cmyk.jpg": rgb.convert("CMYK"), "flat.png": rgb,
             "photo.webp": rgb}
    for name, image in cases.items():
        image.save(tmp_path / name)
    assert jpeg_header(read_bytes(tmp_path / "rgb.jpg")) == ((50, 30), 1, "")
    assert jpeg_header(read_bytes(tmp_path / "grey.jpg")) == ((50, 30), 1, "")
    assert "CMYK" in jpeg_header(read_bytes(tmp_path / "cmyk.jpg"))[2]
    assert "PNG, not JPEG" == jpeg_header(read_bytes(tmp_path / "flat.png"))[2]
    assert "WEBP, not JPEG" == jpeg_header(read_bytes(tmp_path / "photo.webp"))[2]
    for orientation in range(1, 9):
        path = write_photo(tmp_path / f"o{orientation}.jpg", orientation, size=(80, 40))
        assert jpeg_header(read_bytes(path)) == ((80, 40), orientation, "")    # stored size; the box is upright
        stripped = strip_exif(read_bytes(path))
        with Image.open(io.BytesIO(stripped)) as image:
            assert exif_orientation(image) == 1 and image.size == (80, 40)
            assert np.array_equal(np.array(image), np.array(Image.open(path)))   # same pixels, tag gone


def oddities_folder(root) -> dict[str, str]:
    """Every oddity of the image-folder tests, each with what must become of it under device_decode."""
    rgb = Image.fromarray(np.random.default_rng(1).integers(0, 255, (40, 60, 3), dtype=np.uint8))
    write_jpegs(root / "dog", 4, size=(60, 40))
    (root / "cat").mkdir()
    rgb.convert("L").save(root / "cat" / "grey.jpg")
    rgb.convert("CMYK").save(root / "cat" / "cmyk.jpg")
    rgb.save(root / "cat" / "flat.png")
    rgb.save(root / "cat" / "photo.webp")
    write_photo(root / "cat" / "rotated.jpg", 6, size=(60, 40))
    write_photo(root / "cat" / "mirrored.jpg", 2, size=(60, 40))
    write_jpegs(root / "cat", 1, size=(60, 40), start=50)
    truncate(root / "cat" / "img050.jpg")
    (root / "cat" / "empty.jpg").write_bytes(b"")
    # A JPEG with its header but no scan, yet ending with the end marker: the workers pass it, the decoders
    # refuse it, on the device and on the host: dropped from its batch and counted by the device stage.
    whole = (root / "dog" / "img000.jpg").read_bytes()
    (root / "cat" / "noscan.jpg").write_bytes(whole[:whole.index(b"\xff\xda")] + b"\xff\xd9")
    return {"grey.jpg": "device", "rotated.jpg": "device", "mirrored.jpg": "device", "cmyk.jpg": "host",
            "flat.png": "host", "photo.webp": "host", "img050.jpg": "skipped", "empty.jpg": "skipped",
            "noscan.jpg": "skipped"}


@pytest.mark.parametrize("workers", [0, 2])
def test_every_oddity_is_decoded_or_skipped_and_counted(tmp_path, workers, caplog):
    fate = oddities_folder(tmp_path)
    split = load_imagefolder(str(tmp_path), image_size=24)
    dataset = ImageFiles(split.train.samples + split.val.samples, 24, train=True)
    encoded = encode_on_workers(dataset)
    assert encodes(encoded) and not encodes(dataset)
    recipe = Recipe(batch_size=4, num_workers=workers, max_bad_fraction=0.5)
    loader = build_loader(encoded, recipe, CPU, train=False, split=split)
    batches = build_device_batches(loader, recipe, CPU, split.mean, split.std)
    with caplog.at_level(logging.INFO, logger="trainfast.data"):
        seen = 0
        for images, targets in batches:
            assert images.dtype == torch.float32 and images.shape[1:] == (3, 24, 24)
            assert images.shape[0] == targets.shape[0]
            assert images.abs().max() < 3                    # normalized on the device, from uint8
            seen += images.shape[0]
    tally: BadFileTally = loader.tally
    skipped = [name for name, what in fate.items() if what == "skipped"]
    host = [name for name, what in fate.items() if what == "host"]
    assert tally.skipped == len(skipped) and seen == len(dataset) - len(skipped)
    assert host_decoded_last_pass(batches) == len(host)
    named = " ".join(batches.decoder.host.named)
    assert all(name in named for name in host) and "CMYK" in named and "PNG, not JPEG" in named
    logged = caplog.text
    assert all(name in logged for name in skipped)          # each unreadable file named, as today
    assert host_decoded_last_pass(batches) == 0             # counted per pass


def test_an_image_the_device_refuses_alone_is_decoded_on_the_host_and_counted(tmp_path, monkeypatch):
    from trainfast.data import device_decode

    write_jpegs(tmp_path, 3, size=(50, 40))
    dataset = encode_on_workers(ImageFiles([(p, 0) for p in sorted(tmp_path.glob("*.jpg"))], 24, train=True))
    items = [dataset[i][0] for i in range(3)]
    real = device_decode.decode_jpegs

    def refuses_the_second(data, device, decoder=None):
        if any(d is items[1].data for d in data):
            raise RuntimeError("nvjpeg refused it")
        return real(data, device, decoder)

    monkeypatch.setattr(device_decode, "decode_jpegs", refuses_the_second)
    decoder = DeviceDecoder(CPU)
    images, kept = decoder.decode(_batch(items))
    assert kept == [0, 1, 2] and images.shape == (3, 3, 24, 24)
    assert decoder.host.total == 1 and "refused" in decoder.host.named[0]


def test_the_switch_reads_no_effect_on_a_cpu_and_not_applicable_on_in_memory_data(tmp_path):
    write_jpegs(tmp_path / "a", 2)
    write_jpegs(tmp_path / "b", 2)
    folder, memory = load_imagefolder(str(tmp_path), 16), load_synthetic(8, n=16)
    cpu_effect = data_effect("device_decode", CPU, None, folder)
    assert not cpu_effect.acts and cpu_effect.label == "no-effect" and "CUDA" in cpu_effect.reason
    cuda = torch.device("cuda")                          # a device object: no GPU needed to judge it
    assert data_effect("device_decode", cuda, None, folder).acts
    assert data_effect("device_decode", cuda, None, memory).label == "not-applicable"


def test_on_a_cpu_the_run_decodes_in_the_workers_as_without_the_switch(tmp_path):
    """The switch changes nothing on a CPU: the loaders' datasets are the host path's."""
    from trainfast.data.pipeline import build_batches

    write_jpegs(tmp_path / "a", 4)
    write_jpegs(tmp_path / "b", 4)
    split = load_imagefolder(str(tmp_path), 16)
    batches = build_batches(split.train, split, Recipe(batch_size=2, device_decode=True), CPU, train=True)
    assert batches.decoder is None and not encodes(batches.loader.dataset.base)
    images, _ = next(iter(batches))
    assert images.dtype == torch.float32


def test_train_records_the_host_decoded_files_when_the_device_decodes(tmp_path, monkeypatch):
    """The epoch record counts the files the device decoder could not take (the switch forced on for the CPU)."""
    from conftest import tiny_conv

    import trainfast.data.pipeline as pipeline
    from trainfast import train

    write_jpegs(tmp_path / "train" / "a", 4)        # 8 training images, batches of 4: every one is read
    write_jpegs(tmp_path / "train" / "b", 3)
    Image.fromarray(np.zeros((30, 40, 3), np.uint8)).save(tmp_path / "train" / "b" / "flat.png")
    for c in ("a", "b"):
        write_jpegs(tmp_path / "val" / c, 2)
    monkeypatch.setattr(pipeline, "decode_on_device", lambda recipe, device: recipe.device_decode)
    result = train(tiny_conv, load_imagefolder(str(tmp_path), 16), recipe=Recipe(batch_size=4, device_decode=True),
                   device="cpu")
    record = result.history[-1]
    assert record["host_decoded_files"] == 1 and record["skipped_files"] == 0


@pytest.mark.cuda
@pytest.mark.parametrize("train", [True, False])
def test_nvjpeg_crops_are_within_two_levels_of_the_host_paths(tmp_path, train):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    photo_folder(tmp_path, count=12, size=(320, 256))
    split = load_imagefolder(str(tmp_path), image_size=64)
    dataset = ImageFiles(split.train.samples + split.val.samples, 64, train=train)
    indices = list(range(len(dataset)))
    ours = device_samples(dataset, indices, 0, device=torch.device("cuda"))
    host = host_samples(dataset, indices, 0)
    assert (ours.float() - host.float()).abs().mean().item() <= 2.0


def test_the_tune_leaves_it_to_the_input_stage_and_the_default_ladder_leaves_it_out():
    from trainfast.ablation import plan_rungs
    from trainfast.tune import single_names
    from trainfast.tune.inputs import input_rungs

    assert "device_decode" not in single_names("bf16", image_folder=True)     # stage 1's fp32 step is not held by input
    held = input_rungs(Recipe(precision="bf16", num_workers=4), ["device_decode", "decode_cache", "workers"], 16)
    assert [r.name for r in held] == ["recommended", "device_decode", "decode_cache", "workers-8", "workers-16"]
    assert held[1].recipe == Recipe(precision="bf16", num_workers=4, device_decode=True)
    assert "device_decode" not in [r.name for r in plan_rungs(Recipe(), None, "cumulative", "bf16", CPU)]
    rung = plan_rungs(Recipe(), ["device_decode"], "each", "bf16", CPU)[-1]
    assert rung.name == "device_decode" and rung.recipe.device_decode


def test_detection_refuses_it_with_the_reason():
    from trainfast.recipe import RecipeError
    from trainfast.tasks import build_task

    with pytest.raises(RecipeError, match="device_decode=True: device_decode acts on image-folder files"):
        build_task("detection").validate(Recipe(device_decode=True))


def test_the_rungs_notes_count_and_name_the_host_decoded_files():
    from trainfast.report.notes import caveats, input_switches
    from trainfast.results import Rung, RungResult

    named = ["cat/flat.png (PNG, not JPEG)", "cat/cmyk.jpg (CMYK JPEG (the device decoder takes RGB and grayscale))"]
    rung = Rung("device_decode", {"device_decode": True}, Recipe(device_decode=True), status="done",
                result=RungResult(host_decoded_files=2, host_decoded_named=named))
    note = next(n for n in caveats(rung) if "decoded on the host" in n)
    assert note.startswith("2 image(s) decoded on the host") and "cat/flat.png (PNG, not JPEG)" in note
    assert not any("decoded on the host" in n for n in caveats(Rung("baseline", {}, Recipe(), status="done",
                                                                    result=RungResult())))
    on_gpu = {"device": "cuda:0", "data": "imagefolder:/photos"}
    assert "decoding on the device (--device-decode)" in input_switches(Recipe(), on_gpu)
    assert "decoding on the device (--device-decode)" not in input_switches(Recipe(device_decode=True), on_gpu)
    assert not any("device-decode" in s for s in input_switches(Recipe(), {"device": "cpu", "data": "imagefolder:/p"}))
