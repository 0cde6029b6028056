"""Post-import hooks: run a function on a module right after it is first imported, or at once if it already
is. A framework adapter patches the framework's classes this way, so nothing of the framework is imported
(seconds, for transformers) in a process that never uses it, and a script that imports it at any point, in
any form (`from transformers import Trainer` goes through transformers' lazy loader to
`transformers.trainer`), is patched before its first use."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Callable

_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}


def when_imported(name: str, action: Callable[[ModuleType], None]) -> None:
    """Call `action(module)` once `name` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        action(module)
        return
    _PENDING.setdefault(name, []).append(action)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name it asks the other finders, then wraps the loader so the
    actions run after the module's own code."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _PENDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        for action in _PENDING.pop(self.name, []):
            action(module)

    def __getattr__(self, attr):            # get_source, is_package...: the real loader's
        return getattr(self.inner, attr)
