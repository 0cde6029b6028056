import pytest
import torch

from trainfast.data.datasets import Split, load_digits
from trainfast.models import resnet9


def tiny_resnet(num_classes: int = 10) -> torch.nn.Module:
    """The default architecture at a fraction of its width: same layers (conv, BN, residual), fast on CPU."""
    return resnet9(num_classes, widths=(8, 16, 16, 32))


@pytest.fixture(autouse=True)
def _decode_cache_in_tmp(tmp_path, monkeypatch):
    """Decode caches built by any test go to its own temporary folder, never the user's ~/.cache."""
    monkeypatch.setenv("TRAINFAST_CACHE", str(tmp_path / "trainfast-cache"))


@pytest.fixture(scope="session")
def digits16() -> Split:
    """The real built-in dataset at 16 px: small enough that a full epoch takes about a second."""
    return load_digits(16)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
