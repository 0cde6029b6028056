"""The agent in a measured run: the Probe times the run's steps in its own process (the Session's StepTimer, or
torch's global optimizer-step hook for a script without one), decides when speed mode has timed enough, and hands
its numbers to the record (record.py) that the contract (contract.py) writes for the parent.

  - a script that creates a `trainfast.Session` is measured through it: the Session's StepTimer (one step =
    one optimizer update, its samples and data wait from the training loader given to setup()) and what the
    script passed to `tf.report(...)`;
  - a script that never creates a Session is measured from the outside: trainfast's sitecustomize (bootstrap.py,
    put on PYTHONPATH by the ablation) registers torch's global optimizer-step hook, so every optimizer.step() of
    any optimizer closes a step. Its rate is in steps/s (the samples of a step are unknown) and the result
    says `session: false`, so the ablation reports the rungs that need a Session as "no effect" instead of
    timing the same script again under another name.

Speed mode stops the run once warm-up is over and the budget of steady steps is timed (every rank at the same
update: the decision is a collective at every CHECK_EVERY-th update); full mode lets the run end by itself.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from typing import Any

import torch

from ..frameworks.hooks import when_imported
from ..instruments.curve import ScriptCurve
from ..instruments.recompiles import CompileWindow
from ..measure.memory import StepMemory
from .contract import MeasureSpec, StopRun, write_result
from .ranks import agree_max, collect_ranks, start_phases
from .record import run_record

CHECK_EVERY = 8          # updates between two speed-mode decisions (each a collective under torchrun)
MAX_BUDGETS = 4          # speed mode stops after this many times the steps first asked for, met or not


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


class OtherPasses:
    """The steps in which a pass over another loader than the training one began: a script's evaluation between two
    training steps, left out of the training rate (measure.Timing). Called by the observer as each pass begins; the
    training loader is the one it saw iterated last at the first training forward."""

    def __init__(self, probe: "Probe") -> None:
        self.probe = probe
        self.steps: list[int] = []

    def __call__(self, loader) -> None:
        probe = self.probe
        trained = probe.observer.loader if probe.observer is not None else None
        if probe.timer is not None and trained is not None and loader is not trained:
            self.steps.append(probe.timer.updates)


def step_seconds(timer) -> float:
    """Seconds the run's steps have taken so far, as its step clock reads them (a GPU's timeline there)."""
    timer.read()
    return sum(step.seconds for step in timer.steps)


@dataclasses.dataclass(frozen=True)
class StepCap:
    """Where speed mode stops a run that does not meet its timing budget (steps that never settle, blocks that keep
    being disturbed): past MAX_BUDGETS times the steps the first count asked for, and no sooner than MAX_BUDGETS
    times the seconds the budget asks for at least. The seconds matter for millisecond steps: the first count holds
    the run's slower first steps, which make the steps needed look few (3 ms steps were once cut at 120, 0.4 s)."""
    updates: int
    seconds: float

    @classmethod
    def first_count(cls, timer, need: int, spec: MeasureSpec) -> "StepCap":
        return cls(timer.updates + MAX_BUDGETS * max(need, spec.steps),
                   step_seconds(timer) + MAX_BUDGETS * spec.min_seconds)

    def reached(self, timer) -> bool:
        return timer.updates >= self.updates and step_seconds(timer) >= self.seconds


class Probe:
    def __init__(self, spec: MeasureSpec) -> None:
        self.spec = spec
        self.session = None          # the Session that measures this run, once one is created
        self.timer = None            # its StepTimer, or the global hook's own
        self.device: torch.device | None = None
        self.check_disturbance = False
        self.written = False
        self.stopped_ranks = False               # speed mode stopped every rank of a torchrun job (StopRun)
        self.cap: StepCap | None = None          # speed mode's stop when the budget is not met
        self.started = time.perf_counter()
        self.unit: str | None = None             # what the rate counts, where the run declares it (record.Rate)
        self.sections: dict[str, Any] = {}       # more parts of the result, read when it is written
        self.loader = LoaderWorkers()            # loader worker processes beside the step
        self.steady_steps: int | None = None     # full mode, steady_window: the steps speed mode would have timed
        self.batches = None                      # a command's run: what its batches are (instruments/batches.py)
        self.phases = self.ranks = None          # several ranks: this one's phases, then every rank's (ranks.py)
        # This run's compiles and recompiles (instruments/recompiles.py), counted from when dynamo is imported:
        # now if the model is already compiled, else on the import (a run that never compiles never imports it).
        self.compiles = CompileWindow(lambda: self.timer.updates if self.timer is not None else None)
        self.curve = ScriptCurve(spec.target, spec.cap_seen)      # its evaluations on the way (--target)
        self.observer = None                     # a script's run: what it was seen doing (observe.py)
        self.injected: set[str] | None = None    # a plain loop: the fields trainfast switched in it (inject.py)
        self.other_passes = OtherPasses(self)    # steps in which another loader's pass began (an evaluation)
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
            from ..measure import StepTimer

            self.device = device or next((p.device for p in module.parameters()), torch.device("cpu"))
            self.timer = StepTimer(self.device)
            self.check_disturbance = self.device.type == "cpu"      # a framework's script, judged as any run
            self.phases = start_phases(self, module)

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
        self.phases = start_phases(self, state.forward, lambda: state.timer is self.timer)
        state.memory = StepMemory(self.device, optimizer=state.optimizer.optimizer)   # what holds the memory

    def closing(self) -> None:
        """The Session closes its process group: every rank's figures are gathered now, while it is open."""
        collect_ranks(self)

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
        if self.phases is not None:
            self.phases.close_step()             # this rank's forward and optimizer seconds of the step
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
        self.cap = self.cap or StepCap.first_count(self.timer, need, self.spec)
        # Each rank reads its own step clock: the ranks agree (a collective), and any one past the cap stops all.
        if need == 0 or agree_max(self, int(self.cap.reached(self.timer))):
            collect_ranks(self)                  # every rank is here, at the same update
            self.write("speed budget timed" if need == 0 else "step cap reached before the budget was timed")
            # Every rank leaves together, after rank 0 has written: no rank tears its process group down
            # while another still works (a CI run once lost a rank at this point, exit status 1).
            agree_max(self, 0)
            self.stopped_ranks = self.world_size > 1
            raise StopRun()

    def steps_needed(self, collective: bool = True) -> int:
        """More steps this run needs for its timing budget: the most any rank needs (a collective), or this
        rank's (`collective` False: full mode, where no rank stops and only rank 0's window is written)."""
        from ..measure import steps_to_time

        spec = self.spec
        need = steps_to_time(self.timing(), spec.steps, spec.seconds, spec.floor, spec.min_seconds)
        return agree_max(self, need) if collective else need

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
        from ..measure import Timing

        self.timer.read()
        steps = self.timer.steps
        tokens = self.batches.step_tokens(len(steps)) if self.batches is not None else None
        if tokens is not None:                                # token ids: the rate in tokens, whatever a row holds
            steps = [dataclasses.replace(s, samples=n) for s, n in zip(steps, tokens)]
        steps = steps[:self.steady_steps] if self.steady_steps and not self.whole_run else steps
        if steps and not any(s.samples for s in steps):      # samples unknown: one "sample" per step
            steps = [dataclasses.replace(s, samples=self.samples_per_step() or 1) for s in steps]
        return Timing.from_steps(steps, check_disturbance=self.check_disturbance, per_sample=self.whole_run,
                                 compiles=self.compiles.steps, other_passes=self.other_passes.steps)

    def result(self, stopped: str) -> dict[str, Any]:
        """Every measured number of this run (the ablation's per-run record): run_record."""
        return run_record(self, stopped)

    def write(self, stopped: str) -> None:
        if self.written or not self.is_main:
            self.written = True
            return
        self.written = True
        write_result(self.spec, self.result(stopped))
