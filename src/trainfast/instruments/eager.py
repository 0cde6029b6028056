"""Forward hooks that run eagerly beside a compiled model, never traced into its graph, without importing dynamo
before anything compiles.

torch.compiler.disable marks a hook so that a compiled forward calls it eagerly (a graph break at the call, outside
the model's own graph) instead of tracing it, so compiling a script's model neither changes nor fails because of
trainfast's counting. Applied as a decorator it imports torch._dynamo when trainfast's module loads: ~1.5 s of every
measured script's start on 2 cores, though most scripts never compile. Nothing is traced before dynamo is
imported (a compile begins by importing it), so a hook is registered as it is and, once dynamo's import completes
(frameworks/hooks.py), its slot in the same hook table is given the disabled version."""
from __future__ import annotations

import sys
from typing import Any, Callable

from ..frameworks.hooks import when_imported


def register_eager(register: Callable[..., Any], hook: Callable, **kwargs) -> Any:
    """`register(hook, **kwargs)` (a module's `register_forward_pre_hook`, or every module's) for a hook that must
    never be traced (module docstring); its handle, which removes it whichever version it holds."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        return register(dynamo.disable(hook), **kwargs)
    handle = register(hook, **kwargs)
    when_imported("torch._dynamo", lambda module: disable_in_place(handle, module))
    return handle


def disable_in_place(handle: Any, dynamo: Any) -> None:
    """The hook `handle` registered, replaced in its table by its disabled version (where it is still there)."""
    hooks = handle.hooks_dict_ref()
    if hooks is not None and handle.id in hooks:
        hooks[handle.id] = dynamo.disable(hooks[handle.id])
