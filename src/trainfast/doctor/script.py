"""The doctor on a user's script, in a subprocess: `trainfast doctor -- python train.py`. trainfast's
sitecustomize starts the Watch in the script (TRAINFAST_DOCTOR in the environment: install_in_script), its
loop is read as an own loop is (loop.py), and the script is stopped after its steps, or kept going for its
first evaluation (`eval_within`)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from ..checks import Observations
from ..instruments.watch import Watch
from .common import DEFAULT_EVAL_WITHIN, DEFAULT_STEPS, add_evaluation
from .loop import loop_observations
from .progress import FIRST, DoctorProgress, ScriptSteps, Silent, write_steps
from .ranks import gather_watched_ranks, start_rank_clock

EVAL_GRACE_S = 30.0         # a script still running this long past its evaluation wait is stopped from outside
DOCTOR_ENV = "TRAINFAST_DOCTOR"


class ScriptFailed(RuntimeError):
    """`doctor -- COMMAND`: the command ran past its time or ended before a step was watched (log tail said)."""


def install_in_script() -> None:
    """Called by trainfast's sitecustomize when TRAINFAST_DOCTOR is set: watch this process's loop; after its
    steps write the observations (so a script stopped from outside while it is kept going for its evaluation
    still has them), then, once the evaluation came or the wait ended, write them again with it and end the
    script (exit status 0); or write them at exit if it ends sooner."""
    import atexit

    from ..probe import StopRun

    from ..probe.observe import Observer

    spec = json.loads(os.environ[DOCTOR_ENV])
    observer = Observer().install()             # what the loop is seen doing: the switches it could take
    device = spec.get("device", "cpu")
    taken: list[Observations] = []
    done: list[bool] = []
    rank0 = os.environ.get("RANK", "0") == "0"          # under torchrun, rank 0 alone writes

    def write(obs: Observations) -> None:
        from ..checkpoint import atomic_write_text

        atomic_write_text(spec["result"], json.dumps(asdict(obs), default=str))

    def snapshot(w: Watch) -> None:
        ranks = gather_watched_ranks(w, clock)     # every rank, at the same step: before rank 0 alone goes on
        if rank0:
            taken.append(loop_observations(w, device, w.forwards.dropout_check()))
            taken[0].observed = observed(observer)
            taken[0].ranks = ranks
            taken[0].eval_wait = {"outcome": "waiting", "limit_s": w.eval_within, "steps": 0, "waited_s": 0.0}
            write(taken[0])

    def finish(w: Watch) -> None:
        if done or not rank0:
            return
        done.append(True)
        obs = taken[0] if taken else loop_observations(w, device, w.forwards.dropout_check())
        obs.observed = obs.observed or observed(observer)
        add_evaluation(obs, w)
        write(obs)

    def at_exit() -> None:
        if watch.steps and not done:
            if watch.eval_wait is None:
                watch.eval_wait = watch.wait_record("ended")
            finish(watch)

    watch = Watch(None, device_type=torch.device(device).type, sync_window=(1, 1 + spec["sync_steps"]),
                  stop_after=1 + spec["sync_steps"] + spec["steps"], on_stop=snapshot, on_finish=finish,
                  stop_with=StopRun, eval_within=float(spec.get("eval_within", 0.0)))
    watch.__enter__()
    if rank0 and spec.get("progress"):
        write_steps(watch, spec["progress"])        # the doctor's display: its steps so far (progress.py)
    clock = start_rank_clock()                      # several ranks: each one's forward and optimizer step
    atexit.register(at_exit)


def observed(observer) -> dict[str, Any] | None:
    """The loop as the Observer saw it (probe/observe.py), with why no model switch could reach it; None before
    its first training forward."""
    if observer.model is None:
        return None
    return {**observer.observed(), "refusal": observer.refusal}


def observe_script(command: list[str], out_dir: Path, *, steps: int = DEFAULT_STEPS, sync_steps: int = 10,
                   device: str = "cpu", timeout_s: float = 600.0, eval_within: float = DEFAULT_EVAL_WITHIN,
                   recipe_fields: dict[str, Any] | None = None, nproc: int = 1,
                   progress: DoctorProgress | None = None) -> Observations:
    """Run the user's command (an argument list, never a shell string) under the doctor, its output in
    out_dir/log.txt, and read the observations its process wrote. `recipe_fields` (the recipe flags given to
    the doctor) reach a script's trainfast.Session through TRAINFAST_RECIPE, as under `ablate -- COMMAND`.
    The script keeps its own evaluation wait (`eval_within`) at its steps and forwards; one that stops making
    either while waiting is stopped from here, EVAL_GRACE_S later, and read from what it wrote first. `nproc` > 1:
    the command runs as that many ranks under torchrun (rank 0 writes; every rank's own figures are gathered).
    `progress` shows its steps done of planned, with the time left (progress.py: ScriptSteps)."""
    from ..launch import SITE_DIR, Command, check_command
    from ..recipe import RECIPE_ENV

    launched = Command(tuple(command), nproc)
    check_command(launched)                         # refused before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    result = out_dir / "observations.json"
    result.unlink(missing_ok=True)
    (steps_file := out_dir / "progress.json").unlink(missing_ok=True)
    progress = progress or Silent()
    progress.plan([(FIRST, 1), ("step", sync_steps + steps)])
    progress.start("the script: its start-up and first step")
    seen = ScriptSteps(progress, steps_file, result, eval_within)
    path = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, DOCTOR_ENV: json.dumps({"result": str(result), "steps": steps, "sync_steps": sync_steps,
                                                 "device": device, "eval_within": eval_within,
                                                 "progress": str(steps_file)}),
           "PYTHONPATH": str(SITE_DIR) + (os.pathsep + path if path else "")}
    if recipe_fields:
        env[RECIPE_ENV] = json.dumps(recipe_fields)
    with open(out_dir / "log.txt", "wb") as log:
        proc = subprocess.Popen(launched.launch_argv(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        code, stopped = await_script(proc, result, timeout_s, eval_within + EVAL_GRACE_S, seen.poll)
    seen.poll()
    if not result.is_file():
        if stopped:
            raise ScriptFailed(f"the command ran past {timeout_s:.0f} s; see {out_dir / 'log.txt'}")
        tail = (out_dir / "log.txt").read_text(errors="replace")[-2000:]
        raise ScriptFailed(f"the command exited with status {code} before a single optimizer step was watched; "
                           f"its log ({out_dir / 'log.txt'}) ends:\n{tail}")
    obs = Observations(**json.loads(result.read_text()))
    obs.command = list(command)
    if (obs.eval_wait or {}).get("outcome") == "waiting":      # stopped from here while kept going
        obs.eval_wait = {**obs.eval_wait, "outcome": "limit", "waited_s": eval_within}
        obs.notes.append("the script made no step or forward to end its evaluation wait; it was stopped from "
                         "outside")
    return obs


def await_script(proc: subprocess.Popen, result: Path, timeout_s: float, wait_s: float,
                 on_poll: Callable[[], None] = lambda: None) -> tuple[int, bool]:
    """Waits for the script: (its exit status, whether it had to be stopped). Stopped at `timeout_s`, or
    `wait_s` after it first wrote its observations (it is then only kept going for its evaluation), or when
    this process is interrupted (then the interruption goes on). `on_poll` runs twice a second (the display)."""
    deadline = time.monotonic() + timeout_s
    written_at: float | None = None
    try:
        while True:
            try:
                return proc.wait(timeout=0.5), False
            except subprocess.TimeoutExpired:
                pass
            on_poll()
            now = time.monotonic()
            if written_at is None and result.is_file():
                written_at = now
            if now >= deadline or (written_at is not None and now >= written_at + wait_s):
                stop_script(proc)
                return proc.returncode, True
    except BaseException:
        stop_script(proc)
        raise


def stop_script(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; its DataLoader workers notice their parent's exit themselves."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
