"""TensorBoard: event files under the command's folder, tensorboard/ (`tensorboard --logdir runs/`): the command's
own run in tensorboard/<kind> (its settings and the recommendation as text, the report as text), one run per child
in tensorboard/<key>, its figures as scalars at its repeats so far, its switches and verdict as text. TensorBoard
has no runs to group a script's own under: a script's SummaryWriter writes where it always did."""
from __future__ import annotations

from pathlib import Path

from .base import Tracker


def check_installed() -> None:
    import tensorboard  # noqa: F401


def table(values: dict[str, str]) -> str:
    """Params as a Markdown table (TensorBoard's text plugin renders it)."""
    return "| name | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in values.items())


class TensorboardTracker(Tracker):
    def __init__(self, group: str, kind: str, params: dict[str, str], folder: Path) -> None:
        super().__init__(group, kind, params, folder)
        self.root = Path(folder) / "tensorboard"
        self.writers = {None: self.writer(kind)}
        self.writers[None].add_text("params", table(params), 0)

    def writer(self, name: str):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(self.root / name))

    def child(self, key: str, params: dict[str, str]) -> None:
        self.writers[key] = self.writer(key)
        self.writers[key].add_text("params", table(params), 0)

    def log(self, key: str | None, metrics: dict[str, float], tags: dict[str, str], step: int) -> None:
        writer = self.writers[key]
        for name, value in metrics.items():
            writer.add_scalar(name, value, step)
        for name, value in tags.items():
            writer.add_text(name, value, step)
        writer.flush()

    def artifacts(self, key: str | None, paths: list[Path]) -> None:
        for path in paths:
            if path.suffix == ".md":             # images and JSON stay in the folder beside the event files
                self.writers[key].add_text(path.name, path.read_text(), 0)

    def end(self, status: str) -> None:
        for writer in self.writers.values():
            writer.close()


TRACKER = TensorboardTracker
