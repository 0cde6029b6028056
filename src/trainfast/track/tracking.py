"""Several trackers as one (Tracking): a parent run, a child per key, fed from results.json's entries."""
from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

from .base import Tracker, TrackError, load_tracker, text
from .figures import base_recipe, parent_params, parent_tags, rung_metrics, rung_params, rung_tags

# A rung's children are made once it has something to show (or at the end, to say why it was not run)
SHOWN = ("done", "partial", "failed")
# The report folder's files kept with the parent, where the tracker keeps files
ARTIFACTS = ("report.md", "results.json", "tune.md", "tune.json", "best.yaml", "recipe.json", "metrics.jsonl")


class Tracking:
    """The trackers a command asked for, opened as one group: `open` starts the parent in each, `child` a run under
    it, `rungs` feeds each rung's figures (only what changed since it was last fed), `finish` the end. A `stage`
    view (tune's stages) files its children under the same parent, its key prefixed by the stage's name, and leaves
    the parent open for its owner."""

    def __init__(self, trackers: list[Tracker], prefix: str = "", owner: bool = True,
                 shared: dict[str, Any] | None = None) -> None:
        self.trackers, self.prefix, self.owner = trackers, prefix, owner
        # children made and the figures each was last fed, shared by every view of the group
        self.shared = shared if shared is not None else {"children": set(), "fed": {}}

    @classmethod
    def open(cls, names: tuple[str, ...], group: str, kind: str, params: dict[str, Any],
             folder: Path) -> Tracking | None:
        """The group `group` (the run folder's name) in every tracker named, its parent started with `params`;
        None when none is named. TrackError, naming the package or the store, when one cannot start (the ones
        already started are closed as failed)."""
        if not names:
            return None
        classes = [load_tracker(name) for name in names]        # every library checked before any run starts
        trackers: list[Tracker] = []
        try:
            for tracker in classes:
                trackers.append(tracker(group, kind, {k: text(v) for k, v in params.items()}, Path(folder)))
        except TrackError:
            for started in trackers:
                started.end("failed")
            raise
        tracking = cls(trackers)
        # A command stopped by an error or Ctrl-C outside the ablation's own handling: its runs are not left running
        atexit.register(tracking.end, "killed")
        return tracking

    def stage(self, name: str) -> Tracking:
        """A view whose children are `name/<key>` under this group's parent; it never ends the parent."""
        return Tracking(self.trackers, f"{self.prefix}{name}/", owner=False, shared=self.shared)

    def child(self, key: str, params: dict[str, str]) -> str:
        """The child run `key` (prefixed), started in every tracker the first time."""
        full = self.prefix + key
        if full not in self.shared["children"]:
            self.shared["children"].add(full)
            for tracker in self.trackers:
                tracker.child(full, params)
        return full

    def child_env(self, key: str, params: dict[str, str]) -> dict[str, str]:
        """What a script's own tracker client reads to file its runs under the child `key` (started now)."""
        full = self.child(key, params)
        env: dict[str, str] = {}
        for tracker in self.trackers:
            env.update(tracker.child_env(full))
        return env

    def rungs(self, items: list[dict[str, Any]], base: dict[str, Any] | None, every: bool = False) -> None:
        """Each rung's figures (results.json's entries), logged at its repeats so far when they changed; `every`:
        the rungs not run too (their status and why)."""
        for item in items:
            if not every and item.get("status") not in SHOWN:
                continue
            key = self.child(item["name"], rung_params(item, base))
            figures = (rung_metrics(item), rung_tags(item))
            if self.shared["fed"].get(key) == figures:
                continue
            self.shared["fed"][key] = figures
            for tracker in self.trackers:
                tracker.log(key, figures[0], figures[1], int(item.get("repeats") or 0))

    def epoch(self, record: dict[str, Any]) -> None:
        """A training run's epoch (metrics.jsonl's line): its numbers on the parent, at its epoch."""
        numbers = {k: float(v) for k, v in record.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "epoch"}
        self.log(numbers, step=int(record.get("epoch", 0)))

    def log(self, metrics: dict[str, float], tags: dict[str, str] | None = None, step: int = 0) -> None:
        """Figures of the parent (trainfast train: an epoch's)."""
        for tracker in self.trackers:
            tracker.log(None, metrics, tags or {}, step)

    def results(self, results: dict[str, Any], folder: Path | None = None) -> None:
        """A whole results.json: every rung's figures, the recommendation on the parent (a stage's tags prefixed by
        its name), the report folder's files kept with it."""
        self.rungs(results.get("rungs") or [], base_recipe(results), every=True)
        tags = parent_tags(results)
        self.log({}, {f"{self.prefix}{k}": v for k, v in tags.items()})
        if folder is not None and self.owner:
            self.artifacts(folder)

    def artifacts(self, folder: Path) -> None:
        """The folder's report files and charts, kept with the parent."""
        folder = Path(folder)
        paths = [folder / n for n in ARTIFACTS if (folder / n).is_file()] + sorted(folder.glob("*.png"))
        for tracker in self.trackers:
            tracker.artifacts(None, paths)

    def end(self, status: str = "finished") -> None:
        """Every run closed (a stage view leaves that to its owner), once."""
        if self.owner and not self.shared.get("ended"):
            self.shared["ended"] = True
            atexit.unregister(self.end)
            for tracker in self.trackers:
                tracker.end(status)


def track_results(names: tuple[str, ...], results: dict[str, Any], folder: Path, group: str | None = None) -> None:
    """A finished ablation's results.json (as read from its folder) into the trackers named: one parent, one child
    per rung, the report as artifacts."""
    tracking = Tracking.open(names, group or Path(folder).name, "ablation", parent_params(results), folder)
    if tracking is not None:
        tracking.results(results, folder)
        tracking.end()
