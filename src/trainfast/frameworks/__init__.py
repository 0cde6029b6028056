"""Framework adapters: the ablation's switches applied to an unmodified script built on transformers' Trainer,
a Lightning Trainer or Accelerate, from inside the script's process (trainfast's start-up hook installs them
in every measured run), each through the framework's own settings where it has one, and proven applied by
reading the setting back from what the framework built.

Each adapter patches its framework's classes when the script imports them (hooks.py), so a framework that is
not installed, or not used by the script, costs nothing and changes nothing. What each did is one section of
the run's result ("frameworks", board.py); the ablation reads it to tell a switch that did not take effect
("not applied") from one that made no difference.
"""
from __future__ import annotations

from typing import Any

from .board import Board

SECTION = "frameworks"


def install(probe: Any, fields: dict[str, Any]) -> Board | None:
    """Install every adapter for a run that asks for `fields` (the Recipe fields of TRAINFAST_RECIPE); the
    board is registered with the probe, which writes it into the run's result."""
    if not fields:
        return None
    from . import accel, hf, lightning

    board = Board(dict(fields), on_metrics=getattr(probe, "reported", None))
    probe.sections[SECTION] = board
    for adapter in (hf, lightning, accel):
        adapter.install(board)
    return board


def install_from_env(probe: Any) -> Board | None:
    """What trainfast's start-up hook calls in a measured run: the adapters, for TRAINFAST_RECIPE's fields."""
    from ..recipe import env_recipe_fields

    return install(probe, env_recipe_fields()) if probe is not None else None
