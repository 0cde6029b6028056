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


def test_an_input_the_model_cannot_take_is_refused_before_training_with_the_size_it_takes():
    from trainfast.models import check_input_size

    model = build_model("convnext_atto", num_classes=10)       # downsamples 32x: 16 px leaves nothing to its last stage
    before = torch.random.get_rng_state()
    with pytest.raises(ModelError, match=r"--model convnext_atto cannot take 16x16 images \(--image-size 16\).*"
                                         r"it takes --image-size 32"):
        check_input_size(model, "convnext_atto", (3, 16, 16))
    check_input_size(model, "convnext_atto", (3, 32, 32))
    assert model.training and torch.equal(torch.random.get_rng_state(), before)    # mode and seed left as found


def test_the_input_check_leaves_the_random_state_as_found_even_for_a_layer_it_initializes():
    from trainfast.models import check_input_size

    torch.manual_seed(0)
    expected = torch.nn.LazyLinear(4)(torch.zeros(2, 8))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(4))
    check_input_size(model, "lazy", (2, 2, 2))
    assert torch.equal(model(torch.zeros(2, 2, 2, 2)), expected)


def test_a_detection_model_named_for_classification_points_to_the_detection_task():
    from trainfast.models import ModelError
    from trainfast.tasks import build_task

    with pytest.raises(ModelError, match="is a torchvision detection model; the detection task") as raised:
        build_task("classification").check_model("fasterrcnn_resnet50_fpn")
    assert "fasterrcnn_mobilenet_v3_large_320_fpn" in str(raised.value)


def test_a_pretrained_tag_is_said_to_start_from_random_weights(capsys):
    from trainfast.models import build_model

    build_model("resnet10t.c3_in1k", 3)
    assert "resnet10t starts from random weights" in capsys.readouterr().err
    with pytest.raises(ModelError, match=r"no such pretrained tag for resnet10t \(its tags: resnet10t.c3_in1k\)"):
        check_model_name("resnet10t.a1_in1k")
