"""Running the checks: the machine's facts, each check run or said not applicable, its result shown as it
comes (a rich table) and every result written to selfcheck.json."""
from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from .catalog import Check
from .judges import Verdict, applicable

PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "not applicable"
FORMAT = "trainfast.selfcheck"
VERSION = 1


@dataclass
class Result:
    name: str
    status: str                      # pass | fail | not applicable
    figure: float | None = None
    unit: str = ""
    detail: str = ""
    seconds: float = 0.0
    needs: dict[str, Any] = field(default_factory=dict)
    cpu_subset: bool = False         # part of the --cpu-subset

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    """What a check's code gets: the device it runs on, a folder for what it writes, the machine's facts, and
    a cache shared by the checks that judge one expensive run (the doctor's, the ablation's, fp32's)."""
    device: Any                      # torch.device
    out: Path
    machine: dict[str, Any]
    cache: dict[str, Any] = field(default_factory=dict)

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


def driver_version() -> str | None:
    """The NVIDIA kernel module's version line, or None (no driver loaded): read without starting CUDA."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            return f.readline().strip() or None
    except OSError:
        return None


def no_cuda_line() -> str:
    """The one line printed when selfcheck is run without a GPU (and without --cpu-subset)."""
    import torch

    from ..envcheck import no_gpu_reason

    env = {"cuda_build": torch.version.cuda, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "driver": driver_version(), "cuda_init_warning": None}
    return (f"selfcheck: no CUDA device here (torch {torch.__version__}: {no_gpu_reason(env)}); run it on a GPU "
            f"machine, or pass --cpu-subset for the checks a CPU can run")


def probe_machine(cpu_subset: bool) -> dict[str, Any]:
    """The facts `judges.applicable` decides on, and what selfcheck.json records about the machine."""
    import torch

    from ..techniques.compile import effect as compile_effect
    from ..techniques.precision import has_fast_bf16

    cuda = torch.cuda.is_available()
    device = torch.device("cpu" if cpu_subset or not cuda else "cuda")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    # bf16 on the CPU: autocast runs everywhere (emulated without AVX512-BF16/AMX, slower but still correct),
    # which is what a parity check needs; on CUDA it needs Ampere or newer.
    bf16 = torch.cuda.is_bf16_supported() if device.type == "cuda" else True
    return {"device": str(device), "cuda": cuda, "gpus": len(names), "gpu_names": names, "bf16": bool(bf16),
            "bf16_fast": has_fast_bf16(device), "compiler": compile_effect(device).acts, "torch": torch.__version__,
            "cuda_build": torch.version.cuda, "cpu_cores": os.cpu_count(), "compiler_path": shutil.which("g++")}


def run_check(check: Check, ctx: Context, cpu_subset: bool) -> Result:
    """One check: not applicable (and why), or run and judged; an exception is a failure with its last line."""
    base = Result(check.name, NOT_APPLICABLE, needs=dict(check.needs), cpu_subset=check.cpu)
    reason = applicable(check.needs, ctx.machine, cpu_subset)
    if reason:
        base.detail = reason
        return base
    t0 = time.perf_counter()
    try:
        verdict: Verdict = check.resolve()(ctx)
        base.status = PASS if verdict.ok else FAIL
        base.figure, base.unit, base.detail = verdict.figure, verdict.unit, verdict.detail
    except Exception as exc:         # a crash in a CUDA path is exactly what the selfcheck is for: report it
        where = traceback.extract_tb(exc.__traceback__)[-1]
        base.status = FAIL
        base.detail = f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} " \
                      f"({Path(where.filename).name}:{where.lineno})"
    finally:
        base.seconds = time.perf_counter() - t0
        release_memory()
    return base


def release_memory() -> None:
    """Between checks: each one's tensors go, so the next one's timings and peaks start from a clean allocator."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def figure_text(result: Result) -> str:
    if result.figure is None:
        return ""
    value = result.figure
    number = f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.3f}".rstrip("0").rstrip(".")
    return f"{number} {result.unit}".strip()


STYLE = {PASS: "green", FAIL: "bold red", NOT_APPLICABLE: "dim"}


def build_table(results: list[Result], title: str, caption: str | None = None):
    from rich.table import Table

    table = Table(title=title, show_lines=False, caption=caption)
    for column, kwargs in (("check", {"no_wrap": True}), ("status", {"no_wrap": True}),
                           ("figure", {"justify": "right", "no_wrap": True}), ("detail", {"ratio": 1}),
                           ("s", {"justify": "right", "no_wrap": True})):
        table.add_column(column, **kwargs)
    for r in results:
        table.add_row(r.name, f"[{STYLE[r.status]}]{r.status}[/]", figure_text(r), r.detail,
                      f"{r.seconds:.1f}" if r.status != NOT_APPLICABLE else "")
    return table


def run_all(checks: list[Check], ctx: Context, cpu_subset: bool, console=None) -> list[Result]:
    """Every check in order, the table redrawn as each result comes (a terminal shows it live, with the checks done
    of planned and the time left under it: report/progress.py; a log gets the final table once)."""
    from rich.console import Console
    from rich.live import Live

    from ..report.progress import RunPlan

    if console is None:
        console = Console()
        if not console.is_terminal:      # a log file or a pipe: wide enough that the details stay readable
            console = Console(width=160)
    title = f"trainfast selfcheck on {ctx.machine['device']}" + (" (--cpu-subset)" if cpu_subset else "")
    results: list[Result] = []
    runs = RunPlan(noun="checks")
    runs.plan([c.name for c in checks])
    with Live(build_table(results, title, runs.line()), console=console, auto_refresh=False) as live:
        for check in checks:
            results.append(run_check(check, ctx, cpu_subset))
            runs.finished(check.name, results[-1].seconds)
            live.update(build_table(results, title, runs.line() if runs.planned else None), refresh=True)
    if not console.is_terminal:
        console.print()                  # Live leaves its last render without a line end there
    return results


def summarize(results: list[Result]) -> dict[str, int]:
    return {status: sum(r.status == status for r in results) for status in (PASS, FAIL, NOT_APPLICABLE)}


def exit_status(results: list[Result]) -> int:
    """0: nothing failed; 1: a check failed."""
    return 1 if any(r.status == FAIL for r in results) else 0


def report_payload(results: list[Result], machine: dict[str, Any], cpu_subset: bool) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "created": datetime.now().isoformat(timespec="seconds"),
            "mode": "cpu-subset" if cpu_subset else "cuda", "machine": machine, "summary": summarize(results),
            "exit_status": exit_status(results), "checks": [r.to_dict() for r in results]}


def write_report(out: Path, payload: dict[str, Any]) -> Path:
    from ..checkpoint import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    path = out / "selfcheck.json"
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")
    return path
