"""MLflow: the group is a parent run, each child a run tagged with it as parent (mlflow.parentRunId, which the
MLflow UI nests), in the experiment MLFLOW_EXPERIMENT_NAME names (default "trainfast"), in the store
MLFLOW_TRACKING_URI names (default mlflow's own). Written through MlflowClient, so a user's active run in the same
process is left alone.

A script that logs to MLflow itself (transformers' MLflowCallback, Lightning's MLFlowLogger, mlflow.start_run):
every run the mlflow client starts merges the tags of MLFLOW_RUN_CONTEXT (a JSON object; mlflow's
SystemEnvironmentContext), so a parent-run tag there files the script's run under its rung's child, in the same
store and experiment. MLFLOW_RUN_ID would instead resume the rung's own run, one for every repeat."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .base import Tracker, TrackError

PARENT_TAG = "mlflow.parentRunId"
STATUS = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}


def check_installed() -> None:
    import mlflow  # noqa: F401


class MlflowTracker(Tracker):
    def __init__(self, group: str, kind: str, params: dict[str, str], folder: Path) -> None:
        super().__init__(group, kind, params, folder)
        import mlflow
        from mlflow.tracking import MlflowClient

        self.uri = mlflow.get_tracking_uri()
        self.experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "trainfast"
        try:
            self.client = MlflowClient(self.uri)
            found = self.client.get_experiment_by_name(self.experiment)
            self.experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
            parent = self.client.create_run(self.experiment_id, run_name=group, tags={"trainfast.kind": kind})
        except Exception as exc:        # the store's own error, whatever its kind: said with what to set
            raise TrackError(f"--track mlflow: the tracking store {self.uri} cannot be opened ({exc}); set "
                             "MLFLOW_TRACKING_URI to a server (http://...) or a local store (sqlite:///mlflow.db "
                             "needs sqlalchemy and alembic)") from None
        self.runs: dict[str | None, str] = {None: parent.info.run_id}
        self.params(parent.info.run_id, params)

    def params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):         # mlflow takes at most 100 params in one batch
            self.client.log_batch(run_id, params=items[i:i + 100])

    def child(self, key: str, params: dict[str, str]) -> None:
        run = self.client.create_run(self.experiment_id, run_name=key,
                                     tags={PARENT_TAG: self.runs[None], "trainfast.group": self.group,
                                           "trainfast.rung": key})
        self.runs[key] = run.info.run_id
        self.params(run.info.run_id, params)

    def log(self, key: str | None, metrics: dict[str, float], tags: dict[str, str], step: int) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(self.runs[key], metrics=[Metric(k, v, now, step) for k, v in metrics.items()],
                              tags=[RunTag(k, v) for k, v in tags.items()])

    def artifacts(self, key: str | None, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.runs[key], str(path))

    def end(self, status: str) -> None:
        for key, run_id in reversed(list(self.runs.items())):       # the children first, the parent last
            self.client.set_terminated(run_id, STATUS[status])

    def child_env(self, key: str) -> dict[str, str]:
        context = {PARENT_TAG: self.runs[key], "trainfast.group": self.group, "trainfast.rung": key}
        return {"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_EXPERIMENT_NAME": self.experiment,
                "MLFLOW_RUN_CONTEXT": json.dumps(context)}


TRACKER = MlflowTracker
