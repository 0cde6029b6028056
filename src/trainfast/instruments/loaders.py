"""Listening to torch DataLoaders as a loop uses them, for every instrument that needs to: the doctor's step clock
(steps.py: each batch's wait and samples), a rank's phase clock (probe/ranks.py: the wait for data per step) and
the probe's observer (probe/observe.py: the loader iterated last, and the loader switches set before a pass).

One patch of `DataLoader.__iter__` and one of its iterators' `__next__` (`_BaseDataLoaderIter`, which every torch
iterator inherits) serve them all, each put in with the first listener that overrides it and taken out with the
last, so a loop nobody listens to iterates torch's own methods and a closed listener leaves nothing behind. Each
listener is one object with no-op defaults (`LoaderListener`); `listen()` adds it and returns what removes it.

A batch passes through the listeners' `around_next` in turn, the one added last outermost (as stacked patches
would): each gets the iterator and a `fetch()` that brings the batch (through the listeners inside it), and
returns the batch. A listener that times the fetch times every listener inside it too; they cost a Python call
each per batch."""
from __future__ import annotations

from typing import Any, Callable


class LoaderListener:
    """What a loader's iteration tells a listener. Override what is needed; the defaults do nothing."""

    def iterating(self, loader: Any) -> None:
        """A pass over `loader` starts (its `__iter__` was called), before torch builds the pass's iterator."""

    def around_next(self, iterator: Any, fetch: Callable[[], Any]) -> Any:
        """One `next(batch)` of `iterator`: returns `fetch()` (which raises StopIteration at the pass's end)."""
        return fetch()


_listeners: list[LoaderListener] = []
_originals: dict[str, Any] = {}           # the method name -> torch's own, while it is patched


def listen(listener: LoaderListener) -> Callable[[], None]:
    """Adds `listener`; returns what removes it (idempotent). A method is patched while a listener overrides it:
    the observer, which only wants to know a pass began, puts nothing on the step."""
    _listeners.append(listener)
    _repatch()

    def remove() -> None:
        if listener in _listeners:
            _listeners.remove(listener)
            _repatch()
    return remove


def _wants(method: str) -> list[LoaderListener]:
    return [x for x in _listeners if getattr(type(x), method) is not getattr(LoaderListener, method)]


def _repatch() -> None:
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    for method, owner, name, patched in (("iterating", DataLoader, "__iter__", _listened_iter),
                                         ("around_next", _BaseDataLoaderIter, "__next__", _listened_next)):
        if _wants(method) and method not in _originals:
            _originals[method] = getattr(owner, name)
            setattr(owner, name, patched)
        elif not _wants(method) and method in _originals:
            setattr(owner, name, _originals.pop(method))


def _listened_iter(loader):
    for listener in _wants("iterating"):
        listener.iterating(loader)
    return _originals["iterating"](loader)


def _listened_next(iterator):
    advance = _originals["around_next"]
    fetch = lambda: advance(iterator)                         # noqa: E731 - the innermost link of the chain
    for listener in _wants("around_next"):                    # the first added innermost, the last outermost
        fetch = _link(listener, iterator, fetch)
    return fetch()


def _link(listener: LoaderListener, iterator: Any, inner: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: listener.around_next(iterator, inner)
