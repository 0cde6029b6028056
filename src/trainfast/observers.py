"""Observers of Sessions: how an instrument that measures a run (the ablation's probe, probe/agent.py) is told about
every trainfast.Session the process creates, without the Session importing the instrument.

An observer has two methods: `attach(session)`, called when a Session is created, and `watch(state,
num_workers)`, called when its setup() has built the training state (its StepTimer is the run's clock), and
`reported(metrics)`, called with what the script gives `tf.report(...)` (its evaluation: a point of its curve); and,
optionally, `closing()`, called by every rank as its Session closes the process group (what needs every rank is
gathered there).
"""
from __future__ import annotations

from typing import Any, Protocol


class SessionObserver(Protocol):
    def attach(self, session: Any) -> None: ...

    def watch(self, state: Any, num_workers: int | None) -> None: ...

    def reported(self, metrics: dict[str, Any]) -> None: ...


def no_closing() -> None:
    """An observer without `closing()`: nothing to gather as the Session closes."""


_OBSERVERS: list[SessionObserver] = []     # per process, like torch's global optimizer hooks


def observe_sessions(observer: SessionObserver) -> None:
    """Tell `observer` about every Session created from now on in this process (once per observer)."""
    if observer not in _OBSERVERS:
        _OBSERVERS.append(observer)


def session_observers() -> list[SessionObserver]:
    return list(_OBSERVERS)
