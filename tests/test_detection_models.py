"""Detectors by name: random weights (nothing downloaded), trainable BatchNorm, loss dicts and predictions."""
import pytest
import torch
from torch import nn

from trainfast.detection import DETECTION_MODELS, build_detection_model, collate_detection, images_to_device
from trainfast.detection.models import CPU_DEFAULTS
from trainfast.detection.synthetic import SyntheticDetection
from trainfast.models import ModelError


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch):
    """Any attempt to fetch weights fails the test instead of reaching the network."""
    import torch.hub
    from torchvision.models import _api

    def refuse(*args, **kwargs):
        raise AssertionError(f"tried to download weights: {args} {kwargs}")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(_api.WeightsEnum, "get_state_dict", refuse)


@pytest.fixture(scope="module")
def batch():
    dataset = SyntheticDetection(2, seed=0)
    images, targets = collate_detection([dataset[0], dataset[1]])
    return images_to_device(images, "cpu"), targets


@pytest.mark.parametrize("name", ["fasterrcnn_mobilenet_v3_large_320_fpn", "ssdlite320_mobilenet_v3_large"])
def test_builds_from_random_weights_with_trainable_batchnorm(name, batch):
    from torchvision.ops.misc import FrozenBatchNorm2d

    torch.manual_seed(0)
    model = build_detection_model(name, num_classes=4)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and not any(isinstance(m, FrozenBatchNorm2d) for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())
    images, targets = batch

    model.train()
    before = norms[0].running_mean.clone()
    losses = model(images, targets)
    assert isinstance(losses, dict) and len(losses) >= 2
    assert all(v.ndim == 0 and torch.isfinite(v) for v in losses.values())
    assert not torch.equal(before, norms[0].running_mean)          # BatchNorm learns its statistics
    sum(losses.values()).backward()
    assert norms[0].weight.grad is not None and norms[0].weight.grad.abs().sum() > 0

    model.eval()
    with torch.inference_mode():
        predictions = model(images)
    assert len(predictions) == 2
    for prediction, image in zip(predictions, images):
        assert set(prediction) >= {"boxes", "scores", "labels"}
        boxes = prediction["boxes"]
        assert boxes.shape[1] == 4 and len(prediction["scores"]) == len(boxes)
        # predictions come back in the input image's own pixels
        assert (boxes[:, 2] <= image.shape[-1] + 1e-3).all() and (boxes[:, 3] <= image.shape[-2] + 1e-3).all()
        assert ((prediction["labels"] >= 1) & (prediction["labels"] <= 3)).all()


def test_class_count_and_cpu_config():
    model = build_detection_model("fasterrcnn_mobilenet_v3_large_320_fpn", num_classes=4)
    assert model.roi_heads.box_predictor.cls_score.out_features == 4
    assert model.transform.min_size == (320,) and model.transform.max_size == 480
    assert model.roi_heads.fg_bg_sampler.batch_size_per_image == CPU_DEFAULTS[
        "fasterrcnn_mobilenet_v3_large_320_fpn"]["box_batch_size_per_image"]
    stock = build_detection_model("fasterrcnn_mobilenet_v3_large_320_fpn", num_classes=4, cpu_sized=False)
    assert stock.transform.max_size == 640
    assert build_detection_model("fasterrcnn_mobilenet_v3_large_320_fpn", 4, max_size=400).transform.max_size == 400


def test_unknown_name_and_bad_class_count_refused():
    with pytest.raises(ModelError, match="'yolo' is not a supported detection model; choose one of "
                                         "fasterrcnn_mobilenet_v3_large_320_fpn, .*ssdlite320_mobilenet_v3_large"):
        build_detection_model("yolo", 4)
    with pytest.raises(ModelError, match="num_classes=1"):
        build_detection_model(DETECTION_MODELS[0], 1)
