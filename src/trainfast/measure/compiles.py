"""dynamo's compile-start callbacks, registered and removed by what needs to know a compile began: a run's
compile count (instruments/recompiles.py) and the memory profiler, which must not record the tracing
(measure/memory.py). A torch without the callbacks gives nothing to listen to."""
from __future__ import annotations

from typing import Callable


def listen_for_compiles(callback: Callable) -> None:
    """`callback(args)` at the start of every compile dynamo begins (its frames' and their deferred backwards'), once
    however often asked (again after torch._dynamo.reset(), which clears the callbacks). Imports dynamo."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return
    if callback not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(callback)


def stop_listening(callback: Callable) -> None:
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return
    if callback in callback_handler.start_callbacks:
        callback_handler.remove_start_callback(callback)
