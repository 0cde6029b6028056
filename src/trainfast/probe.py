"""The probe: how a run measured by the ablation reports back (`trainfast ablate -- COMMAND`, and the
built-in ablation's runs, which are the same kind of run).

The ablation starts every run with TRAINFAST_MEASURE in its environment (JSON: where to write the result,
the mode, the timing budget) next to TRAINFAST_RECIPE (the rung's switches). In the run:

  - a script that creates a `trainfast.Session` is measured through it: the Session's StepTimer (one step =
    one optimizer update, its samples and data wait from the training loader given to setup()) and what the
    script passed to `tf.report(...)`;
  - a script that never creates a Session is measured from the outside: trainfast's sitecustomize (put on
    PYTHONPATH by the ablation) registers torch's global optimizer-step hook, so every optimizer.step() of
    any optimizer closes a step. Its rate is in steps/s (the samples of a step are unknown) and the result
    says `session: false`, so the ablation reports the rungs that need a Session as "no effect" instead of
    timing the same script again under another name.

Modes: "speed" stops the run once warm-up is over and the budget of steady steps is timed (every rank at
the same update: the decision is a collective at every CHECK_EVERY-th update); "full" lets the run end by
itself and writes the result at exit. Rank 0 writes the result file (atomically); a run that ends without
one (crashed before its first step, os._exit) is reported by the ablation with the tail of its log.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from .frameworks.hooks import when_imported
from .instruments.curve import ScriptCurve
from .instruments.recompiles import CompileWindow
from .measure.memory import StepMemory
from .procstate import process_state
from .techniques import apply_process_switches, process_wide_in_effect

MEASURE_ENV = "TRAINFAST_MEASURE"
PROCESS_SWITCHES = "process_switches"     # the result's key for the process-wide switches read back
WRAP_SWITCHES = "wrap_switches"           # the result's key for the wrap switches read back from DDP / FSDP2
PROBE_MODES = ("speed", "full")    # stop once the budget is timed, or let the run end by itself
CHECK_EVERY = 8          # updates between two speed-mode decisions (each a collective under torchrun)
MAX_BUDGETS = 4          # speed mode stops after this many times the steps first asked for, met or not


class MeasureError(ValueError):
    """TRAINFAST_MEASURE does not parse; names the variable and the value."""


@dataclass(frozen=True)
class MeasureSpec:
    result: str                  # where rank 0 writes the result (JSON)
    mode: str = "full"
    steps: int = 16              # the timing budget (ablate.TimingBudget)
    seconds: float = 60.0
    floor: int = 8
    min_seconds: float = 2.0
    # Full mode: the rate is that of the steps speed mode would have timed (warm-up excluded, the budget's steady
    # window), not of the whole run: a step later in the run that is not the training step's own cost (a
    # compiled model recompiling for the last, smaller batch: 20 s in one step of a 524-step run, which put a
    # rung whose steady steps were faster at 0.52x) stays out, and a rung timed to its end (to be judged on its
    # metric) measures the same rate as when it is stopped once timed. The run's whole time is its run_seconds.
    steady_window: bool = False
    # --target: the run records a point at each evaluation it reports (instruments/curve.py) and stops at the first
    # that reaches `target` (Target.to_dict(); auto before its level is known: no stop), or past `cap_seen` samples
    # seconds without reaching it.
    target: dict | None = None
    cap_seen: float | None = None

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "MeasureSpec | None":
        text = (os.environ if environ is None else environ).get(MEASURE_ENV)
        if not text:
            return None
        try:
            spec = cls(**json.loads(text))
        except (ValueError, TypeError) as exc:
            raise MeasureError(f"{MEASURE_ENV}={text!r} is not a measurement spec: {exc}") from None
        if spec.mode not in PROBE_MODES:
            raise MeasureError(f"{MEASURE_ENV}: mode {spec.mode!r} is not one of {', '.join(PROBE_MODES)}")
        return spec


class StopRun(SystemExit):
    """Speed mode: the budget is timed, the result written; the run ends here with exit status 0 (a
    SystemExit, so a script's `except Exception` does not swallow it; its `finally` blocks still run)."""

    def __init__(self) -> None:
        super().__init__(0)


class LoaderWorkers:
    """Loader worker processes beside the step: the Session's loader's count, or for a script without one the
    most multiprocessing children seen alive at its steps (DataLoader workers are; torch.compile's
    subprocess pool is not). What explains a wait-policy switch's effect (techniques/threads.py)."""

    def __init__(self) -> None:
        self.num_workers: int | None = None
        self.children_seen = 0

    def count_children(self) -> None:
        """A run whose loader count is unknown (no Session, or a Session without a loader): its children now."""
        if not isinstance(self.num_workers, int):
            self.children_seen = max(self.children_seen, len(multiprocessing.active_children()))

    def workers(self) -> int:
        """The run's loader worker processes (see the class docstring)."""
        self.count_children()
        return self.num_workers if isinstance(self.num_workers, int) else self.children_seen


class Probe:
    def __init__(self, spec: MeasureSpec) -> None:
        self.spec = spec
        self.session = None          # the Session that measures this run, once one is created
        self.timer = None            # its StepTimer, or the global hook's own
        self.device: torch.device | None = None
        self.check_disturbance = False
        self.written = False
        self.stopped_ranks = False               # speed mode stopped every rank of a torchrun job (StopRun)
        self.cap: int | None = None
        self.started = time.perf_counter()
        self.extra: dict[str, Any] = {}          # more numbers for the result (the built-in run's evaluation, metric)
        # More parts of the result, read when it is written: name -> (its value, the script settings it replaced)
        self.sections: dict[str, Any] = {}
        self.loader = LoaderWorkers()            # loader worker processes beside the step
        self.steady_steps: int | None = None     # full mode, steady_window: the steps speed mode would have timed
        self.batches = None                      # a command's run: what its batches are (instruments/batches.py)
        # This run's compiles and recompiles (instruments/recompiles.py), counted from when dynamo is imported:
        # now if the model is already compiled, else on the import (a run that never compiles never imports it).
        self.compiles = CompileWindow()
        self.curve = ScriptCurve(spec.target, spec.cap_seen)      # its evaluations on the way (--target)
        when_imported("torch._dynamo", lambda _module: self.compiles.open())

    # --- where steps come from ------------------------------------------------------------------------

    def _global_step(self, optimizer, args, kwargs) -> None:
        if self.session is not None:         # the Session times its own updates (O2 masters, fp16 skips)
            return
        if self.timer is None:               # no training forward was seen (a model that is not an nn.Module)
            self.training_began(device=next((p.device for g in optimizer.param_groups for p in g["params"]),
                                            torch.device("cpu")))
        self.timer.step()
        self.after_update()

    def training_began(self, module: torch.nn.Module | None = None, device: torch.device | None = None) -> None:
        """A script without a Session: its first training forward starts the step clock (BatchKind's on_start),
        so its first step (forward, backward, any compilation) is timed as a Session's first step is."""
        if self.session is None and self.timer is None:
            from .measure import StepTimer

            self.device = device or next((p.device for p in module.parameters()), torch.device("cpu"))
            self.timer = StepTimer(self.device)
            self.check_disturbance = self.device.type == "cpu"      # a framework's script, judged as any run

    def attach(self, session) -> None:
        """Called by Session() in a measured run; its setup() then hands over the step timer (watch)."""
        self.session = session

    def watch(self, state, num_workers: int | None) -> None:
        """The Session's TrainState: its timer is the run's clock, its updates drive speed mode. Disturbance
        (other processes using the CPU, see measure.Timing) is judged on the CPU, the run's own loader workers and
        ranks counted as its own (measure.JobCPU); on a GPU its timeline is the clock and nothing is left out."""
        self.timer = state.timer
        self.device = state.precision.device
        self.loader.num_workers = num_workers
        self.check_disturbance = self.device.type == "cpu"
        state.after_update = self.after_update
        state.memory = StepMemory(self.device, optimizer=state.optimizer.optimizer)   # what holds the memory

    def reported(self, metrics: dict[str, Any]) -> None:
        """The script evaluated (tf.report, a framework's evaluation): a point of its curve; past its cap without
        the target the run ends here, its result written (one process: a torchrun job's ranks report unevenly, so
        it runs to its own end)."""
        if self.curve.add(self, metrics) and self.world_size == 1:
            self.write(f"target: {self.curve.stopped}")
            raise StopRun()

    # --- speed mode ----------------------------------------------------------------------------------

    @property
    def whole_run(self) -> bool:
        """A script fed token ids is timed over its whole run, every step after warm-up to its end, in either mode.
        Its steps' work varies with the lengths of the documents they hold, and length grouping or packing changes
        which steps hold which: a window of steady steps would time whichever batches it happened to hold (a
        grouped rung's rate moved 105-215 tokens/s between repeats of the same command). The whole run is the same
        documents in every rung and every repeat, so its rate depends on the switch alone. Its warm-up is found on
        the seconds per token (Timing: per_sample)."""
        return self.batches is not None and self.batches.tokens is not None

    def after_update(self) -> None:
        if self.batches is not None:
            self.batches.step()                  # a token script's tokens of this step (instruments/batches.py)
        if self.timer.updates % CHECK_EVERY:
            return
        self.loader.count_children()
        if self.whole_run:
            return
        if self.spec.mode != "speed":
            if self.spec.steady_window and self.steady_steps is None and self.steps_needed(collective=False) == 0:
                self.steady_steps = len(self.timer.steps)
            return
        need = self.steps_needed()
        # A run whose steps never settle, or whose blocks keep being disturbed, stops at a cap set by the
        # first count: MAX_BUDGETS times what it asked for then.
        self.cap = self.cap or self.timer.updates + MAX_BUDGETS * max(need, self.spec.steps)
        if need == 0 or self.timer.updates >= self.cap:
            self.write("speed budget timed" if need == 0 else "step cap reached before the budget was timed")
            # Every rank leaves together, after rank 0 has written: no rank tears its process group down
            # while another still works (a CI run once lost a rank at this point, exit status 1).
            self.agree_max(0)
            self.stopped_ranks = self.world_size > 1
            raise StopRun()

    def steps_needed(self, collective: bool = True) -> int:
        """More steps this run needs for its timing budget: the most any rank needs (a collective), or this
        rank's (`collective` False: full mode, where no rank stops and only rank 0's window is written)."""
        from .measure import steps_to_time

        spec = self.spec
        need = steps_to_time(self.timing(), spec.steps, spec.seconds, spec.floor, spec.min_seconds)
        return self.agree_max(need) if collective else need

    def agree_max(self, value: int) -> int:
        if self.session is not None:
            return max(self.session.dist.gather(value))
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return value
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        tensor = torch.tensor([value], device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    # --- the result ------------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        if self.session is not None:
            return self.session.world_size
        return int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def is_main(self) -> bool:
        if self.session is not None:
            return self.session.is_main
        return os.environ.get("RANK", "0") == "0"

    def samples_per_step(self) -> int | None:
        """A script without a Session: the samples of one optimizer step where a section knows them (a framework's
        batch size times its accumulation steps), else None (its rate is then in steps/s)."""
        known = [s.samples_per_step for s in self.sections.values() if getattr(s, "samples_per_step", None)]
        return known[0] if known else None

    def timing(self):
        from .measure import Timing

        self.timer.read()
        steps = self.timer.steps
        tokens = self.batches.step_tokens(len(steps)) if self.batches is not None else None
        if tokens is not None:                                # token ids: the rate in tokens, whatever a row holds
            steps = [dataclasses.replace(s, samples=n) for s, n in zip(steps, tokens)]
        steps = steps[:self.steady_steps] if self.steady_steps and not self.whole_run else steps
        if steps and not any(s.samples for s in steps):      # samples unknown: one "sample" per step
            steps = [dataclasses.replace(s, samples=self.samples_per_step() or 1) for s in steps]
        return Timing.from_steps(steps, check_disturbance=self.check_disturbance, per_sample=self.whole_run)

    def documents_rate(self, timing) -> float | None:
        """A token script's documents/s beside its tokens/s: the timed steps' documents per token times the rate
        (the steps after warm-up, as the rate's; its disturbed blocks' share alike)."""
        documents = self.batches.step_documents(len(self.timer.steps)) if self.batches is not None else None
        if not documents or not timing.step_samples:
            return None
        timed = documents[timing.warmup_steps:timing.warmup_steps + len(timing.step_samples)]
        tokens = sum(timing.step_samples)
        return timing.throughput * sum(timed) / tokens * self.world_size if tokens else None

    def result(self, stopped: str) -> dict[str, Any]:
        """Every measured number of this run (the ablation's per-run record): run_record."""
        return run_record(self, stopped)

    def write(self, stopped: str) -> None:
        if self.written or not self.is_main:
            self.written = True
            return
        self.written = True
        from .checkpoint import atomic_write_text

        atomic_write_text(self.spec.result, json.dumps(self.result(stopped), default=str))

    def at_exit(self) -> None:
        """Full mode (or a speed run that ended before its budget): the result as the run ends. A process that
        never stepped (a DataLoader worker, the torchrun launcher) writes nothing. Registered before the
        script ran, so it runs after every other exit handler: the last chance to let a process group's
        workers finish (a script that opened its own group and never closes it)."""
        if not self.written and self.timer is not None and self.timer.updates:
            try:
                self.write("script ended")
            except Exception as exc:        # at exit nothing else can report it
                print(f"trainfast: could not write the measurement {self.spec.result}: {exc}", file=sys.stderr)
        from .distributed import drain_collectives

        drain_collectives()
        if self.stopped_ranks:
            # Every exit handler has run (this one was registered first) and the result is written. The
            # interpreter's own shutdown is skipped: a gloo worker still freeing the stop agreement's tensors
            # needs the GIL, which finalization no longer gives, and the rank aborted (exit -6, seen in CI).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def run_record(probe: Probe, stopped: str) -> dict[str, Any]:
    """Every measured number of a probe's run (the ablation's per-run record), read when the probe writes it."""
    from .measure import peak_memory_bytes

    timing = probe.timing()
    samples_known = any(s.samples for s in probe.timer.steps) or bool(probe.samples_per_step())
    tokens = probe.batches is not None and probe.batches.tokens is not None
    unit = "tokens" if tokens else "samples" if samples_known else "steps"
    session = probe.session
    precision = session.state.precision.metrics() if session is not None and session.state else {}
    return {
        "session": session is not None,
        "mode": probe.spec.mode,
        "stopped": stopped,
        # Ranks step in lockstep (gradient all-reduce), so the job's rate is world_size x one rank's.
        "throughput": timing.throughput * probe.world_size,
        "documents_per_s": probe.documents_rate(timing) if tokens else None,   # beside a token script's tokens/s
        # What the rate counts: a token script's tokens (instruments/batches.py), else a step's samples where they
        # are known, else steps (a script without a Session whose framework does not say its batch); the built-in
        # run's record says its task's (extra).
        "unit": unit,
        "rate_unit": f"{unit}/s",
        "seed": run_seed(session),            # the run's name in the report's notes
        "timing": timing.to_dict(),
        "steps_run": probe.timer.updates,
        "steady_window": None if probe.whole_run else probe.steady_steps,  # full mode: the steps timed (None: all)
        "whole_run": probe.whole_run,            # timed over every step after warm-up (Probe.whole_run)
        "num_workers": probe.loader.workers(),
        # Only a Session's loader times the wait for each batch; the global hook sees optimizer steps alone.
        "data_wait_fraction": (timing.data_wait_s / timing.seconds if timing.seconds else 0.0)
        if session is not None else None,
        # CUDA: the batches' copy and preparation on the compute stream, apart from the wait (measure.InputSpan)
        "copy_fraction": (timing.copy_s / timing.seconds if timing.seconds else 0.0)
        if session is not None and timing.copy_s is not None else None,
        "peak_memory_bytes": peak_memory_bytes(probe.device or torch.device("cpu")),
        # One early step's memory by what holds it (measure/memory.py); a Session's run only
        "memory": session.state.memory.result() if session is not None and session.state else None,
        "world_size": probe.world_size,
        "precision_state": precision,
        "scaler_skips": precision.get("skipped_steps"),
        "compile": compile_counters(probe.compiles),
        # passive_threads and reuse_memory as this process has them: the proof, for a script the recipe
        # reaches only through the environment it started with (no Session, no framework adapter)
        PROCESS_SWITCHES: process_wide_in_effect(),
        # the wrap switches as the DDP / FSDP2 wrapper the Session built has them ({} in one process: no wrapper)
        WRAP_SWITCHES: session.dist.wrap_state() if session is not None else {},
        # What the script reported: tf.report, and the evaluation its framework computed (frameworks/board.py)
        "reported": {**{k: v for s in probe.sections.values() for k, v in getattr(s, "metrics", {}).items()},
                     **(session.reported if session is not None else {})},
        "declared_metric": next((s.declared for s in probe.sections.values() if getattr(s, "declared", None)),
                                None),
        # a Session's switches that could not act on the script's own loader, each with why
        "unsupported": session.unsupported() if session is not None else {},
        "overridden": {**({k: list(v) for k, v in session.overridden.items()} if session is not None else {}),
                       **{k: v for section in probe.sections.values() for k, v in section.overridden().items()}},
        **{name: section.to_dict() for name, section in probe.sections.items()},
        "batches": probe.batches.to_dict() if probe.batches is not None else None,
        "run_seconds": time.perf_counter() - probe.started,
        "process": process_state(),        # its cores, threads, preemptions, faults (procstate.py)
        **probe.curve.record(),            # --target: its evaluations on the way (instruments/curve.py)
        **probe.extra,
    }


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


_PROBE: Probe | None = None
_LOADED = False


def current() -> Probe | None:
    """This process's probe when the ablation measures it (TRAINFAST_MEASURE is set), else None."""
    global _PROBE, _LOADED
    if not _LOADED:
        _LOADED = True
        spec = MeasureSpec.from_env()
        if spec is not None:
            _PROBE = Probe(spec)
            atexit.register(_PROBE.at_exit)
    return _PROBE


def install() -> None:
    """What trainfast's sitecustomize calls in a measured run: the probe, told about every Session the script
    creates (observers.py), with its global optimizer hook for a script that creates none."""
    probe = current()
    if probe is not None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from .instruments.batches import BatchKind
        from .observers import observe_sessions

        observe_sessions(probe)
        register_optimizer_step_post_hook(probe._global_step)
        # The task the script's batches are (its ladder, ablation/work.py); its first training forward
        probe.batches = BatchKind(on_start=probe.training_began)
        apply_command_switches()


def apply_command_switches() -> None:
    """The run's process switches, set in the command's process as soon as it starts (torch is loaded here): a
    script with neither a Session nor a framework adapter gets them too, and a library-wide flag with no variable
    to start with (fp32 matmuls in a reduced type) reaches it. A script that changes one back is caught by the
    read-back at its end."""
    from .recipe import RecipeError, env_recipe_fields

    try:
        fields = env_recipe_fields()
    except RecipeError:
        return                             # the Session, if there is one, says what is wrong with it
    apply_process_switches(fields, warn=False)


def run_seed(session) -> int | None:
    """The seed this run was started with: its Session's, else the one the ablation gave its command (the
    run's recipe fields in its environment); None when neither says."""
    if session is not None:
        return session.recipe.seed
    from .recipe import RecipeError, env_recipe_fields

    try:
        return env_recipe_fields().get("seed")
    except RecipeError:
        return None
