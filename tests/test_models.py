import pytest
import torch

from trainfast.models import ModelError, build_model, check_model_name


def test_default_model_trains_shape():
    model = build_model("resnet9", 10)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_timm_model_by_name_with_small_images_and_random_init():
    vit = build_model("vit_tiny_patch16_224", 7, image_size=32)   # img_size passed to position embeddings
    assert vit(torch.zeros(1, 3, 32, 32)).shape == (1, 7)
    cnn = build_model("resnet10t", 5, image_size=32)              # conv nets take any size
    assert cnn(torch.zeros(2, 3, 32, 32)).shape == (2, 5)


def test_unknown_model_suggests_close_names():
    with pytest.raises(ModelError, match="did you mean.*resnet50"):
        check_model_name("resnet5O")
