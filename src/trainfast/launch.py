"""`trainfast ablate -- COMMAND`: one run of a user's command, with a rung's recipe, measured by the probe.

A run is the command started as it is (an argument list, never a shell string) with three variables added
to its environment: TRAINFAST_RECIPE (the rung's switches and seed, which a trainfast.Session applies over
the script's own recipe), TRAINFAST_MEASURE (where the probe writes the result, the mode, the timing budget;
probe/contract.py) and PYTHONPATH with trainfast's sitecustomize first (the probe's global optimizer hook for scripts
without a Session). It runs inside a supervised process (procs.run_supervised: its own process group, the
time limit, stopped with the ablation on Ctrl-C or if the ablation dies), which waits for the command and
hands back the result the probe wrote, or an error naming what went wrong.

Each run keeps a folder: command.json (the argument list and the added environment), log.txt (the
command's stdout and stderr) and result.json (the probe's). Under --nproc also ranks/: each rank's heartbeat and
its own stdout and stderr (torchrun's --tee and --log-dir, set through their PET_ variables: every line in log.txt
says its rank), from which a failed run names the rank at fault (rankfaults.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .probe import MEASURE_ENV, MeasureSpec
from .rankfaults import HEARTBEATS, HEARTBEATS_ENV, RankFailed, describe_rank_fault, parse_rank_exits, read_heartbeats
from .recipe import RECIPE_ENV, RecipeError
from .techniques import process_env

SITE_DIR = Path(__file__).parent / "_site"


# A run that ended well but wrote no result: a failure on the node that reports, a following node's normal end
NO_RESULT = ("the command ended without a single optimizer step measured (no optimizer.step() ran, or the process "
             "left with os._exit)")


class RunFailed(RuntimeError):
    """The command failed, or ended without a result; the message says which (the log's tail follows it)."""
    explained = True            # procs.child_main: no traceback of ours after the command's own output


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    nproc: int = 1                  # > 1: every run under torch.distributed.run (torchrun), this many ranks
    mode: str = "speed"             # probe.PROBE_MODES
    nodes: Any = None               # nodes.RunNodes: this node's share of a run on several nodes; None: one node

    def launch_argv(self) -> list[str]:
        """The argument list actually started: under --nproc, `python script.py ...` becomes
        `python -m torch.distributed.run --standalone --nproc-per-node N script.py ...` (also for `python -m
        module`), and `trainfast ...` runs as `python -m trainfast ...` under it. On several nodes `--standalone`
        gives way to this node's place in the run (nodes.RunNodes.torchrun_flags)."""
        argv = list(self.argv)
        if self.nproc == 1 and self.nodes is None:
            return argv
        if Path(argv[0]).name == "trainfast":
            argv = [sys.executable, "-m", "trainfast", *argv[1:]]
        if not Path(argv[0]).name.startswith("python"):
            raise RecipeError(f"--nproc {self.nproc} runs the command under torchrun, which starts Python scripts: "
                              f"give the command as `python your_script.py ...`, not {argv[0]!r}")
        where = self.nodes.torchrun_flags() if self.nodes is not None else ["--standalone"]
        return [argv[0], "-m", "torch.distributed.run", *where, f"--nproc-per-node={self.nproc}", *argv[1:]]


def check_command(command: Command) -> None:
    """Refuse a command that cannot start, before any run: an empty one, a program not on PATH, a script
    file that does not exist."""
    if not command.argv:
        raise RecipeError("ablate -- COMMAND: no command after `--` (e.g. `trainfast ablate -- python train.py`)")
    program = command.argv[0]
    python = Path(program).name.startswith("python")
    if shutil.which(program) is None:
        raise RecipeError(f"ablate -- COMMAND: {program!r} is not an executable on PATH")
    if python and len(command.argv) > 1 and not command.argv[1].startswith("-"):
        script = Path(command.argv[1])
        if not script.is_file():
            raise RecipeError(f"ablate -- COMMAND: the script {str(script)!r} does not exist "
                              f"(from {os.getcwd()})")
    command.launch_argv()
    if python:
        # The probe is imported by the command's own Python: one without trainfast would run unmeasured.
        probe = [program, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('trainfast') is None)"]
        if subprocess.run(probe, capture_output=True).returncode != 0:
            raise RecipeError(f"ablate -- COMMAND: {shutil.which(program)} cannot import trainfast, so its runs could "
                              f"not be measured; start the command with the Python trainfast is installed in "
                              f"({sys.executable}) or activate that environment")


def run_environment(fields: dict[str, Any], spec: MeasureSpec) -> dict[str, str]:
    """The variables a run adds to the ablation's own environment (passive_threads: the OpenMP wait policy,
    which the command's process must start with; reuse_memory: glibc's malloc settings, read at its start)."""
    path = os.environ.get("PYTHONPATH", "")
    ranks = Path(spec.result).parent / HEARTBEATS
    # torchrun's own flags as its variables (read only under --nproc): each rank's lines prefixed with its local
    # rank in log.txt, and its own log files in the run's folder rather than a temporary folder left behind.
    torchrun = {"PET_TEE": "3", "PET_LOG_DIR": str(ranks / "logs"), HEARTBEATS_ENV: str(ranks)} if spec.result else {}
    return {RECIPE_ENV: json.dumps(fields), MEASURE_ENV: spec.to_env(),
            "PYTHONPATH": str(SITE_DIR) + (os.pathsep + path if path else ""), **process_env(fields), **torchrun}


def command_main(argv: list[str], added_env: dict[str, str], run_dir: str, events) -> dict[str, Any]:
    """Inside the supervised process: run the command to its end, then read the probe's result."""
    run = Path(run_dir)
    result_path = Path(json.loads(added_env[MEASURE_ENV])["result"])
    result_path.unlink(missing_ok=True)             # a result from an earlier attempt never counts
    with open(run / "log.txt", "ab") as log:
        try:
            code = subprocess.run(argv, env={**os.environ, **added_env}, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL).returncode
        except OSError as exc:
            raise RunFailed(f"the command could not start: {exc}") from None
    if code != 0:
        what = "the command " + (f"killed by signal {-code}" if code < 0 else f"exited with status {code}")
        fault = describe_rank_fault(parse_rank_exits(read_lines(run / "log.txt")), read_heartbeats(run / HEARTBEATS),
                                    read_lines(run / "log.txt"))
        if fault is not None:
            raise RankFailed(f"{fault} ({what})")      # the rank first: a table's cell shows its start
        raise RunFailed(what)
    if not result_path.is_file():
        raise RunFailed(NO_RESULT)
    return json.loads(result_path.read_text())


def read_lines(path: Path, max_bytes: int = 1 << 20) -> list[str]:
    """The last `max_bytes` of a log, as lines: what a failed run's ranks said last."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - max_bytes))
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
