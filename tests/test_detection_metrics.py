"""COCO mAP on handmade cases, the warm-up schedule, and evaluation under inference_mode."""
import pytest
import torch

from trainfast.detection import compute_map, evaluate_detection, warmup_iters, warmup_scheduler
from trainfast.detection.metrics import MapMeter, empty_prediction

TRUTH = [
    {"boxes": torch.tensor([[10.0, 10, 50, 60], [70, 20, 120, 90]]), "labels": torch.tensor([1, 2])},
    {"boxes": torch.tensor([[5.0, 5, 45, 45]]), "labels": torch.tensor([1])},
]


def perfect(truth):
    return [{"boxes": t["boxes"].clone(), "scores": torch.full((len(t["labels"]),), 0.9), "labels": t["labels"].clone()}
            for t in truth]


def test_perfect_predictions_score_one():
    result = compute_map(perfect(TRUTH), TRUTH)
    assert result["map"] == pytest.approx(1.0) and result["map_50"] == pytest.approx(1.0)
    assert result["ground_truth"] == 3 and result["detections"] == 3 and result["images"] == 2


def test_no_predictions_score_zero_not_minus_one():
    result = compute_map([empty_prediction(), empty_prediction()], TRUTH)
    assert result["map"] == 0.0 and result["map_50"] == 0.0 and result["mar_100"] == 0.0
    assert result["detections"] == 0


def test_no_ground_truth_of_a_size_is_none_and_none_at_all_is_refused():
    result = compute_map(perfect(TRUTH), TRUTH)       # every box is "medium" (32^2 .. 96^2 pixels)
    assert result["map_medium"] == pytest.approx(1.0)
    assert result["map_small"] is None and result["map_large"] is None
    empty = [{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)}]
    with pytest.raises(ValueError, match="mAP is undefined: the 1 evaluated image"):
        compute_map(perfect(empty), empty)


def test_handmade_partial_cases():
    # A box shifted so that IoU is 0.626: a hit at 0.5 .. 0.6, a miss from 0.65 on (0.6 exactly would sit
    # on COCO's threshold, which is 0.6000000000000001 in floating point).
    truth = [{"boxes": torch.tensor([[0.0, 0, 100, 100]]), "labels": torch.tensor([1])}]
    shifted = [{"boxes": torch.tensor([[23.0, 0, 123, 100]]), "scores": torch.tensor([0.8]),
                "labels": torch.tensor([1])}]
    result = compute_map(shifted, truth)              # IoU = 77 / 123
    assert result["map_50"] == pytest.approx(1.0) and result["map_75"] == 0.0
    assert result["map"] == pytest.approx(0.3, abs=0.01)    # hits at 0.50, 0.55, 0.60 of 10 thresholds
    # Right box, wrong class: no hit at all.
    wrong = [{"boxes": truth[0]["boxes"], "scores": torch.tensor([0.8]), "labels": torch.tensor([2])}]
    assert compute_map(wrong, truth)["map"] == 0.0
    # Half of the objects found (one of two images), perfectly: recall 0.5 caps AP at about 0.5.
    half = [perfect(TRUTH)[0], empty_prediction()]
    assert 0.3 < compute_map(half, TRUTH)["map"] < 0.8


def test_meter_accumulates_batches_like_one_call():
    meter = MapMeter()
    meter.update(perfect(TRUTH[:1]), TRUTH[:1])
    meter.update([empty_prediction()], TRUTH[1:])
    assert meter.compute()["map"] == pytest.approx(compute_map([perfect(TRUTH)[0], empty_prediction()], TRUTH)["map"])
    with pytest.raises(ValueError, match="2 predictions for 1 targets"):
        meter.update(perfect(TRUTH), TRUTH[:1])


@pytest.mark.parametrize("iters_per_epoch", [1, 2, 5, 40, 3000])
def test_warmup_matches_linear_lr_step_by_step(iters_per_epoch):
    expected_iters = min(1000, iters_per_epoch - 1)
    assert warmup_iters(iters_per_epoch) == max(0, expected_iters)
    ours = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.02)
    ref = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.02)
    scheduler = warmup_scheduler(ours, iters_per_epoch)
    reference = (torch.optim.lr_scheduler.LinearLR(ref, start_factor=1.0 / 1000, total_iters=expected_iters)
                 if expected_iters >= 1 else None)
    assert ours.param_groups[0]["lr"] == pytest.approx(0.02 / 1000 if reference else 0.02)
    for _ in range(min(iters_per_epoch, 1200) + 3):
        ours.step(), scheduler.step()
        if reference is not None:
            ref.step(), reference.step()
        assert ours.param_groups[0]["lr"] == pytest.approx(ref.param_groups[0]["lr"], rel=1e-12)
    assert ours.param_groups[0]["lr"] == pytest.approx(0.02)


class FixedDetector(torch.nn.Module):
    """Predicts the same box for every image; records the grad mode it ran under."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.modes = []

    def forward(self, images):
        self.modes.append((self.training, torch.is_inference_mode_enabled()))
        assert all(im.dtype == torch.float32 and im.max() <= 1.0 for im in images)
        return [{"boxes": torch.tensor([[10.0, 10, 50, 60]]) * self.weight, "scores": torch.tensor([0.5]),
                 "labels": torch.tensor([1])} for _ in images]


def test_evaluate_runs_in_eval_and_inference_mode_and_restores_the_mode():
    model = FixedDetector()
    images = [torch.full((3, 80, 130), 255, dtype=torch.uint8), torch.zeros(3, 60, 60, dtype=torch.uint8)]
    loader = [(images, TRUTH), (None, None)]          # the second batch: every image unreadable
    result = evaluate_detection(model, loader, "cpu")
    assert model.modes == [(False, True)] and model.training
    assert 0.0 < result["map"] < 1.0 and result["images"] == 2     # 1 of 3 objects found
