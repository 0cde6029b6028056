"""The terminal while an ablation runs: a live table of the rungs, a bar of the runs done of those planned with the
time left (progress.RunPlan), and a progress bar for the running one; then the final table and the
recommendation. Not on a terminal: today's plain lines, each run's with its "n of m runs, ~T left"."""
from __future__ import annotations

from typing import Any

from ..results import AblationResult, Rung
from .format import roofs_text, rung_label
from .progress import RunPlan, time_line
from .runsbar import RunsBar
from .summary import best_line, keep_line, machine_line, repeatability_line
from .table import Columns, headers, table_rows
from .target import console_table


class Display:
    """A rich live table plus a progress bar for the running rung; plain lines when not on a terminal."""

    def __init__(self, rungs: list[Rung], ceilings: dict[str, float], env: dict[str, Any], show: bool = True,
                 settings: dict[str, Any] | None = None, runs: RunPlan | None = None, console=None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.rungs, self.ceilings, self.env, self.show, self.settings = rungs, ceilings, env, show, settings or {}
        self.metric: dict[str, Any] | None = None  # the judged metric, once the runs have shown it (the loop sets it)
        self.runs = runs or RunPlan()        # the ladder's runs: done, planned, the time left (the loop feeds it)
        self.console = console or Console()
        if not self.console.is_terminal:
            # Piped or logged: no live redraws, and wide enough that the final table is not wrapped.
            self.console = Console(file=console.file if console is not None else None,
                                   width=max(self.console.width, 230))
        self.progress_bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=self.console)
        # The whole ladder: runs done of planned and the time left, as the doctor shows its steps (runsbar.py)
        self.bar = RunsBar(self.runs, self.console, show, describe=False)
        self.task = None
        self.live = None

    def _render(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"trainfast ablate — {self.env['device_name']} ({self.env['device']})")
        columns = Columns.for_settings(self.settings, self.rungs, self.metric)
        for h in headers(columns):
            table.add_column(h, justify="left" if h == "rung" else "right")
        for row in table_rows(self.rungs, columns):
            table.add_row(*row)
        return Group(table, self.bar.progress, self.progress_bar)

    def __enter__(self):
        from rich.live import Live

        if self.show:
            ceil = roofs_text(self.ceilings, self.settings, sep=": ")
            self.console.print(f"[bold]measured matmul peak[/bold] {ceil} (measured again after the ladder, the "
                               "higher kept: a busy start does not lower the roof the report uses)")
            if self.console.is_terminal:
                # Once a second: the table changes once a run, the bar once a metric window. At 4 refreshes a
                # second the display took 2.5% of a core from the runs it times (0.2% without a terminal).
                self.live = Live(self._render(), console=self.console, refresh_per_second=1)
                self.live.__enter__()
        self.bar.printing = self.show and self.live is None
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(*exc)
        return False

    def start_rung(self, rung: Rung, seed: int, run: int = 1, runs: int = 1) -> None:
        if self.task is not None:
            self.progress_bar.remove_task(self.task)
        # A command's first baseline run: whether a recipe reaches it (and so its precision) is known only after it.
        label = ("baseline" if rung.name == "baseline" and not rung.repeats and "command" in self.settings
                 else rung_label(rung))
        what = f"{label} — seed {seed}, run {run} of {runs}"
        self.task = self.progress_bar.add_task(what, total=None, loss="…")
        self.bar.start(what)
        self.update()

    def plan(self, kinds: list[str], why: str | None = None) -> None:
        """The runs still planned (progress.RunPlan.plan); a change in their number is said, with why."""
        self.bar.plan(kinds, why)
        self.update()

    def finished(self, kind: str, seconds: float | None, repeat_s: float | None = None) -> None:
        self.bar.finished(kind, seconds, repeat_s)
        self.update()

    def reused(self, rung: Rung, repeat: int) -> None:
        if self.show:
            self.console.print(f"reused {rung_label(rung)}, run {repeat + 1} (measured before in this folder: read "
                               "back, not run again)")

    def note(self, text: str) -> None:
        """Something the loop did that the runs line does not say (a run's rate not a measurement)."""
        if self.show:
            self.console.print(text, markup=False, highlight=False)

    def progress(self, rung: Rung, event: dict) -> None:
        self.progress_bar.update(self.task, completed=event["step"], total=event["total"], loss=f"{event['loss']:.3f}")
        self.update()

    def update(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def final(self, result: AblationResult, interrupted: bool = False) -> None:
        if not self.show:
            return
        self.metric = result.metric
        if self.live is None:
            self.console.print(self._render().renderables[0])
        if interrupted:
            done = sum(len(r.repeats) for r in result.rungs)
            self.console.print(f"[bold]interrupted[/bold]: {done} run(s) finished; partial report in "
                               f"{result.out_dir}/; continue with the same command and --resume")
            return
        to_target = console_table(result)             # --target: time to target beside the rate
        if to_target is not None:
            self.console.print(to_target)
        repeatability = repeatability_line(result)
        if repeatability:
            self.console.print(repeatability)
        machine = machine_line(result)
        if machine:
            self.console.print(machine)
        took = time_line(result.settings)           # the time it took beside the time planned
        if took:
            self.console.print(took)
        self.console.print(best_line(result) + f" — report in {result.out_dir}/ (results.json, report.md, charts)")
        keep = keep_line(result.settings, result.best)
        if keep:
            self.console.print(keep, markup=False, highlight=False)
