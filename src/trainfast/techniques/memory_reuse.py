"""reuse_memory: memory a step frees stays mapped in the process for the next step, instead of going back to the OS.

On Linux, glibc's malloc serves a large request (above a threshold that grows to at most 32 MiB) with a fresh
mmap and hands it back with munmap when it is freed. A training step on the CPU allocates and frees its
activations and gradients every step, many of them large (ResNet-18 at 128 px, batch 128: the first convolution's
bf16 output alone is 64 MiB), so every step maps them anew and the kernel zero-fills each 4 KiB page on its first
touch: about 130,000 page faults and a quarter of a second of kernel time a step on a 2-core VM, where the step
takes 1.3 s (docs/benchmarks/host-switches.md). With mmap turned off for allocations (M_MMAP_MAX=0) and the free top
of the heap kept (trimming off), a freed block is reused from the heap, already mapped and faulted in. That is what
a caching allocator does (PyTorch's CUDA allocator; jemalloc or tcmalloc preloaded on a CPU); here it is glibc's
own malloc, set with mallopt, with nothing to install.

What it costs: the process keeps the memory it has freed (its peak resident memory a little higher, which the
ablation's memory column shows) until it exits. The arithmetic is unchanged (same kernels, same values).

It acts where the C library is glibc; elsewhere (macOS, musl) or with another allocator preloaded (jemalloc,
tcmalloc, mimalloc: the process caches already) it is not applicable. mallopt changes how later requests are
served, so a trainfast.Session applies it whenever it starts; a command the ablation runs (`ablate -- COMMAND`,
whatever its framework) starts with the same settings in its environment (MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_),
which glibc reads before the first allocation. `in_effect()` is the read-back.
"""
from __future__ import annotations

import ctypes
import functools
import platform
from typing import TYPE_CHECKING

from .switch import ADAPTERS, ProcessWideSwitch, RungSpec, Switch
from .threads import started_env

if TYPE_CHECKING:
    from .base import Effect

FIELD = "reuse_memory"
# mallopt's parameters (malloc.h) and glibc's defaults, restored when a later Session in the process turns it off.
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536
NO_TRIM = -1                       # mallopt: -1 turns trimming off altogether
# The same settings for a process that starts with them: glibc reads these before its first allocation.
MMAP_ENV = "MALLOC_MMAP_MAX_"      # the variable a start environment is read back by
ENV = {MMAP_ENV: "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 50)}
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

_applied = False                   # mallopt set in this process by apply()


def environ() -> dict[str, str]:
    """The variables a process starts with to have it: {} where it cannot act (not glibc, another allocator)."""
    return dict(ENV) if unavailable() is None else {}


@functools.lru_cache(maxsize=None)
def unavailable() -> str | None:
    """Why the switch cannot act in this process, or None where it can (glibc's malloc serves it)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"needs glibc's malloc (Linux); this is {platform.system()} {platform.libc_ver()[0] or ''}".rstrip()
    try:
        maps = open("/proc/self/maps").read()
    except OSError:
        maps = ""
    other = next((name for name in OTHER_ALLOCATORS if f"lib{name}" in maps), None)
    if other:
        return f"this process allocates with {other} (preloaded), which keeps freed memory already"
    if not hasattr(libc(), "mallopt"):
        return "this C library has no mallopt"
    return None


@functools.lru_cache(maxsize=None)
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)       # the process's own symbols: glibc's malloc, whatever name it was loaded under


def effect() -> Effect:
    from .base import ACTS, Effect

    reason = unavailable()
    return ACTS if reason is None else Effect(False, f"reuse_memory: {reason}")


def apply(on: bool) -> bool:
    """Set glibc's malloc to keep and reuse freed memory (on), or undo a setting this module made before (off).
    True if the switch is in effect afterwards."""
    global _applied
    if on:
        if unavailable() is None and not _applied:
            ok = libc().mallopt(M_MMAP_MAX, 0) == 1 and libc().mallopt(M_TRIM_THRESHOLD, NO_TRIM) == 1
            if not ok:
                raise RuntimeError("reuse_memory: glibc refused mallopt(M_MMAP_MAX, 0) or mallopt(M_TRIM_THRESHOLD)")
            _applied = True
    elif _applied:
        libc().mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        libc().mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
        _applied = False
    return in_effect()


def kernel_counters() -> tuple[int, float, float] | None:
    """This process's page faults served without I/O (first touches of fresh pages), its seconds of kernel time
    and its seconds of CPU time (user + kernel) so far, all its threads together (its loader workers are other
    processes); None without getrusage."""
    try:
        import resource
    except ImportError:            # Windows
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt, usage.ru_stime, usage.ru_utime + usage.ru_stime


def counted_between(before: tuple | None, after: tuple | None) -> tuple | None:
    """The page faults, kernel seconds and CPU seconds between two kernel_counters() reads (None if either is
    missing)."""
    return None if before is None or after is None else tuple(a - b for a, b in zip(after, before))


def in_effect() -> bool:
    """Set in this process by apply(), or the process started with the environment that sets it."""
    if unavailable() is not None:
        return False
    return _applied or started_env().get(MMAP_ENV) == ENV[MMAP_ENV]


SWITCHES = (
    Switch((FIELD,),
           rungs=(RungSpec(FIELD, {FIELD: True}, place=45, tune=3),),
           own_process=True, resumable=True,
           device_effect=lambda device: effect(),
           process_wide=ProcessWideSwitch(MMAP_ENV, environ=environ, in_effect=in_effect, apply=apply,
                                       keep="start the script with " + " ".join(f"{k}={v}" for k, v in ENV.items())
                                            + " in its environment"),
           frameworks={name: f"{MMAP_ENV} and MALLOC_TRIM_THRESHOLD_ in the environment the process starts "
                             "with" for name in ADAPTERS}),
)
