"""World size as a rung (`ablate --nproc 1,2`): the same ladder at each process count, side by side.

Each size is a ladder of its own (loop.LadderRun: its plan, its run store, its repeats, settling and seeds), in its own
folder (the smallest size's is the report folder itself, each other size's `nproc-N/` in it), and the ladders run
interleaved, one run of each in turn, as the repeats of one ladder are: a slow spell of the machine falls on every size
alike. With --target, the smallest size's baseline runs first: `auto` becomes its level, and every other size is then
aimed at that same level, so that the times to target compare (a larger world at the same batch per process has a
larger global batch: another math, judged on time to target). scaling.py turns the ladders into the efficiency and
the time to target per size; the report folder's results.json (`settings.world`), report.md and the console carry it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

from ..recipe import RecipeError
from ..results import AblationResult, Rung
from .loop import LadderOptions, LadderRun, conclude
from .scaling import scaling
from .store import default_out_dir
from .work import Work

Ladder = Callable[[int], tuple[list[Rung], Work, dict[str, Any]]]     # a size -> its plan, work and settings


class Prefixed:
    """A console's stream with every line it writes prefixed (the ladders of several sizes share one terminal)."""

    def __init__(self, stream, prefix: str) -> None:
        self.stream, self.prefix, self.at_start = stream, prefix, True

    def write(self, text: str) -> int:
        for piece in text.splitlines(keepends=True):
            self.stream.write((self.prefix if self.at_start else "") + piece)
            self.at_start = piece.endswith("\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:        # plain lines: two live tables cannot share a terminal
        return False


def folder_of(out_dir: Path, nproc: int, smallest: int) -> Path:
    return out_dir if nproc == smallest else out_dir / f"nproc-{nproc}"


def check_devices(work: Work, sizes: tuple[int, ...]) -> None:
    """One GPU per process: a size above the GPUs this process sees is refused before any run."""
    if work.dev.type != "cuda":
        return
    import torch

    if max(sizes) > torch.cuda.device_count():
        raise RecipeError(f"--nproc {','.join(map(str, sizes))}: {max(sizes)} processes need {max(sizes)} GPUs and "
                          f"this machine shows {torch.cuda.device_count()}")


class WorldRun:
    """The ladders of every size, run interleaved (module docstring); `run()` returns the smallest size's result, its
    settings' `world` the sizes side by side."""

    def __init__(self, sizes: tuple[int, ...], ladder_at: Ladder, out: str | Path | None,
                 options: LadderOptions) -> None:
        self.sizes, self.ladder_at, self.opts = tuple(sorted(sizes)), ladder_at, options
        self.out_dir = Path(out) if out is not None else default_out_dir()
        self.runs: dict[int, tuple[LadderRun, Any]] = {}
        self.done: set[int] = set()

    def start(self, nproc: int, stack: contextlib.ExitStack) -> None:
        """The size's ladder opened, aimed at the smallest size's target; its lines prefixed with its size."""
        from rich.console import Console

        plan, work, settings = self.ladder_at(nproc)
        smallest = nproc == self.sizes[0]
        budget = self.opts.time_budget_s / len(self.sizes) if self.opts.time_budget_s else None
        options = dataclasses.replace(self.opts, target=self.target(), time_budget_s=budget,
                                      track=self.opts.track if smallest else ())
        run = LadderRun(plan, work, {**settings, "world_sizes": list(self.sizes)},
                        folder_of(self.out_dir, nproc, self.sizes[0]), options)
        console = Console(file=Prefixed(sys.stdout, f"[nproc {nproc}] "))
        self.runs[nproc] = (run, stack.enter_context(run.open(console)))

    def target(self):
        """The target every size is aimed at: the smallest size's, resolved (auto) once its baseline has run."""
        if not self.runs or self.opts.target is None:
            return self.opts.target
        aim = self.runs[self.sizes[0]][0].aim
        return aim.target if aim is not None else self.opts.target

    def ready(self, nproc: int) -> bool:
        """A larger size starts once the target it is aimed at is known (or the smallest size ended without one)."""
        target = self.target()
        return target is None or target.known or self.sizes[0] in self.done

    def step_all(self, stack: contextlib.ExitStack) -> bool:
        """One run of every ladder with runs left, smallest size first; False once none has any."""
        for nproc in self.sizes:
            if nproc not in self.runs and self.ready(nproc):
                self.start(nproc, stack)
        stepped = False
        for nproc, (run, display) in sorted(self.runs.items()):
            if nproc in self.done:
                continue
            if run.step(display):
                stepped = True
            else:
                self.done.add(nproc)
        return stepped or len(self.runs) < len(self.sizes)

    def run(self) -> AblationResult:
        interrupted = False
        with contextlib.ExitStack() as stack:
            self.start(self.sizes[0], stack)
            try:
                while self.step_all(stack):
                    pass
            except KeyboardInterrupt:
                interrupted = True
            for run, _ in self.runs.values():
                run.wind_up(interrupted)
            results = {}
            world = self.summary()
            for nproc, (run, display) in sorted(self.runs.items(), reverse=True):   # the smallest, with the world, last
                if nproc == self.sizes[0]:
                    run.settings["world"] = world
                try:
                    results[nproc] = conclude(run, display, interrupted)
                except KeyboardInterrupt:
                    pass
        if interrupted:
            raise KeyboardInterrupt
        self.show(results[self.sizes[0]])
        return results[self.sizes[0]]

    def summary(self) -> dict[str, Any]:
        """scaling.py's figures, with each size's folder (relative to the report folder)."""
        aim = self.runs[self.sizes[0]][0].aim
        world = scaling({n: run.plan for n, (run, _) in self.runs.items()}, aim.target if aim else None,
                        self.opts.min_effect)
        for entry in world["by_size"]:
            entry["folder"] = str(folder_of(Path("."), entry["nproc"], self.sizes[0]))
        world["not_run"] = [n for n in self.sizes if n not in self.runs]
        return world

    def show(self, result: AblationResult) -> None:
        if not self.opts.show:
            return
        from rich.console import Console

        from ..report.world import console_table

        console = Console()
        if not console.is_terminal:         # piped or logged: wide enough that the table is not wrapped
            console = Console(width=max(console.width, 230))
        console.print(console_table(result))


def ablate_sizes(sizes: tuple[int, ...], ladder_at: Ladder, out: str | Path | None,
                 options: LadderOptions) -> AblationResult:
    """The ladder `ladder_at` makes for each size, measured side by side (WorldRun)."""
    return WorldRun(sizes, ladder_at, out, options).run()
