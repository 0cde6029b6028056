"""What the doctor is doing, and the time left: its passes counted in steps done of planned, each kind of step
priced by the steps of that kind measured so far (report/progress.py's RunPlan, shown by report/runsbar.py as
ablate's runs are: a bar on a terminal, plain lines elsewhere).

The built-in run's steps are known one by one (the StepTimer's entries, after each pass); a script's are read from
the progress file its watched process writes (script.py), at most twice a second. A step of a kind not run yet
costs what the steps so far cost; the first step (start-up, compilation: ten to a hundred steady steps) is counted
without a price (FIRST), so it prices no other. What is not a step (the evaluation, the FLOPs count) is priced by
its own time once done.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Iterable, Iterator


FIRST = "first step"


class DoctorProgress:
    """The doctor's plan of steps and its display; `with` it around the passes."""

    def __init__(self, console=None, show: bool = True) -> None:
        from rich.console import Console

        from ..report.progress import RunPlan
        from ..report.runsbar import RunsBar

        self.bar = RunsBar(RunPlan(noun="steps"), console or Console(stderr=False), show)

    def __enter__(self) -> "DoctorProgress":
        self.bar.open()
        return self

    def __exit__(self, *exc) -> bool:
        self.bar.close()
        return False

    @property
    def runs(self):
        return self.bar.runs

    def plan(self, phases: Iterable[tuple[str, int]], why: str | None = None) -> None:
        """The steps still to come, as (kind, how many) in order."""
        self.bar.plan([kind for kind, n in phases for _ in range(n)], why)

    def start(self, what: str) -> None:
        self.bar.start(what)

    def steps(self, kind: str, seconds: Iterable[float]) -> None:
        """Steps of `kind` done, each after its seconds (the first step: counted, not priced)."""
        for s in seconds:
            self.bar.runs.finished(kind, None if kind == FIRST else s)
        self.bar.refresh()

    @contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        """What runs inside is one step of `kind`, priced by its own time; nothing counted if none is planned."""
        started = time.monotonic()
        yield
        if kind in self.bar.runs.planned:
            self.steps(kind, [time.monotonic() - started])

    def note(self, text: str) -> None:
        if self.bar.show:
            self.bar.console.print(text, markup=False, highlight=False)


class Silent(DoctorProgress):
    """No display (the Python API's observers, a test): the same calls, nothing shown."""

    def __init__(self) -> None:
        import io

        from rich.console import Console

        super().__init__(Console(file=io.StringIO()), show=False)


# --- a script's steps, from the process that runs it ------------------------------------------------------------
WRITE_EVERY_S = 0.5     # the watched script writes its step count at most this often: one clock read per step else


def write_steps(watch, path: str) -> None:
    """In the watched script (rank 0): its steps so far written to `path` (JSON: how many, when the first and the
    last ended, from the watch's start), at its first step and then at most every WRITE_EVERY_S; nothing once its
    watched steps are over (the observations written then say so). A write costs about 0.1 ms, once per half a
    second of steps: well inside a step's own noise."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from ..checkpoint import atomic_write_text

    last = [-WRITE_EVERY_S]

    def hook(optimizer, args, kwargs) -> None:        # after the Watch's own hook: its count is this step's
        now, ends = time.perf_counter(), watch.clock.step_ends
        if watch.stopped or not ends or (now - last[0] < WRITE_EVERY_S and len(ends) > 1):
            return
        last[0] = now
        try:
            atomic_write_text(path, json.dumps({"steps": len(ends), "first_end_s": ends[0] - watch.t0,
                                                "last_end_s": ends[-1] - watch.t0}))
        except OSError:                   # the doctor's display is not worth a failed run
            pass

    register_optimizer_step_post_hook(hook)


class ScriptSteps:
    """The parent's side: the steps the script wrote (write_steps), read at each poll of the waiting loop and told
    to the display, each priced by the script's own clock: the first step (the script's start-up with it) by when
    it ended, every later one by the time between the last steps read."""

    def __init__(self, progress: DoctorProgress, path, result, eval_within: float) -> None:
        self.progress, self.path, self.result, self.eval_within = progress, path, result, eval_within
        self.seen, self.last_end, self.per_step, self.over = 0, 0.0, None, False

    def poll(self) -> None:
        if self.over:
            return
        try:
            read = json.loads(self.path.read_text())
        except (OSError, ValueError):
            read = None
        if read is not None and read["steps"] > self.seen:
            self.add(read["steps"], read["first_end_s"], read["last_end_s"])
        if self.result.is_file():         # its watched steps are over: the rest of them done, at the last price
            self.over = True
            for kind in list(self.progress.runs.planned):
                self.progress.steps(kind, [self.per_step])
            if self.eval_within > 0:
                self.progress.start(f"the script kept going for its first evaluation (untimed, up to "
                                    f"{self.eval_within:.0f} s)")

    def add(self, steps: int, first_end: float, last_end: float) -> None:
        if self.seen == 0:
            self.progress.steps(FIRST, [first_end])
            self.progress.start("the script's steps, watched (syncs, shapes, gradients), then timed")
            self.seen, self.last_end = 1, first_end
        if steps > self.seen:
            self.per_step = (last_end - self.last_end) / (steps - self.seen)
            self.progress.steps("step", [self.per_step] * (steps - self.seen))
            self.seen, self.last_end = steps, last_end
