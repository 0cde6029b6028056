"""Atomic saves and safe loads. A reader never sees a half-written file: write to a temp file in the
same folder, fsync it, os.replace it over the target, fsync the folder."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def atomic_save(obj: Any, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def safe_load(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """Tensors and plain containers only: a file that needs arbitrary unpickling is refused, never retried
    without weights_only."""
    return torch.load(path, map_location=map_location, weights_only=True)
