"""trainfast: PyTorch training where every speed technique is one switch, measured on your setup.

The names below are imported on first use, so `import trainfast` (and `trainfast --help`) stays light: a
process measured by the ablation imports trainfast at start-up before the script has imported torch.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Recipe": "recipe", "RecipeError": "recipe", "preset": "recipe",
    "Session": "session",
    "train": "trainer", "TrainResult": "trainer",
    "ablate": "ablation",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainfast' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
