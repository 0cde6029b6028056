"""--track: an ablation's results in MLflow, W&B and TensorBoard, read back through each one's own library. Fed
from a committed results folder (tests/data/old_ablation: two rungs), so no ablation runs here; the ablation's own
loop feeding them, with a script that logs to MLflow itself, is the slow test at the end."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from trainfast.recipe import RecipeError
from trainfast.track import TrackError, Tracking, choose_trackers, from_environment, parse_track, track_results
from trainfast.track.figures import VERDICT_SIGN, parent_params, rung_metrics, rung_params, rung_tags

DATA = Path(__file__).parent / "data" / "old_ablation"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A finished ablation's folder (results.json, the runs), its own copy: the trackers write beside it."""
    return Path(shutil.copytree(DATA, tmp_path / "ablate-old"))


def results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


# --- names and figures: no tracker library --------------------------------------------------------------------

def test_track_names_are_parsed_and_refused_by_name():
    assert parse_track("mlflow, WandB") == ("mlflow", "wandb")
    with pytest.raises(ValueError, match="'comet': choose from mlflow, wandb, tensorboard, none"):
        parse_track("comet")


def test_the_environment_picks_the_tracker_and_says_why():
    said: list[str] = []
    picked = choose_trackers(None, {"MLFLOW_TRACKING_URI": "sqlite:///m.db", "WANDB_MODE": "offline"}, said.append)
    assert picked == ("mlflow", "wandb")
    assert "MLFLOW_TRACKING_URI is set (sqlite:///m.db)" in said[0] and "WANDB_MODE is set (offline)" in said[1]
    # disabled W&B is no reason to start it; --track none wins over the environment; --track over both
    assert from_environment({"WANDB_MODE": "disabled"}) == []
    assert choose_trackers([("none",)], {"MLFLOW_TRACKING_URI": "x"}, said.append) == ()
    assert choose_trackers([("tensorboard",), ("tensorboard",)], {"MLFLOW_TRACKING_URI": "x"}) == ("tensorboard",)


def test_a_rungs_figures_come_from_its_results_entry():
    data = results(DATA)
    base, fused = data["rungs"]
    assert rung_params(fused, base["recipe"]) == {"rung": "fused", "effect": "measured", "optimizer_impl": "fused"}
    metrics = rung_metrics(fused)
    assert metrics["rate"] == fused["throughput"] and metrics["accuracy"] == fused["metric"]["value"]
    assert (metrics["rate_low"], metrics["rate_high"]) == tuple(fused["throughput_interval"])
    assert metrics["verdict_sign"] == VERDICT_SIGN["no measurable difference"] == 0.0
    assert metrics["peak_memory_bytes"] == fused["peak_memory_bytes"] and "time_to_target_s" not in metrics
    assert rung_tags(fused)["verdict"] == "no measurable difference"
    target = {**fused, "to_target": {"time_s": 12.0, "speedup": 1.5, "interval": [1.2, 1.8], "verdict": "sooner"}}
    assert {k: v for k, v in rung_metrics(target).items() if "target" in k} == {
        "time_to_target_s": 12.0, "time_to_target_speedup": 1.5, "time_to_target_sign": 1.0,
        "time_to_target_low": 1.2, "time_to_target_high": 1.8}
    assert parent_params(data)["model"] == "resnet9"


# --- each tracker, read back with its own library ---------------------------------------------------------------

def mlflow_client(tmp_path: Path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow-skinny; CI has it)")
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")      # mlflow 3 keeps file stores behind this
    monkeypatch.chdir(tmp_path)
    return MlflowClient(uri)


def runs_of(client, group: str) -> tuple:
    """(the parent run named `group`, its children by name) in the trainfast experiment."""
    experiment = client.get_experiment_by_name("trainfast")
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.info.run_name == group)
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    return parent, children, runs


def test_mlflow_one_parent_and_one_child_per_rung(folder, tmp_path, monkeypatch):
    client = mlflow_client(tmp_path, monkeypatch)
    data = results(folder)
    track_results(("mlflow",), data, folder)
    parent, children, _ = runs_of(client, "ablate-old")
    assert parent.info.status == "FINISHED" and parent.data.params["model"] == "resnet9"
    assert parent.data.tags["best"] == "baseline" and parent.data.tags["trainfast.kind"] == "ablation"
    assert sorted(children) == ["baseline", "fused"]
    fused = children["fused"].data
    assert fused.params["optimizer_impl"] == "fused"
    assert fused.metrics["rate"] == pytest.approx(data["rungs"][1]["throughput"])
    assert fused.metrics["speedup"] == pytest.approx(data["rungs"][1]["speedup"])
    assert fused.metrics["accuracy"] == pytest.approx(data["rungs"][1]["metric"]["value"])
    assert fused.tags["verdict"] == "no measurable difference"
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"results.json"}


def test_mlflow_a_scripts_own_run_is_filed_under_its_rung(folder, tmp_path, monkeypatch):
    """What a script's client (the Trainer's MLflowCallback, Lightning's logger, mlflow.start_run) reads from the
    run's environment files its run under the rung's child, in the same store and experiment."""
    client = mlflow_client(tmp_path, monkeypatch)
    import mlflow

    tracking = Tracking.open(("mlflow",), "ablate-x", "ablation", {}, folder)
    env = tracking.child_env("amp", {"rung": "amp"})
    assert "MLFLOW_RUN_ID" not in env            # that would resume the rung's own run in every repeat
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with mlflow.start_run(run_name="script") as own:
        mlflow.log_metric("loss", 1.0)
    tracking.end()
    parent, children, runs = runs_of(client, "ablate-x")
    script = next(r for r in runs if r.info.run_id == own.info.run_id)
    assert script.data.tags["mlflow.parentRunId"] == children["amp"].info.run_id
    assert script.data.tags["trainfast.rung"] == "amp" and script.info.experiment_id == parent.info.experiment_id


def wandb_records(path: Path) -> list:
    """An offline W&B run's records (run-*.wandb): a leveldb-style log of wandb's own protobuf Records after a
    7-byte header (":W&B", a magic, a version), in 32 KiB blocks of chunks (crc, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, out, pending = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:                   # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        pending, pos = pending + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):                            # a FULL record, or the LAST chunk of one
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def wandb_run(path: Path) -> dict:
    """One offline run read back: its name, group, job type, config, summary and logged history."""
    run: dict = {"config": {}, "summary": {}, "history": {}}

    def key(item) -> str:
        return "/".join(item.nested_key) or item.key
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(name=record.run.display_name, group=record.run.run_group, job_type=record.run.job_type)
            run["config"].update({key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "summary":
            run["summary"].update({key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "history":
            run["history"].update({key(i): json.loads(i.value_json) for i in record.history.item})
    return run


def test_wandb_offline_one_group_with_a_run_per_rung(folder, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb; CI has it)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    data = results(folder)
    tracking = Tracking.open(("wandb",), folder.name, "ablation", parent_params(data), folder)
    # a script's own W&B runs: grouped under the ablation and the rung, in the same project
    assert tracking.child_env("fused", {"rung": "fused", "optimizer_impl": "fused"}) == {
        "WANDB_PROJECT": "trainfast", "WANDB_RUN_GROUP": "ablate-old/fused", "WANDB_JOB_TYPE": "fused"}
    tracking.results(data, folder)
    tracking.end()
    wandb.teardown()            # its service writes the run files behind finish(): flushed before they are read
    runs = {r["name"]: r for r in map(wandb_run, tmp_path.glob("wandb/offline-run-*/run-*.wandb"))}
    assert sorted(runs) == ["ablate-old", "baseline", "fused"]
    assert {r["group"] for r in runs.values()} == {"ablate-old"}
    assert runs["ablate-old"]["job_type"] == "ablation" and runs["ablate-old"]["summary"]["best"] == "baseline"
    fused = runs["fused"]
    assert fused["job_type"] == "rung" and fused["config"]["optimizer_impl"] == "fused"
    assert fused["history"]["rate"] == pytest.approx(data["rungs"][1]["throughput"])
    assert fused["history"]["peak_memory_bytes"] == data["rungs"][1]["peak_memory_bytes"]
    assert fused["summary"]["verdict"] == "no measurable difference"


def test_tensorboard_event_files_per_rung(folder):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard; CI has it)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = results(folder)
    track_results(("tensorboard",), data, folder)
    assert sorted(p.name for p in (folder / "tensorboard").iterdir()) == ["ablation", "baseline", "fused"]
    fused = EventAccumulator(str(folder / "tensorboard" / "fused"))
    fused.Reload()
    assert fused.Scalars("speedup")[-1].value == pytest.approx(data["rungs"][1]["speedup"])
    assert fused.Scalars("rate")[-1].step == 1                  # at its repeats
    assert "verdict/text_summary" in fused.Tags()["tensors"]
    parent = EventAccumulator(str(folder / "tensorboard" / "ablation"))
    parent.Reload()
    assert "report.md/text_summary" not in parent.Tags()["tensors"]      # the old folder has no report.md
    assert "best/text_summary" in parent.Tags()["tensors"]


def test_a_tune_stage_files_its_candidates_under_the_searchs_parent(folder):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard; CI has it)")
    tracking = Tracking.open(("tensorboard",), "tune-x", "tune", {"budget_s": "600"}, folder)
    stage = tracking.stage("singles")
    stage.results(results(folder), folder)
    stage.end()                               # a stage leaves the parent to its owner
    assert not tracking.shared.get("ended")
    tracking.end()
    assert sorted(p.name for p in (folder / "tensorboard").iterdir()) == ["singles", "tune"]
    assert sorted(p.name for p in (folder / "tensorboard" / "singles").iterdir()) == ["baseline", "fused"]


def test_a_searchs_parent_carries_its_options_and_recommendation(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard; CI has it)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainfast import Recipe
    from trainfast.tune import Decision, TuneOptions
    from trainfast.tune.tracked import finish_tracking, open_tracking

    out = tmp_path / "tune-x"
    (out / "best.yaml").parent.mkdir()
    (out / "tune.md").write_text("# the search")
    tracking = open_tracking(TuneOptions(track=("tensorboard",), budget_s=600), out, {"model": "resnet9"})
    decision = Decision(Recipe(channels_last=True), "channels_last", combined=["channels_last"], speedup=1.3,
                        speedup_interval=[1.1, 1.5])
    finish_tracking(tracking, decision, out)
    events = EventAccumulator(str(out / "tensorboard" / "tune"))
    events.Reload()
    assert events.Scalars("speedup_low")[0].value == pytest.approx(1.1)
    texts = {t: events.Tensors(t)[0].tensor_proto.string_val[0].decode() for t in events.Tags()["tensors"]}
    assert texts["recommended/text_summary"] == "channels_last" and texts["tune.md/text_summary"] == "# the search"
    params = texts["params/text_summary"]
    assert "| budget_s | 600 |" in params and "| model | resnet9 |" in params


def test_a_store_that_cannot_open_is_said_before_any_run(folder, monkeypatch, tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow-skinny; CI has it)")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:///dev/null/mlruns")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with pytest.raises(TrackError, match="--track mlflow: the tracking store file:///dev/null/mlruns cannot be "
                                         "opened"):
        Tracking.open(("mlflow",), "g", "ablation", {}, folder)


# --- the ablation's loop feeding its trackers (a fake launch: no process started) --------------------------------

class RecordWork:
    """A command's work around a fake launch that returns the old folder's run record, and keeps the environment
    each run would have started with (the loop sets run_env, as it does a command's)."""

    def __init__(self, settings: dict, record: dict, flops: float) -> None:
        import torch

        self.dev, self.base, self.learned, self.settings = torch.device("cpu"), None, {}, settings
        self.record, self.flops_per_sample, self.envs = record, flops, {}
        self.run_env = lambda rung: {}

    def mark_effects(self, plan) -> None:
        return None

    def launcher(self, measure):
        def launch(rung, recipe, budget, run_dir, display, limit):
            self.envs[rung.name] = self.run_env(rung)
            return dict(self.record)
        return launch

    def metric(self, measure):
        return "accuracy", "max"

    def after_run(self, plan):
        return None


def test_the_ladder_feeds_its_tracker_and_files_each_run_under_its_rung(tmp_path, monkeypatch):
    client = mlflow_client(tmp_path, monkeypatch)
    import trainfast.ablation.loop as loop
    from trainfast import Recipe
    from trainfast.ablation.loop import LadderOptions, run_ladder
    from trainfast.ablation.rung import TimingBudget
    from trainfast.results import Rung

    out = tmp_path / "ablate-loop"
    (out / "runs").mkdir(parents=True)
    shutil.copy(DATA / "plan.json", out)
    for key in ("baseline-r0", "baseline-r1"):          # the baseline's runs read back; the fused rung's "launched"
        shutil.copy(DATA / f"{key}.json", out / "runs")
    plan_json = json.loads((out / "plan.json").read_text())
    changes = {"baseline": {}, "fused": {"optimizer_impl": "fused"}}
    plan = [Rung(name, changes[name], Recipe.from_dict(recipe)) for name, recipe in plan_json["rungs"].items()]
    work = RecordWork(plan_json, json.loads((DATA / "fused-r0.json").read_text()),
                      results(DATA)["rungs"][0]["flops_per_sample"])
    options = LadderOptions(mode=plan_json["mode"], repeats=plan_json["repeats"], noise_seeds=plan_json["noise_seeds"],
                            budget=TimingBudget(**plan_json["budget"]), min_effect=plan_json["min_effect"],
                            resume=True, show=False, settle_within_s=0, track=("mlflow",))
    # the machine's roof and reference check are the ladder's, not the trackers' concern: a fixed roof, no check
    monkeypatch.setattr(loop, "measure_ceiling", lambda *args, **kwargs: 1e11)
    monkeypatch.setattr(loop, "reference_check", lambda device: {})
    result = run_ladder(plan, work, plan_json, out, options)
    parent, children, _ = runs_of(client, "ablate-loop")
    assert parent.info.status == "FINISHED" and parent.data.tags["best"] == result.best_name
    fused = children["fused"]
    assert fused.data.metrics["speedup"] == pytest.approx(result.rungs[1].result.speedup)
    assert fused.data.params["optimizer_impl"] == "fused" and fused.data.tags["status"] == "done"
    context = json.loads(work.envs["fused"]["MLFLOW_RUN_CONTEXT"])
    assert context["mlflow.parentRunId"] == fused.info.run_id and context["trainfast.rung"] == "fused"
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"report.md", "results.json"}
    with pytest.raises(RecipeError, match="track='comet': choose from mlflow, wandb, tensorboard"):
        LadderOptions(track="comet")


# --- the ablation's loop feeding MLflow, with a Trainer script that logs to MLflow itself ----------------------

@pytest.mark.slow
def test_ablate_track_mlflow_groups_a_trainer_scripts_own_runs(hf_trainer_ablation, monkeypatch):
    # the Trainer's report_to as a user's script sets it, nothing else in the script changed: conftest's ablation
    # of examples/hf_trainer.py with --track mlflow (amp, set_to_none, fused), the one test_fw_hf reads too
    out, results, uri = hf_trainer_ablation
    if uri is None:
        pytest.skip("mlflow is not installed (pip install mlflow-skinny; CI has it)")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")      # mlflow 3 keeps file stores behind this
    client = MlflowClient(uri)
    parent, children, runs = runs_of(client, "ablate-hf")
    assert parent.info.status == "FINISHED" and parent.data.tags["best"] == results["best"]["name"]
    assert sorted(children) == ["amp", "baseline", "fused", "set_to_none"]      # the rung not run too, with why
    assert children["set_to_none"].data.tags["status"] == "no-effect"
    fused = children["fused"].data
    assert fused.params["optimizer_impl"] == "fused" and fused.tags["status"] == "done"
    assert fused.metrics["rate"] > 0 and "speedup" in fused.metrics
    # the script's own runs, each under its rung's child: the Trainer's MLflowCallback's (its arguments as params),
    # and the one mlflow starts by itself for the metrics of the script's trainer.evaluate() after train() ended it
    mine = {c.info.run_id for c in children.values()}
    own = [r for r in runs if r.data.tags.get("trainfast.rung") and r.info.run_id not in mine]
    for run in own:
        assert run.data.tags["mlflow.parentRunId"] == children[run.data.tags["trainfast.rung"]].info.run_id
    trainer_runs = sorted(r.data.tags["trainfast.rung"] for r in own if "learning_rate" in r.data.params)
    assert trainer_runs == ["amp", "baseline", "fused"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"report.md", "results.json"}


def test_train_logs_its_recipe_and_each_epoch(tmp_path, monkeypatch):
    """trainfast train --track: one run, the recipe as params, each epoch's numbers at its epoch (the training itself
    faked: what is checked is what the command hands the tracker)."""
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard; CI has it)")
    from types import SimpleNamespace

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import trainfast.trainer
    from trainfast import cli

    def train(build_model, split, *, on_epoch, **kwargs):
        for epoch in (1, 2):
            on_epoch({"epoch": epoch, "step": 10 * epoch, "train_loss": 1.0 / epoch, "val_loss": 0.9 / epoch,
                      "val_accuracy": 0.5 + epoch / 10, "epoch_time_s": 1.5, "note": "words are not metrics"})
        return SimpleNamespace(curve=None)
    monkeypatch.setattr(trainfast.trainer, "train", train)
    out = tmp_path / "train-x"
    assert cli.main(["train", "--epochs", "2", "--lr", "0.01", "--track", "tensorboard", "--out", str(out)]) == 0
    events = EventAccumulator(str(out / "tensorboard" / "train"))
    events.Reload()
    assert [(s.step, s.value) for s in events.Scalars("train_loss")] == [(1, 1.0), (2, 0.5)]
    assert "val_accuracy" in events.Tags()["scalars"] and "note" not in events.Tags()["scalars"]
    params = events.Tensors("params/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| lr | 0.01 |" in params and "| epochs | 2 |" in params
