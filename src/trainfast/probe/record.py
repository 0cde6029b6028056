"""The run record: every measured number of one run, the ablation's per-run result (written by the run,
contract.py; read by ablation/work.py and ablation/scoring.py, and through them the report).

A record is typed sections, each with exactly one writer, given once when the record is made; written out they
are one flat JSON object with the keys the readers know. No key belongs to two sections: `RunRecord.to_dict`
refuses a record in which two sections write the same key, so a writer that adds a number can never overwrite
another's.
  rate    the probe       the run's rate, what it counts, its timing
  run     the probe       how the run went: mode, stop, seed, workers, ranks, memory, precision, compiles, process
  script  the probe       what the script said: its reports, its frameworks' sections, its Session's refusals
  curve   the run's curve --target: its evaluations on the way (a script's, instruments/curve.py; or the built-in
                          run's, curves.py)
  task    the built-in run  its task's figures: the judged metric, the evaluation, the epochs (ablation/rung.py)
  data    the task's data   what only its data has to count (an image folder's unreadable and host-decoded files)
  observed  the probe's Observer  what the script's run was seen doing: precision, compile, optimizer, loader,
                          memory format, and who turned each on (observe.py)
"""
from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..instruments.recompiles import CompileWindow
from ..procstate import process_state
from ..techniques import process_wide_in_effect
from .observe import observed_section

PROCESS_SWITCHES = "process_switches"     # the result's key for the process-wide switches read back
WRAP_SWITCHES = "wrap_switches"           # the result's key for the wrap switches read back from DDP / FSDP2


class RecordError(ValueError):
    """Two sections of a run record write the same key: one of them would overwrite the other's number."""


class Section(Protocol):
    """A part of the record with one writer: its keys and values."""

    def to_dict(self) -> dict[str, Any]: ...


class Fields:
    """A section whose dataclass fields are its keys."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class Rate(Fields):
    """The run's rate and what it counts (the probe's clock)."""
    throughput: float              # ranks step in lockstep (gradient all-reduce): world_size x one rank's rate
    documents_per_s: float | None  # beside a token script's tokens/s
    # What the rate counts: what the run declares (the built-in run: its task's unit), else a token script's tokens
    # (instruments/batches.py), else a step's samples where they are known, else steps (a script without a Session
    # whose framework does not say its batch).
    unit: str
    rate_unit: str
    timing: dict[str, Any]
    steps_run: int
    steady_window: int | None      # full mode: the steps timed (None: all)
    whole_run: bool                # timed over every step after warm-up (Probe.whole_run)
    # Only a Session's loader times the wait for each batch; the global hook sees optimizer steps alone.
    data_wait_fraction: float | None
    copy_fraction: float | None    # CUDA: the batches' copy and preparation on the compute stream (measure.InputSpan)


@dataclass
class RunState(Fields):
    """How the run went, as the probe saw it."""
    session: bool                  # a Session measured it (else the global optimizer hook)
    mode: str
    stopped: str
    seed: int | None               # the run's name in the report's notes
    num_workers: int
    world_size: int
    peak_memory_bytes: int | None
    memory: dict[str, Any] | None  # one early step's memory by what holds it (measure/memory.py); a Session's only
    precision_state: dict[str, Any]
    scaler_skips: int | None
    compile: dict[str, Any] | None
    # passive_threads and reuse_memory as this process has them: the proof, for a script the recipe reaches only
    # through the environment it started with (no Session, no framework adapter)
    process_switches: dict[str, bool]
    # the wrap switches as the DDP / FSDP2 wrapper the Session built has them ({} in one process: no wrapper)
    wrap_switches: dict[str, Any]
    # several ranks: every rank's own figures, their spread and the straggler (measure/ranks.py); None in one process
    ranks: dict[str, Any] | None
    batches: dict[str, Any] | None  # a command's run: what its batches are (instruments/batches.py)
    run_seconds: float
    process: dict[str, Any]        # its cores, threads, preemptions, faults (procstate.py)


@dataclass
class ScriptSaid:
    """What the script said: tf.report and its framework's evaluation (frameworks/board.py), the metric it declared,
    a Session's switches that could not act on its own loader (each with why), the settings a switch replaced, and
    each framework section by its name."""
    reported: dict[str, Any]
    declared_metric: Any
    unsupported: dict[str, Any]
    overridden: dict[str, Any]
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"reported": self.reported, "declared_metric": self.declared_metric, "unsupported": self.unsupported,
                "overridden": self.overridden, **self.sections}


@dataclass
class Keys:
    """A section that is already its keys (a curve's record)."""
    values: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.values


@dataclass
class RunRecord:
    """One run's record by section (the module docstring): each given once, by its one writer."""
    rate: Rate
    run: RunState
    script: ScriptSaid
    curve: Section
    task: Section | None = None
    data: Section | None = None
    observed: Section | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as the parent reads it: one flat object; a key written by two sections is refused."""
        out: dict[str, Any] = {}
        owner: dict[str, str] = {}
        for name in ("run", "rate", "script", "curve", "task", "data", "observed"):
            section = getattr(self, name)
            for key, value in (section.to_dict() if section is not None else {}).items():
                if key in owner:
                    raise RecordError(f"the run record's key {key!r} is written by both its {owner[key]} and its "
                                      f"{name} section")
                owner[key] = name
                out[key] = value
        return out


def run_record(probe, stopped: str, *, curve=None, task: Section | None = None,
               data: Section | None = None) -> dict[str, Any]:
    """Every measured number of a probe's run (agent.Probe; the ablation's per-run record), read when it is written.
    `curve`: the run's own curve where it keeps one (the built-in run's), else the probe's; `task` and `data`: the
    built-in run's sections (the module docstring)."""
    timing = probe.timing()
    observed = observed_section(probe)
    return RunRecord(rate_of(probe, timing), run_state(probe, stopped), script_said(probe),
                     Keys((curve if curve is not None else probe.curve).record()), task, data,
                     Keys(observed) if observed is not None else None).to_dict()


def rate_of(probe, timing) -> Rate:
    samples_known = any(s.samples for s in probe.timer.steps) or bool(probe.samples_per_step())
    tokens = probe.batches is not None and probe.batches.tokens is not None
    unit = probe.unit or ("tokens" if tokens else "samples" if samples_known else "steps")
    session = probe.session is not None
    return Rate(
        throughput=timing.throughput * probe.world_size,
        documents_per_s=documents_rate(probe, timing) if tokens else None,
        unit=unit,
        rate_unit=f"{unit}/s",
        timing=timing.to_dict(),
        steps_run=probe.timer.updates,
        steady_window=None if probe.whole_run else probe.steady_steps,
        whole_run=probe.whole_run,
        data_wait_fraction=(timing.data_wait_s / timing.seconds if timing.seconds else 0.0) if session else None,
        copy_fraction=(timing.copy_s / timing.seconds if timing.seconds else 0.0)
        if session and timing.copy_s is not None else None)


def run_state(probe, stopped: str) -> RunState:
    from ..measure import peak_memory_bytes

    session = probe.session
    state = session.state if session is not None else None
    scaler = getattr(probe, "scaler", None)              # a plain loop's fp16 loss scaler (scaler.py)
    precision = state.precision.metrics() if state else scaler.precision.metrics() if scaler and scaler.steps else {}
    return RunState(
        session=session is not None,
        mode=probe.spec.mode,
        stopped=stopped,
        seed=run_seed(session),
        num_workers=probe.loader.workers(),
        world_size=probe.world_size,
        peak_memory_bytes=peak_memory_bytes(probe.device or torch.device("cpu")),
        memory=state.memory.result() if state else None,
        precision_state=precision,
        scaler_skips=precision.get("skipped_steps"),
        compile=compile_counters(probe.compiles),
        process_switches=process_wide_in_effect(),
        wrap_switches=session.dist.wrap_state() if session is not None else {},
        ranks=probe.ranks,
        batches=probe.batches.to_dict() if probe.batches is not None else None,
        run_seconds=time.perf_counter() - probe.started,
        process=process_state())


def script_said(probe) -> ScriptSaid:
    session, sections = probe.session, probe.sections.values()
    return ScriptSaid(
        reported={**{k: v for s in sections for k, v in getattr(s, "metrics", {}).items()},
                  **(session.reported if session is not None else {})},
        declared_metric=next((s.declared for s in sections if getattr(s, "declared", None)), None),
        unsupported=session.unsupported() if session is not None else {},
        overridden={**({k: list(v) for k, v in session.overridden.items()} if session is not None else {}),
                    **{k: v for section in sections for k, v in section.overridden().items()}},
        sections={name: section.to_dict() for name, section in probe.sections.items()})


def documents_rate(probe, timing) -> float | None:
    """A token script's documents/s beside its tokens/s: the timed steps' documents per token times the rate
    (the steps after warm-up, as the rate's; its disturbed blocks' share alike)."""
    documents = probe.batches.step_documents(len(probe.timer.steps)) if probe.batches is not None else None
    if not documents or not timing.step_samples:
        return None
    timed = documents[timing.warmup_steps:timing.warmup_steps + len(timing.step_samples)]
    tokens = sum(timing.step_samples)
    return timing.throughput * sum(timed) / tokens * probe.world_size if tokens else None


def compile_counters(window: CompileWindow | None = None) -> dict[str, Any] | None:
    """torch.compile's graphs, graph breaks (with their first reasons) and frames compiled in this process;
    None when dynamo was never imported (nothing was compiled). With a run's `window`, its compiles, recompiles and
    recompile-limit hits beside them (instruments/recompiles.py: what the report says of a compiled rung)."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    breaks = counters.get("graph_break", {})
    counts = {"graphs": counters.get("stats", {}).get("unique_graphs", 0),
              "frames": counters.get("frames", {}).get("ok", 0),
              "graph_breaks": sum(breaks.values()),
              "break_reasons": [reason.splitlines()[0] for reason in list(breaks)[:5]]}
    run = window.read() if window is not None else None
    if run is not None:
        counts.update(run=run, recompiles=run["recompiles"], recompile_limit_hit=run["limit_hits"] > 0)
    return counts


def run_seed(session) -> int | None:
    """The seed this run was started with: its Session's, else the one the ablation gave its command (the
    run's recipe fields in its environment); None when neither says."""
    if session is not None:
        return session.recipe.seed
    from ..recipe import RecipeError, env_recipe_fields

    try:
        return env_recipe_fields().get("seed")
    except RecipeError:
        return None
