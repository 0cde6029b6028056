"""The detection task in the built-in run: `trainfast train` and `trainfast ablate` on a detector,
loss dicts logged term by term and checked across 2 gloo ranks, a non-finite term stopping every rank, and
aspect-ratio grouping through the real loader. Tiny settings: SSDlite (a quarter of Faster R-CNN's step) on a
COCO folder of 10 images written here, one epoch."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import save_png, torchrun_env

from trainfast import Recipe, ablate
from trainfast.checkpoint import safe_load
from trainfast.cli import main
from trainfast.detection.batching import aspect_ratio_groups, build_detection_loader
from trainfast.detection.data import DetectionSplit
from trainfast.detection.models import build_detection_model
from trainfast.detection.synthetic import SyntheticDetection
from trainfast.distributed import Dist, free_port
from trainfast.measure import LossTermsError, Meter, NonFiniteLossError
from trainfast.tasks.detection import Detection

ROOT = Path(__file__).resolve().parents[1]
SSD = "ssdlite320_mobilenet_v3_large"
SSD_TERMS = {"bbox_regression", "classification"}


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> Path:
    """A COCO folder of 10 synthetic images (PNG files and an instances json): 8 train, 2 val after the split."""
    root = tmp_path_factory.mktemp("coco")
    source = SyntheticDetection(10, "shapes", seed=5)
    images, annotations = [], []
    for i in range(len(source)):
        image, target = source[i]
        save_png(image, str(root / f"{i:03d}.png"))
        images.append({"id": i + 1, "file_name": f"{i:03d}.png", "height": image.shape[1], "width": image.shape[2]})
        for (x1, y1, x2, y2), label in zip(target["boxes"].tolist(), target["labels"].tolist()):
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": label,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "iscrowd": 0})
    categories = [{"id": k + 1, "name": name} for k, name in enumerate(source.categories)]
    (root / "instances_default.json").write_text(json.dumps(
        {"images": images, "annotations": annotations, "categories": categories}))
    return root


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """tests/det_worker.py as 2 gloo ranks, started first: its scenarios run while the other tests of this file do.
    Each rank is started here with the variables torchrun gives it (what trainfast.distributed reads): torchrun's
    own process would add a third import of torch to the launch and nothing the scenarios check."""
    out, port = tmp_path_factory.mktemp("ranks"), free_port()
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "det_worker.py"), str(out), "ok,keys,nan"],
                              env={**torchrun_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                                   "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                              cwd=ROOT, stdout=(out / f"rank{rank}.log").open("w"), stderr=subprocess.STDOUT)
             for rank in range(2)]
    yield out, procs
    for proc in procs:
        proc.kill()


def rank_reports(launch, scenario: str) -> list[dict]:
    out, procs = launch
    for rank, proc in enumerate(procs):
        try:
            proc.wait(timeout=300)               # a hang would end here, as a failure, not a stuck CI
        except subprocess.TimeoutExpired:
            for each in procs:
                each.kill()
            raise
        assert proc.returncode == 0, (out / f"rank{rank}.log").read_text()[-3000:]
    return [json.loads((out / scenario / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_train_cli_detection_end_to_end(coco, tmp_path, two_ranks, capsys):
    out = tmp_path / "run"
    # No --task: a detection model's name makes it a detection run; no --lr: detection's own defaults.
    # In this process (the CLI's main), which saves a second import of torch and torchvision.
    code = main(["train", "--model", SSD, "--data", f"coco:{coco}", "--epochs", "1", "--log-every", "1",
                 "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    record = json.loads((out / "metrics.jsonl").read_text())
    assert 0.0 <= record["val_map"] <= 1.0 and 0.0 <= record["val_map_50"] <= 1.0 and record["val_images"] == 2
    assert set(record["train_loss_terms"]) == SSD_TERMS                   # every term of the loss dict, logged
    assert math.isclose(sum(record["train_loss_terms"].values()), record["train_loss"], rel_tol=1e-5)
    assert record["step"] == 2 and "val_accuracy" not in record           # 8 images, batch 4, last batch kept
    recipe = json.loads((out / "recipe.json").read_text())
    assert (recipe["batch_size"], recipe["lr"], recipe["epochs"]) == (4, 1e-3, 1)
    assert "mAP@0.5" in printed.out and "bbox_regression" in printed.out
    build_detection_model(SSD, 4).load_state_dict(safe_load(out / "model.pt"))     # the trained weights, loadable


@pytest.mark.parametrize("argv, needle", [
    (["--task", "detection", "--precision", "bf16", "--precision-level", "master"], "precision_level='master'"),
    (["--task", "detection", "--model", "resnet9"], "not a supported detection model"),
    (["--task", "detection", "--image-size", "64"], "--image-size 64"),
    (["--task", "detection", "--prefetch"], "prefetch=True"),
    (["--group-aspect-ratio"], "padded per batch by the model (--task detection)"),
])
def test_bad_detection_flags_are_refused_before_any_work(argv, needle, capsys):
    assert main(["train", *argv]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.slow
def test_ablate_detection_writes_map_per_rung(coco, tmp_path, two_ranks):
    from trainfast.ablation.rung import TimingBudget

    result = ablate(SSD, data=f"coco:{coco}", task="detection", recipe=Recipe(epochs=1, batch_size=4),
                    rungs=["amp", "set_to_none", "group_aspect_ratio"], amp_dtype="bf16", repeats=1, noise_seeds=1,
                    out=tmp_path / "report",
                    budget=TimingBudget(steps=1, seconds=1.0, floor=1, min_seconds=0.0), show=False,
                    settle_within_s=0)    # exactly one pass: a noisy machine adds none (timing-steps 1 never settles)
    data = json.loads((tmp_path / "report" / "results.json").read_text())
    assert data["settings"]["task"] == "detection" and data["settings"]["metric_name"] == "mAP"
    rungs = {r["name"]: r for r in data["rungs"]}
    assert list(rungs) == ["baseline", "amp", "set_to_none", "group_aspect_ratio"]
    # the built-in loop's zero_grad() already frees the gradients (PyTorch's default): set_to_none changes nothing
    assert rungs["set_to_none"]["effect"] == "not-applicable" and "zero_grad() already frees" in \
        rungs["set_to_none"]["effect_reason"] and rungs["set_to_none"]["verdict"] == "not applicable"
    for name in ("baseline", "amp"):                                     # the judged metric is mAP
        runs = rungs[name]["runs"]
        run = runs[0]
        assert len(runs) == 1 and rungs[name]["metric"]["value"] == run["map"]
        assert 0.0 <= run["map"] <= 1.0 and "map_50" in run
        assert set(run["train_loss_terms"]) == SSD_TERMS and rungs[name]["throughput"] > 0
    # SSDlite resizes every image to 320x320: grouping has nothing to act on, and the report says why.
    grouped = rungs["group_aspect_ratio"]
    assert grouped["effect"] == "not-applicable" and "320x320" in grouped["effect_reason"]
    report = (tmp_path / "report" / "report.md").read_text()
    assert "mAP" in report and "not applicable: the model resizes every image" in report
    assert "mAP noise band" in report and "a proxy, as mAP is not a share of images" in report
    assert result.best_name in ("baseline", "amp")


def test_detection_ladder_refuses_what_cannot_work_on_a_detector():
    from trainfast.ablation.ladders import plan_rungs
    from trainfast.recipe import RecipeError
    from trainfast.results import EffectLabel, Status

    names = [r.name for r in plan_rungs(Recipe(), task="detection", device=torch.device("cpu"))]
    assert names == ["baseline", "amp", "set_to_none", "group_aspect_ratio", "workers", "channels_last", "compile"]
    with pytest.raises(RecipeError, match="casts the whole detector"):
        plan_rungs(Recipe(), ["master-bf16"], task="detection", device=torch.device("cpu"))
    # prefetch acts on batches of one shape, which a detector's lists of images are not: ruled out, with why
    _, prefetch, fused = plan_rungs(Recipe(), ["prefetch", "fused"], task="detection", device=torch.device("cpu"))
    assert prefetch.status == Status.NO_EFFECT and prefetch.effect == EffectLabel.NOT_APPLICABLE
    assert "lists of images" in prefetch.reason and not fused.recipe.prefetch       # not carried down the ladder


def test_loss_terms_match_across_ranks_and_are_averaged_over_them(two_ranks):
    ranks = rank_reports(two_ranks, "ok")
    records = [r["record"] for r in ranks]
    assert records[0]["train_loss_terms"] == records[1]["train_loss_terms"]          # reduced over the ranks
    assert set(records[0]["train_loss_terms"]) == {"loss_a", "loss_b"}
    assert records[0]["train_losses"] != records[1]["train_losses"]                  # each rank's own steps
    assert records[0]["val_map"] == 0.0 and records[0]["val_detections"] == 0         # it predicts nothing


def test_different_loss_terms_on_two_ranks_are_named_not_hung(two_ranks):
    ranks = rank_reports(two_ranks, "keys")
    for report in ranks:
        assert report["error"] == "LossTermsError", report
        assert "rank 0: loss_a, loss_b;" in report["message"]
        assert "rank 1: loss_a, loss_b, loss_extra" in report["message"]


def test_a_nonfinite_term_stops_both_ranks_at_one_step_naming_the_terms(two_ranks):
    ranks = rank_reports(two_ranks, "nan")
    for report in ranks:
        assert report["error"] == "NonFiniteLossError", report
        assert "at step 2" in report["message"] and "loss_a=" in report["message"]
    assert "loss_b=nan" in ranks[1]["message"]


def test_meter_logs_each_term_and_refuses_a_changed_dict():
    meter = Meter(torch.device("cpu"), log_every=2, score=Detection().score)
    for a, b in ((1.0, 2.0), (3.0, 4.0), (5.0, 6.0)):
        meter.update({"a": torch.tensor(a), "b": torch.tensor(b)}, None, [{}, {}])
    meter.flush()
    assert meter.stats.losses == [3.0, 7.0, 11.0] and meter.stats.loss_terms == {"a": 3.0, "b": 4.0}
    assert meter.stats.windows[0].loss_terms == {"a": 2.0, "b": 3.0} and meter.stats.samples == 6
    with pytest.raises(LossTermsError, match=r"changed at step 3: terms \['a'\], earlier steps \['a', 'b'\]"):
        meter.update({"a": torch.tensor(1.0)}, None, [{}])
    stopped = Meter(torch.device("cpu"), log_every=2, score=Detection().score)
    stopped.update({"a": torch.tensor(1.0), "b": torch.tensor(float("inf"))}, None, [{}])
    with pytest.raises(NonFiniteLossError, match="loss is inf at step 0 .*loss terms at that step: a=1, b=inf"):
        stopped.flush()


@pytest.mark.parametrize("grouped", [False, True])
def test_the_real_loader_visits_every_training_image_once_per_epoch(grouped):
    dataset = SyntheticDetection(23, seed=2)
    split = DetectionSplit(dataset, dataset, dataset.categories, "tiny")
    dist = Dist(torch.device("cpu"))
    loader = build_detection_loader(dataset, split, Recipe(batch_size=4, group_aspect_ratio=grouped),
                                    torch.device("cpu"), dist, train=True)
    groups = aspect_ratio_groups(dataset.sizes)
    orders = []
    for epoch in range(2):
        dist.set_epoch(epoch)
        batches = [[t["image_id"] for t in targets] for _, targets in loader]
        assert Counter(i for batch in batches for i in batch) == Counter(range(23))
        assert len(batches) == len(loader)
        if grouped:
            assert all(len({groups[i] for i in batch}) == 1 for batch in batches)
        orders.append(batches)
    assert orders[0] != orders[1]                        # a new order every epoch, grouped or not


def test_grouped_batches_resume_mid_epoch_where_they_stopped():
    # The checkpointer's data-order interface on GroupedBatchSampler: an epoch's batches follow from (seed, epoch),
    # so a resumed run skips the batches it already trained on and continues with the same ones.
    from trainfast.detection import GroupedBatchSampler

    sizes = SyntheticDetection(23, seed=2).sizes
    sampler = GroupedBatchSampler(sizes, 4, seed=0)
    sampler.set_epoch(3)
    full = list(sampler)
    resumed = GroupedBatchSampler(sizes, 4, seed=0)
    resumed.load_state_dict(sampler.state_dict(at_epoch_end=False), skip=2)
    assert len(resumed) == len(full) - 2 and list(resumed) == full[2:]
    assert list(resumed) == full                         # the skip applies to the resumed epoch only
