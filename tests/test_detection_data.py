"""The built-in detection dataset, collate, and aspect-ratio grouping."""
from collections import Counter

import pytest
import torch

from trainfast.data.badfiles import Batch
from trainfast.data.datasets import DataError, Skipped
from trainfast.detection import GroupedBatchSampler, aspect_ratio_groups, collate_detection, load_detection_data
from trainfast.detection.batching import images_to_device, padding_fraction, random_batches, resized_size
from trainfast.detection.synthetic import SHAPES, SIZES, SyntheticDetection


@pytest.fixture(scope="module")
def shapes():
    return SyntheticDetection(24, "shapes", seed=3)


def test_same_seed_same_images_and_boxes(shapes):
    again = SyntheticDetection(24, "shapes", seed=3)
    for i in (0, 7, 23):
        (a, ta), (b, tb) = shapes[i], again[i]
        assert torch.equal(a, b)
        assert torch.equal(ta["boxes"], tb["boxes"]) and torch.equal(ta["labels"], tb["labels"])
    # order-independent: asking in reverse gives the same item
    assert torch.equal(again[5][0], SyntheticDetection(24, "shapes", seed=3)[5][0])
    other = SyntheticDetection(24, "shapes", seed=4)
    assert not torch.equal(shapes[0][0], other[0][0]) or not torch.equal(shapes[0][1]["boxes"], other[0][1]["boxes"])


def test_boxes_inside_their_image_with_positive_size_and_valid_labels(shapes):
    for dataset in (shapes, SyntheticDetection(12, "digits", seed=1)):
        for i in range(len(dataset)):
            image, target = dataset[i]
            assert image.dtype == torch.uint8 and image.shape[0] == 3
            h, w = image.shape[-2:]
            assert (h, w) == dataset.sizes[i]
            boxes, labels = target["boxes"], target["labels"]
            assert boxes.dtype == torch.float32 and boxes.shape == (len(labels), 4)
            assert labels.dtype == torch.int64 and target["image_id"] == i
            assert 2 <= len(labels) <= 5
            assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
            assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= w).all() and (boxes[:, 3] <= h).all()
            assert labels.min() >= 1 and labels.max() <= len(dataset.categories)


def test_objects_are_where_their_boxes_say(shapes):
    # A pasted shape is one flat colour over its mask, and every shape covers its box's centre: the centre
    # of each box that no later object overlaps is flat (a photo's 5x5 patch almost never is).
    flat = 0
    for i in range(6):
        image, target = shapes[i]
        for x1, y1, x2, y2 in target["boxes"].long().tolist():
            cy, cx = (y1 + y2) // 2, (x1 + x2) // 2
            core = image[:, cy - 2:cy + 3, cx - 2:cx + 3].float()
            flat += int(core.std(dim=(1, 2)).max() < 1.0)
    total = sum(len(shapes[i][1]["labels"]) for i in range(6))
    assert flat >= total - 2, (flat, total)      # at most a couple covered by a later object's 10% overlap


def test_mixed_sizes_and_categories():
    split = load_detection_data("synthetic")
    sizes = Counter(split.train.sizes)
    assert len(sizes) == len(SIZES) and min(sizes.values()) >= 10     # all five aspect ratios, each well used
    assert split.num_classes == len(SHAPES) + 1 and split.categories == SHAPES
    assert load_detection_data("synthetic:digits").num_classes == 11
    assert split.val.sizes != split.train.sizes[:len(split.val)]       # val is its own stream of images


@pytest.mark.parametrize("spec", ["synthetic:cubes", "coco", "voc:/x"])
def test_bad_specs_are_refused(spec):
    with pytest.raises(DataError, match="--data"):
        load_detection_data(spec)


def test_collate_keeps_lists_and_counts_skipped(shapes):
    batch = collate_detection([shapes[0], Skipped("x.jpg", "truncated"), shapes[1]])
    assert isinstance(batch, Batch) and batch.size == 3 and [i for i, _ in batch.skipped] == [1]
    images, targets = batch
    assert [im.shape for im in images] == [shapes[0][0].shape, shapes[1][0].shape]
    assert targets[1]["image_id"] == 1
    floats = images_to_device(images, "cpu")
    assert floats[0].dtype == torch.float32 and 0.0 <= floats[0].min() and floats[0].max() <= 1.0
    assert collate_detection([Skipped("a", "b")])[0] is None


def test_aspect_ratio_groups():
    groups = aspect_ratio_groups([(100, 200), (100, 100), (200, 100), (120, 100), (100, 1000)], group_factor=3)
    assert groups[0] == groups[4]               # 2:1 and beyond share the end bin
    assert len({groups[0], groups[1], groups[2]}) == 3
    assert aspect_ratio_groups([(100, 200), (200, 100)], group_factor=0) == [0, 0]
    with pytest.raises(ValueError):
        aspect_ratio_groups([(0, 10)])


@pytest.mark.parametrize("drop_last", [False, True])
def test_grouped_sampler_visits_each_index_once_and_groups(drop_last):
    sizes = SyntheticDetection(203, seed=0).sizes
    sampler = GroupedBatchSampler(sizes, batch_size=4, seed=1, drop_last=drop_last)
    groups = aspect_ratio_groups(sizes)
    epochs = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        flat = [i for b in batches for i in b]
        assert len(flat) == len(set(flat))
        if drop_last:
            assert all(len(b) == 4 for b in batches) and len(flat) > 203 - 4 * len(set(groups))
        else:
            assert sorted(flat) == list(range(203))
        assert all(len({groups[i] for i in b}) == 1 for b in batches)
        epochs.append(batches)
    assert epochs[0] != epochs[1]                             # a new order each epoch
    sampler.set_epoch(1)
    assert list(sampler) == epochs[1]                         # the same order for the same (seed, epoch)


@pytest.mark.parametrize("ranks", [2, 3])
def test_grouped_sampler_deals_whole_batches_evenly_over_ranks(ranks):
    sizes = SyntheticDetection(50, seed=0).sizes
    groups = aspect_ratio_groups(sizes)
    single = GroupedBatchSampler(sizes, batch_size=4, seed=2)
    single.set_epoch(3)
    per_rank = []
    for rank in range(ranks):
        sampler = GroupedBatchSampler(sizes, batch_size=4, seed=2, num_replicas=ranks, rank=rank)
        sampler.set_epoch(3)
        per_rank.append(list(sampler))
        assert len(per_rank[-1]) == len(sampler)
    assert len({len(batches) for batches in per_rank}) == 1                      # same step count everywhere
    dealt = [b for batches in per_rank for b in batches]
    assert all(len({groups[i] for i in b}) == 1 for b in dealt)
    assert {tuple(b) for b in dealt} == {tuple(b) for b in single}               # the single-rank batches, dealt
    assert len(dealt) - len(single) == (-len(single)) % ranks                     # only the evening-out repeats
    with pytest.raises(ValueError, match="rank must be in"):
        GroupedBatchSampler(sizes, 4, num_replicas=2, rank=2)


def test_grouping_reduces_padding():
    sizes = SyntheticDetection(192, seed=0).sizes
    grouped = list(GroupedBatchSampler(sizes, batch_size=4, seed=0))
    plain = random_batches(len(sizes), 4, seed=0)
    for resize in (None, (320, 480)):
        with_groups = padding_fraction(grouped, sizes, resize)
        without = padding_fraction(plain, sizes, resize)
        assert without > 0.3 and with_groups < 0.1 < without, (resize, with_groups, without)
    # handmade: alike images pad only up to the multiple of 32; a 1:2 next to a 2:1 pads half of each canvas
    assert padding_fraction([[0, 1]], [(224, 224), (224, 224)]) == 0.0
    assert padding_fraction([[0]], [(200, 200)]) == pytest.approx(1 - 200**2 / 224**2)
    assert padding_fraction([[0, 1]], [(160, 320), (320, 160)]) == pytest.approx(0.5)
    assert padding_fraction([], []) == 0.0


def test_resized_size_matches_torchvision_transform():
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    transform = GeneralizedRCNNTransform(320, 480, [0.0] * 3, [1.0] * 3)
    transform.eval()
    for h, w in SIZES + ((427, 640), (100, 1000)):
        out = transform([torch.zeros(3, h, w)])[0]
        assert out.image_sizes[0] == resized_size(h, w, 320, 480), (h, w)
