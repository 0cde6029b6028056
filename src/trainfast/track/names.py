"""--track's names, and the tracker a user's environment already points at. No torch and no tracker library
here: the CLI reads it before either loads."""
from __future__ import annotations

import importlib.util
import os
from typing import Callable, Iterable, Mapping

# name -> the package its client comes from (pip install NAME)
TRACKERS = {"mlflow": "mlflow-skinny", "wandb": "wandb", "tensorboard": "tensorboard"}
OFF = "none"


def parse_track(text: str) -> tuple[str, ...]:
    """--track mlflow,wandb -> ("mlflow", "wandb"); an unknown name is refused with the names it can be."""
    names = tuple(n.strip().lower() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in TRACKERS and n != OFF]
    if unknown or not names:
        raise ValueError(f"{text!r}: choose from {', '.join([*TRACKERS, OFF])} (a comma list, or the flag repeated)")
    return names


def check_names(names) -> tuple[str, ...]:
    """Tracker names as the Python API takes them (a name, or several); ValueError naming the unknown one."""
    names = (names,) if isinstance(names, str) else tuple(names or ())
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"track={unknown[0]!r}: choose from {', '.join(TRACKERS)}")
    return names


def from_environment(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The trackers a user already configured in the environment, each with why: (name, reason)."""
    found = []
    if environ.get("MLFLOW_TRACKING_URI"):
        found.append(("mlflow", f"MLFLOW_TRACKING_URI is set ({environ['MLFLOW_TRACKING_URI']})"))
    # WANDB_MODE=disabled is how a user (or a CI job) says "no W&B": never a reason to start it
    mode = environ.get("WANDB_MODE", "")
    if environ.get("WANDB_PROJECT"):
        found.append(("wandb", f"WANDB_PROJECT is set ({environ['WANDB_PROJECT']})"))
    elif mode and mode != "disabled":
        found.append(("wandb", f"WANDB_MODE is set ({mode})"))
    return found


def choose_trackers(asked: Iterable[Iterable[str]] | None, environ: Mapping[str, str] | None = None,
                    say: Callable[[str], None] = print) -> tuple[str, ...]:
    """The trackers a command line asks for (--track, each given as parse_track made it), else those its
    environment points at, said on the console with why; `--track none`: none, whatever the environment says."""
    names = [n for group in asked or () for n in group]
    if OFF in names:
        return ()
    if names:
        return check_installed(tuple(dict.fromkeys(names)))
    picked = from_environment(os.environ if environ is None else environ)
    for name, why in picked:
        say(f"tracking in {name}: {why} (--track none: no tracker)")
    return check_installed(tuple(name for name, _ in picked))


def check_installed(names: tuple[str, ...]) -> tuple[str, ...]:
    """`names`, once each one's library is found (not imported: that waits for the first run); ValueError naming
    the package to install."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise ValueError(f"--track {name}: its library is not installed; pip install {TRACKERS[name]} (or "
                             "trainfast[track])")
    return names
