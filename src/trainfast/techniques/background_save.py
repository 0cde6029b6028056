"""`async_checkpoint`: write checkpoints in a background thread while training goes on.

A checkpoint's cost to the loop is serializing the state (torch.save), hashing it, writing it and waiting for
the disk (fsync of the file and of its folder): 0.22-0.29 s for ResNet-18 with AdamW (134 MB) on a 2-core VM's
disk, seconds on a network disk, for every save, during which a synchronous loop does nothing else. In the background
only a copy of the state stays on the loop's path: tensors are cloned (on the host, a memory copy at memory bandwidth;
a GPU's state is copied to host memory) so the next optimizer step cannot change what is being written, and
the thread does the rest. What a checkpoint guarantees does not change: the same atomic write (temp file,
fsync, rename, fsync of the folder), the same checksum, old checkpoints pruned only after the new one is
complete. At most one save is in flight (the copy costs one more state's worth of host memory, never more):
the next save, the end of the run and process exit wait for it; an error in the thread is raised there, not
lost.

The loop's arithmetic is untouched, so the trajectory and the bytes written are the same as a synchronous
save's: only when the file appears changes. What it buys depends on who else wants the cores: the thread's
serialization and hashing are CPU work, so on a CPU-only machine whose cores the loop already fills, the seconds
leave the loop (13-17 ms a save instead of 0.22-0.29 s, measured) but the thread spends most of them on the same
cores; the fsync wait and every save of a GPU loop, whose host cores are idle, are truly hidden.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from .base import ACTS, Effect
from .switch import RunContext, RungSpec, Switch


def host_copy(payload: Any) -> Any:
    """Every tensor in `payload` copied to host memory (dicts, lists and tuples rebuilt; other values shared:
    plain numbers and strings cannot change under the writer)."""
    def copy(value: Any) -> Any:
        return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value
    return tree_map(copy, payload)


class SyncWriter:
    """The default: a save runs in the loop, start to end."""

    def save(self, payload: Any, write: Callable[[Any], None]) -> None:
        write(payload)

    def wait(self) -> None:
        pass


class BackgroundWriter:
    """One save at a time in a thread. The thread is not a daemon, so an interpreter that exits (after the
    loop's last line or after an exception) still finishes the file it is writing."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def save(self, payload: Any, write: Callable[[Any], None]) -> None:
        """`write(copy)` in the thread, on a host copy of `payload` made here, on the loop's thread, so the next
        step cannot change what is written."""
        self.wait()                        # one in flight: the previous save completes first (or raises here)
        owned = host_copy(payload)

        def body() -> None:
            try:
                write(owned)
            except BaseException as exc:   # handed to the loop's thread at the next save or at the end,
                self.error = exc           # and said now, in case the loop stops for another reason first
                print(f"checkpoint: the background save failed: {type(exc).__name__}: {exc}", file=sys.stderr,
                      flush=True)

        self.thread = threading.Thread(target=body, name="trainfast-checkpoint", daemon=False)
        self.thread.start()

    def wait(self) -> None:
        """Block until the save in flight is complete; raise its error, if it failed."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def checkpoint_writer(recipe) -> SyncWriter | BackgroundWriter:
    return BackgroundWriter() if recipe.async_checkpoint else SyncWriter()


NO_SAVES_NOTE = ("a built-in rung saves no checkpoint unless --save-every N asks it to (then every rung saves "
                 "every N steps and the saves are timed)")


def saves_effect(run: RunContext) -> Effect:
    """A run that saves nothing during its steps has no save to move off the loop (a script's saves are not known
    before it runs: they count as there)."""
    return Effect(False, NO_SAVES_NOTE, applies=False) if run.saves is False else ACTS


WRITES_OWN = "trainfast's background save acts on Session.save and the built-in loop; the framework writes its own " \
             "checkpoints"
SWITCHES = (
    Switch(("async_checkpoint",),
           rungs=(RungSpec("async_checkpoint", {"async_checkpoint": True}, place=72),),
           own_process=True, resumable=True,       # saves inside the timed steps; the bytes written are the same
           context_effect=saves_effect,
           frameworks={"lightning": "plugins: AsyncCheckpointIO"},
           unreachable={"transformers": WRITES_OWN, "accelerate": WRITES_OWN}),
)
