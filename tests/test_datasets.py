import pytest
import torch

from trainfast.data.datasets import DataError, HostNormalized, normalize, stats_tensors
from trainfast.data.loading import load_data, parse_data_spec


def test_digits_is_real_and_split_is_fixed(digits16):
    assert len(digits16.train) + len(digits16.val) == 1797
    image, label = digits16.train[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 16, 16) and 0 <= label < 10
    again = load_data("digits", 16)
    assert torch.equal(again.val.images, digits16.val.images)


def test_host_and_device_normalization_agree(digits16):
    host = HostNormalized(digits16.train, digits16.mean, digits16.std)
    mean, std = stats_tensors(digits16.mean, digits16.std)
    batch = torch.stack([digits16.train[i][0] for i in range(8)])
    on_device = normalize(batch, mean, std)
    reference = torch.stack([host[i][0] for i in range(8)])
    assert torch.equal(on_device, reference)


@pytest.mark.parametrize("spec,message", [
    ("mnist", "unknown dataset 'mnist'"),
    ("imagefolder", "imagefolder needs a path"),
    ("digits:/x", "digits takes no path"),
    ("cifar10:/does/not/exist", "folder does not exist"),
])
def test_bad_data_spec(spec, message):
    with pytest.raises(DataError, match=message):
        load_data(spec) if ":" in spec and spec.startswith("cifar") else parse_data_spec(spec)


def test_synthetic_data_is_deterministic():
    a, b = load_data("synthetic", 8), load_data("synthetic", 8)
    assert torch.equal(a.train.images, b.train.images) and a.num_classes == 10
