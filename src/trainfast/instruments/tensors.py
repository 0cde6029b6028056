"""The tensors in a model's input or output, or a batch, as the instruments read them: through dicts, lists and
tuples, in order. Narrower than techniques/transfer.tensors_in, which walks any Mapping by mapping over it (a
copy of each one): the instruments run inside a user's hooks and only look, so they copy nothing they read."""
from __future__ import annotations

from typing import Any

import torch


def tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []
