"""The machine a result was measured on, as results.json and report.md record it: device, CPU and its flags,
threads, memory, library versions and the git commit of trainfast that measured it."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from ..envcheck import CPU_FLAGS_THAT_MATTER, cpu_name
from ..techniques.precision import cpu_flags


def git_sha() -> str | None:
    """The commit of this trainfast checkout, "-dirty" when tracked files are modified; None outside git."""
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def environment(device: torch.device) -> dict[str, Any]:
    import psutil
    import timm
    import torchvision

    flags = cpu_flags()
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "cpu": cpu_name(),
        "cpu_cores": os.cpu_count(),
        "cpu_flags": [f for f in CPU_FLAGS_THAT_MATTER if f in flags],
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "timm": timm.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "git_sha": git_sha(),
    }
