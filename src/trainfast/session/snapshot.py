"""What a Session's checkpoint holds and how a load puts it back (Session.save / Session.load): the training
state (checkpoint.py: model with the user's own keys, optimizer, scheduler, loss scaler and O2 masters, non-finite
counters, step counters), the loaders' epochs and generators, what was reported, and every rank's RNG states.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..checkpoint import FORMAT_VERSION, CheckpointError, capture_state, restore_rng, restore_state
from ..recipe import Recipe
from .loaders import SessionLoader
from .state import TrainState


def session_payload(state: TrainState, recipe: Recipe, loaders: list[SessionLoader], reported: dict[str, Any],
                    ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The checkpoint rank 0 writes; `ranks`: every rank's {"rng": ...}, gathered (a collective, done by the
    caller on every rank)."""
    return {"format": "trainfast.session", "version": FORMAT_VERSION, **capture_state(state),
            "recipe": recipe.to_dict(), "loaders": [loader.state_dict() for loader in loaders],
            "reported": dict(reported), "world_size": len(ranks), "ranks": ranks}


def restore_session(payload: dict[str, Any], path: str | Path, state: TrainState, loaders: list[SessionLoader],
                    reported: dict[str, Any], rank: int, world_size: int) -> None:
    """`payload` (read from `path`) back into the state, the loaders and `reported`, then this rank's RNG states,
    so the run continues as if it had not stopped. A checkpoint of another number of ranks is refused."""
    if payload.get("world_size", 1) != world_size:
        raise CheckpointError(f"{path}: written by {payload.get('world_size')} rank(s), this run has "
                              f"{world_size}; load it with the same number of processes")
    restore_state(state, payload)
    state.accumulated, state.update_due = 0, False
    for loader, saved in zip(loaders, payload["loaders"]):
        loader.load_state_dict(saved)
    reported.update(payload.get("reported", {}))
    restore_rng(payload["ranks"][rank]["rng"])      # last: nothing after this draws

