"""Weights & Biases: the group is W&B's run group (the ablation's folder name), holding one run for the command
itself (job type "ablation", "tune" or "train": its settings, the recommendation, the report as an artifact) and
one run per child (job type "rung"); in the project WANDB_PROJECT names (default "trainfast"), online or offline
as WANDB_MODE says. Several runs stay open in this process at once (wandb's reinit="create_new").

A script that logs to W&B itself (the Trainer's report_to="wandb", Lightning's WandbLogger, wandb.init) reads
WANDB_RUN_GROUP and WANDB_JOB_TYPE from its environment: each of its runs joins the group <ablation>/<rung>, its
job type the rung's name, in the same project."""
from __future__ import annotations

import os
import re
from pathlib import Path

from .base import Tracker, TrackError


def check_installed() -> None:
    import wandb  # noqa: F401


class WandbTracker(Tracker):
    def __init__(self, group: str, kind: str, params: dict[str, str], folder: Path) -> None:
        super().__init__(group, kind, params, folder)
        import wandb

        self.wandb = wandb
        self.project = os.environ.get("WANDB_PROJECT") or "trainfast"
        try:
            self.runs = {None: self.start(group, kind, params)}
        except Exception as exc:        # wandb's own error (not logged in, no network in online mode): said as is
            raise TrackError(f"--track wandb: a run cannot start ({exc}); `wandb login`, or WANDB_MODE=offline "
                             "to keep the runs on this machine (`wandb sync` later)") from None

    def start(self, name: str, job_type: str, config: dict[str, str]):
        # silent: wandb's banner would interleave with the ablation's own lines on the console; console off: every
        # open run would copy this process's output; no stats: its sampler would take CPU from the timed runs
        settings = self.wandb.Settings(silent=True, console="off", x_disable_stats=True)
        return self.wandb.init(project=self.project, group=self.group, name=name, job_type=job_type, config=config,
                               reinit="create_new", settings=settings)

    def child(self, key: str, params: dict[str, str]) -> None:
        self.runs[key] = self.start(key, "rung", params)

    def log(self, key: str | None, metrics: dict[str, float], tags: dict[str, str], step: int) -> None:
        run = self.runs[key]
        if metrics:
            run.log(metrics, step=max(step, run.step))      # W&B's steps only go forward
        run.summary.update(tags)

    def artifacts(self, key: str | None, paths: list[Path]) -> None:
        if not paths:
            return
        artifact = self.wandb.Artifact(re.sub(r"[^A-Za-z0-9_.\-]", "_", f"{self.group}-report"), type="report")
        for path in paths:
            artifact.add_file(str(path))
        self.runs[key].log_artifact(artifact)

    def end(self, status: str) -> None:
        for run in reversed(list(self.runs.values())):
            run.finish(exit_code=0 if status == "finished" else 1)

    def child_env(self, key: str) -> dict[str, str]:
        return {"WANDB_PROJECT": self.project, "WANDB_RUN_GROUP": f"{self.group}/{key}", "WANDB_JOB_TYPE": key}


TRACKER = WandbTracker
