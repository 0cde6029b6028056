"""The things done of those planned, with the time left (progress.RunPlan), as every long command shows them:
ablate's runs under its live table, the doctor's steps. A terminal gets a rich bar (what runs now, done of planned,
the time left, the time taken); anything else gets plain lines, one as each thing starts ("running X … (5 of 12
runs, ~3 min left)") and one where the plan changed, with why. One class, so both commands say it alike."""
from __future__ import annotations

from .progress import RunPlan, seconds_text


class RunsBar:
    """`runs` shown on `console`. `describe`: the bar's own label is what runs now (the doctor); False where the
    owner shows that on a bar of its own (ablate's running rung). `printing`: the plain lines are printed (no
    live display on this console); its owner sets it, or `open()` does where the bar is the whole display."""

    def __init__(self, runs: RunPlan, console, show: bool = True, describe: bool = True) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.runs, self.console, self.show, self.describe = runs, console, show, describe
        self.printing = show and not console.is_terminal
        # its own time left (the plan's per-kind costs), not rich's, which assumes equal runs
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[left]}"), TimeElapsedColumn(), console=console)
        self.task = self.progress.add_task(runs.noun, total=None, left="")
        self.live = None

    def open(self) -> "RunsBar":
        """The bar as the whole display: live on a terminal (redrawn once a second: a faster redraw takes CPU
        from the steps being timed), else plain lines."""
        if self.show and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self.progress, console=self.console, refresh_per_second=1)
            self.live.__enter__()
        return self

    def close(self) -> None:
        if self.live is not None:
            self.refresh()
            self.live.__exit__(None, None, None)
            self.live = None

    def start(self, what: str) -> None:
        """`what` starts now: the bar's label, or a plain line with the runs done of planned and the time left."""
        if self.describe:
            self.progress.update(self.task, description=what)
        self.refresh()
        if self.printing:
            self.console.print(f"running {what} … ({self.runs.line()})", markup=False, highlight=False,
                               soft_wrap=True)

    def plan(self, kinds: list[str], why: str | None = None) -> None:
        """The things still planned (RunPlan.plan); a change in their number is said, with why."""
        change = self.runs.plan(kinds, why)
        if change is not None and self.show:
            self.console.print(self.runs.change_line(change), markup=False, highlight=False, soft_wrap=True)
        self.refresh()

    def finished(self, kind: str, seconds: float | None, repeat_s: float | None = None) -> None:
        self.runs.finished(kind, seconds, repeat_s)
        self.refresh()

    def refresh(self) -> None:
        left = self.runs.left_s()
        self.progress.update(self.task, completed=self.runs.done, total=self.runs.total or None,
                             left=f"~{seconds_text(left)} left" if left is not None else "")
