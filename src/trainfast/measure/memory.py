"""A training step's memory by what holds it: parameters, gradients, optimizer state, activations, inputs and
the rest, at the step's peak (StepMemory, breakdown).

The run's peak (measure.peak_memory_bytes: the CUDA allocator's, or the process's resident set on a CPU) says how
much; this says what, so a user short of memory knows which switch to reach for: 8-bit optimizer states when the
optimizer state is the largest item, activation checkpointing or a chunked loss when activations are. One
training step is profiled with torch.profiler's memory profiler (profile_memory, record_shapes, with_stack), which
follows every tensor the step creates or frees and gives each a category from the graph it flows through
(a parameter, the optimizer's state, a gradient, an activation kept for backward...). The live bytes of every
category are summed over time; the breakdown is their split at the step's highest total, and each category's own
highest beside it (activations peak at the end of the forward, the optimizer's temporaries during its step).

The profiled step is an early one (the second: the first runs compilation and allocates the optimizer's state),
so it falls in the warm-up the timing leaves out; the profile is read after the run, not between steps, so the
steps after it are not held up. Tensors that existed before the step (the weights, the optimizer's state)
count from its start. The profiler's categories are read by position in the table it writes
(torch.profiler.profile.export_memory_timeline); a torch that no longer writes it gives no breakdown, said."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from typing import Any, Iterable, Iterator

import torch

from .compiles import listen_for_compiles, stop_listening

# The columns of export_memory_timeline's [times, sizes] table: an unused first one, then torch's categories in
# the order it writes them (torch/profiler/_memory_profiler.py, _CATEGORY_TO_COLORS), None (uncategorized) last.
COLUMNS = (None, "parameters", "optimizer_state", "inputs", "temporaries", "activations", "gradients",
           "autograd_detail", "other")
ITEMS = ("parameters", "gradients", "optimizer_state", "activations", "inputs", "temporaries", "other")
PROFILED_STEP = 1          # the second step: after the first's compilation and the optimizer state's creation
COMPILING_STEPS = 4        # steps tried in turn where each compiles (StepMemory.around), then no breakdown


def breakdown(sizes: list[list[int]]) -> dict[str, Any] | None:
    """Rows of live bytes by column (one row per instant) -> the split at the highest total, each item's own
    highest and the instant's total. The autograd engine's own buffers count with the rest ("other")."""
    if not sizes:
        return None
    rows = [dict(zip(COLUMNS, row)) for row in sizes]
    for row in rows:
        row["other"] = row.get("other", 0) + row.pop("autograd_detail", 0)
    totals = [sum(v for k, v in row.items() if k is not None) for row in rows]
    peak = max(range(len(rows)), key=totals.__getitem__)
    return {"peak_bytes": totals[peak],
            "at_peak": {item: int(rows[peak].get(item, 0)) for item in ITEMS},
            "highest": {item: int(max(row.get(item, 0) for row in rows)) for item in ITEMS}}


def held_by_optimizer(memory: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """The optimizer state as the optimizer stores it, where the profile saw less: a low-bit state is a tensor
    subclass whose codes and scales the profiler does not trace to the optimizer (torchao's 8-bit state of a
    1024x1024 layer: 2.1 MB stored, 0 in the profile). The difference joins the peak, which held it too."""
    held = state_bytes(optimizer)
    for view in ("at_peak", "highest"):
        missing = held - memory[view]["optimizer_state"]
        if missing > 0:
            memory[view]["optimizer_state"] = held
            if view == "at_peak":
                memory["peak_bytes"] += missing


def run_memory(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first of a rung's runs whose step was profiled (every run profiles the same early step)."""
    return next((run["memory"] for run in runs if run.get("memory")), None)


def limit_peak(rung: Any) -> int | None:
    """The peak a rung (results.Rung: its runs and its aggregated result) is held to a memory limit by. On a GPU,
    the allocator's over the whole run (what runs out). On a CPU, the profiled step's tensors (the highest of its
    runs'): the resident set also holds the Python runtime, the libraries and what the C allocator keeps (1.2 GiB
    around a 7 MiB language model here), which no switch moves. The resident set where no step was profiled (a
    script without a Session)."""
    memory = [run["memory"] for run in rung.repeats if run.get("memory")]
    if memory and memory[0].get("device") == "cpu":
        return max(m["peak_bytes"] for m in memory)
    return rung.result.peak_memory_bytes


def largest(memory: dict[str, Any]) -> tuple[str, int]:
    """The item holding the most at the step's peak, with its bytes."""
    item = max(ITEMS, key=lambda name: memory["at_peak"][name])
    return item, memory["at_peak"][item]


def largest_text(memory: dict[str, Any], shrinkers: dict[str, str]) -> str:
    """The largest item in words, with its share of the step's peak and what would shrink it (`shrinkers`: item ->
    the switches that shrink it, as the declarations say: techniques.memory_shrinkers)."""
    item, held = largest(memory)
    share = held / memory["peak_bytes"] if memory["peak_bytes"] else 0.0
    return (f"the largest item at the profiled step's peak ({memory['peak_bytes'] / 2**20:,.0f} MiB of tensors) is "
            f"its {item.replace('_', ' ')}, {held / 2**20:,.0f} MiB ({share:.0%}): "
            + (f"{shrinkers[item]} would shrink it" if item in shrinkers else "no single switch shrinks it"))


class StepMemory:
    """Profiles one step of a loop's batches (`around`) and reads its breakdown when asked (`result`)."""

    def __init__(self, device: torch.device, optimizer: torch.optim.Optimizer | None = None,
                 step: int = PROFILED_STEP) -> None:
        self.device = device
        self.optimizer = optimizer          # its state is counted from what it stores (held_by_optimizer)
        self.step = step
        self.profile = None
        self.profiled = False               # once in the run, whatever its epochs
        self.compiled = False               # the step being profiled began a compile (compile_started)
        self.compiling_steps = 0            # steps whose profile a compile dropped
        self.at = step                      # the step profiled (a later one where `step` compiled)
        self.error: str | None = None
        self._result: dict[str, Any] | None = None

    def around(self, batches: Iterable) -> Iterator:
        """`batches`, unchanged; the profiler runs from handing out batch `step` until the next is asked for
        (the forward, backward and optimizer step of that batch), once in the run. A step that compiles (a compiled
        model's recompile for a new length: compile_started) is not profiled to its end: its profile is dropped and
        the next step is profiled instead, up to COMPILING_STEPS times."""
        for index, batch in enumerate(batches):
            if index < self.step or self.profiled:
                yield batch
                continue
            self.start(index)
            try:
                yield batch
            finally:
                self.stop()

    def start(self, index: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.at = index

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self.profile = profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True)
        self.compiled = False
        if "torch._dynamo" in sys.modules:        # else nothing compiles: dynamo's import is not paid here
            listen_for_compiles(self.compile_started)
        self.profile.start()

    def compile_started(self, args=None) -> None:
        """Dynamo began compiling inside the profiled step: the profiler stops now. It records every operation of
        the tracing too, shapes and stacks included: a language model's recompile under it held 23 GB of host
        memory before the OOM killer ended the run, and the step's breakdown would count the compiler's tensors."""
        if self.profile is not None and not self.compiled:
            self.compiled = True
            self.profile.stop()

    def stop(self) -> None:
        if "torch._dynamo" in sys.modules:
            stop_listening(self.compile_started)
        if not self.compiled:
            self.profile.stop()
            self.profiled = True
            return
        self.profile, self.compiling_steps = None, self.compiling_steps + 1
        if self.compiling_steps >= COMPILING_STEPS:
            self.profiled = True
            self.error = f"no breakdown: each of the {COMPILING_STEPS} steps profiled compiled (a changing shape)"

    def result(self) -> dict[str, Any] | None:
        """The profiled step's breakdown (None: no step profiled yet, or the profile could not be read: `error`)."""
        if self._result is None and self.profile is not None:
            self._result = self._read()
        return self._result

    def _read(self) -> dict[str, Any] | None:
        device = f"{self.device.type}:{self.device.index or 0}" if self.device.type == "cuda" else "cpu"
        handle, path = tempfile.mkstemp(suffix=".json")
        os.close(handle)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)        # deprecated for CUDA's own snapshots
                self.profile.export_memory_timeline(path, device=device)
            with open(path) as f:
                _, sizes = json.load(f)
            if sizes and len(sizes[0]) != len(COLUMNS):
                self.error = f"torch's memory timeline has {len(sizes[0])} columns, not the {len(COLUMNS)} read here"
                return None
            found = breakdown(sizes)
            if found is not None:
                found["step"], found["device"] = self.at, self.device.type
                if self.optimizer is not None:
                    held_by_optimizer(found, self.optimizer)
            return found
        except Exception as exc:                 # a profile that cannot be read costs the breakdown, not the run
            self.error = f"{type(exc).__name__}: {exc}"
            return None
        finally:
            os.unlink(path)
            self.profile = None              # read once: the profile's events are freed


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes an optimizer's state holds, a low-bit state's codes and block scales counted as stored (a tensor
    subclass is counted through its inner tensors, __tensor_flatten__)."""
    def size(t: torch.Tensor) -> int:
        flatten = getattr(t, "__tensor_flatten__", None)
        if flatten is not None and type(t) is not torch.Tensor:
            return sum(size(getattr(t, name)) for name in flatten()[0])
        return t.numel() * t.element_size()

    return sum(size(v) for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))
