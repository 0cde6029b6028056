"""The one small interface every tracker offers (mlflow.py, wandb.py, tensorboard.py), and how one is loaded: its
client library is imported only here, when a run asks for it, with an error naming the package to install."""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from .names import TRACKERS


class TrackError(ValueError):
    """A tracker that cannot start: its library missing, or its store unreachable (said before any run starts; a
    ValueError, so the CLI says it as it says a bad flag)."""


class Tracker(ABC):
    """One group of runs in one tracker: a parent (the ablation, the tune, the training run) and its children
    (a rung, a candidate), each named by a key. Figures are plain: params and tags are strings, metrics floats."""

    def __init__(self, group: str, kind: str, params: dict[str, str], folder: Path) -> None:
        self.group, self.kind, self.folder = group, kind, folder

    @abstractmethod
    def child(self, key: str, params: dict[str, str]) -> None:
        """Start the child `key` (called once per key, before its figures)."""

    @abstractmethod
    def log(self, key: str | None, metrics: dict[str, float], tags: dict[str, str], step: int) -> None:
        """Figures of a child (None: the parent) at `step` (a rung: its repeats so far)."""

    def artifacts(self, key: str | None, paths: list[Path]) -> None:
        """Files kept with a run (the report, the charts), where the tracker keeps files."""

    @abstractmethod
    def end(self, status: str) -> None:
        """Close every run: status "finished", "failed" or "killed"."""

    def child_env(self, key: str) -> dict[str, str]:
        """What a script's own client reads to file its runs under the child `key` (nothing where it has no such
        setting)."""
        return {}


def load_tracker(name: str) -> type[Tracker]:
    """The tracker class for `name`; TrackError naming the package when its library is not installed."""
    module = importlib.import_module(f".{name}", __package__)
    try:
        module.check_installed()
    except ImportError as exc:
        raise TrackError(f"--track {name}: its library is not installed ({exc}); pip install {TRACKERS[name]} "
                         "(or trainfast[track])") from None
    return module.TRACKER


def text(value: Any) -> str:
    """A param or tag's value as the trackers store it (a string, cut where trackers refuse longer ones)."""
    value = value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    return value if len(value) <= 500 else value[:497] + "..."
