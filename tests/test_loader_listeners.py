"""instruments/loaders.py: one patch of DataLoader iteration shared by every listener (the doctor's step clock, a
rank's phase clock, the probe's observer), each method patched only while a listener overrides it."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from trainfast.instruments.loaders import LoaderListener, listen


def test_listeners_nest_in_the_order_they_came_and_the_last_one_out_puts_torch_back():
    iterate, advance = DataLoader.__iter__, _BaseDataLoaderIter.__next__
    heard: list = []

    class Around(LoaderListener):
        def __init__(self, name: str) -> None:
            self.name = name

        def around_next(self, iterator, fetch):
            heard.append(("in", self.name))
            try:
                return fetch()
            finally:
                heard.append(("out", self.name))

    class Passes(LoaderListener):
        def iterating(self, loader) -> None:
            heard.append(("pass", len(loader)))

    inner = listen(Around("inner"))
    assert DataLoader.__iter__ is iterate            # nobody wants the passes yet: __iter__ stays torch's own
    passes, outer = listen(Passes()), listen(Around("outer"))
    batches = list(DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2))
    assert len(batches) == 2 and torch.equal(batches[1][0], torch.tensor([2.0, 3.0]))
    one = [("in", "outer"), ("in", "inner"), ("out", "inner"), ("out", "outer")]
    assert heard == [("pass", 2)] + one * 3          # two batches and the StopIteration that ends the pass
    inner(), inner(), outer()                        # removing twice is harmless
    assert _BaseDataLoaderIter.__next__ is advance and DataLoader.__iter__ is not iterate
    passes()
    assert DataLoader.__iter__ is iterate
