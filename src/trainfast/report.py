"""What a person reads: the live table, results.json, report.md and the charts.

The claim, the evidence and the environment sit together: every number in the table is in results.json
with the recipe that produced it and the machine it was measured on.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .techniques.precision import cpu_flags, level_note, opt_level

if TYPE_CHECKING:
    from .ablate import AblationResult, Rung

SCHEMA_VERSION = 1
CPU_FLAGS_THAT_MATTER = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")


def _git_sha() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict[str, Any]:
    import psutil
    import timm
    import torchvision

    flags = cpu_flags()
    env = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "cpu": _cpu_name(),
        "cpu_cores": os.cpu_count(),
        "cpu_flags": [f for f in CPU_FLAGS_THAT_MATTER if f in flags],
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "timm": timm.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "git_sha": _git_sha(),
    }
    return env


def fmt_rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def fmt_bytes(x: float | None) -> str:
    return "—" if x is None else f"{x / 2**20:,.0f} MiB"


def fmt_flops(x: float | None) -> str:
    return "—" if x is None else f"{x / 1e9:,.1f} G"


def rung_label(rung: "Rung") -> str:
    if rung.name == "baseline":
        return "baseline (fp32)"
    if rung.name.startswith("baseline-seed"):
        return f"baseline (seed {rung.recipe.seed}, for the noise band)"
    if "precision_level" in rung.changes:       # a precision-level rung: its name says the dtype already
        return f"{rung.name} ({opt_level(rung.recipe)})"
    extra = f" ({rung.changes['precision']})" if "precision" in rung.changes else ""
    return f"+{rung.name}{extra}"


def table_rows(rungs: list["Rung"]) -> list[list[str]]:
    """The ablation table, shared by the live display and report.md."""
    rows = []
    for rung in rungs:
        r = rung.result
        if rung.status == "no-effect":
            rows.append([rung_label(rung), "no effect on this device", "—", "—", "—", "—", "—", "—"])
            continue
        if rung.status == "failed":
            rows.append([rung_label(rung), "failed: " + r.get("error", "")[:60], "—", "—", "—", "—", "—", "—"])
            continue
        if rung.status != "done":
            rows.append([rung_label(rung), rung.status, "", "", "", "", "", ""])
            continue
        speed = f"{r['speedup']:.2f}x" if r.get("speedup") else "—"
        acc = f"{r['accuracy']:.3f}"
        if rung.name != "baseline" and "accuracy_delta" in r:
            acc += f" ({r['accuracy_delta']:+.3f}{' !' if r['accuracy_flag'] else ''})"
        frac = f"{100 * r['ceiling_fraction']:.1f}%" if r.get("ceiling_fraction") is not None else "—"
        mem = fmt_bytes(r["peak_memory_bytes"])
        if r.get("memory_ratio") and rung.name != "baseline":
            mem += f" ({r['memory_ratio']:.2f}x)"
        rows.append([rung_label(rung), f"{fmt_rate(r['throughput'])} ± {fmt_rate(r['throughput_spread'])}", speed,
                     f"{r['epoch_time_s']:.1f}", mem, acc, f"{r['loss']:.3f}", frac])
    return rows


HEADERS = ["rung", "samples/s (median ± IQR/2)", "speed-up", "epoch s", "peak memory", "val acc (Δ)", "val loss", "of ceiling"]


class Display:
    """A rich live table plus a progress bar for the running rung; plain lines when not on a terminal."""

    def __init__(self, rungs: list["Rung"], ceilings: dict[str, float], env: dict[str, Any], show: bool = True) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.rungs, self.ceilings, self.env, self.show = rungs, ceilings, env, show
        self.console = Console()
        if not self.console.is_terminal:
            # Piped or logged: no live redraws, and wide enough that the final table is not wrapped.
            self.console = Console(width=max(self.console.width, 160))
        self.progress_bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=self.console)
        self.task = None
        self.live = None

    def _render(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"trainfast ablate — {self.env['device_name']} ({self.env['device']})")
        for h in HEADERS:
            table.add_column(h, justify="left" if h == "rung" else "right")
        for row in table_rows(self.rungs):
            table.add_row(*row)
        return Group(table, self.progress_bar)

    def __enter__(self):
        from rich.live import Live

        if self.show:
            ceil = ", ".join(f"{k}: {v / 1e9:,.0f} GFLOP/s" for k, v in self.ceilings.items())
            self.console.print(f"[bold]matmul ceiling[/bold] {ceil}")
            if self.console.is_terminal:
                self.live = Live(self._render(), console=self.console, refresh_per_second=4)
                self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(*exc)
        return False

    def start_rung(self, rung: "Rung") -> None:
        if self.task is not None:
            self.progress_bar.remove_task(self.task)
        self.task = self.progress_bar.add_task(rung_label(rung), total=None, loss="…")
        if self.show and self.live is None:
            self.console.print(f"running {rung_label(rung)} …")
        self.update()

    def progress(self, rung: "Rung", event: dict) -> None:
        self.progress_bar.update(self.task, completed=event["step"], total=event["total"], loss=f"{event['loss']:.3f}")
        self.update()

    def update(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def final(self, result: "AblationResult") -> None:
        if not self.show:
            return
        if self.live is None:
            self.console.print(self._render().renderables[0])
        self.console.print(f"best: [bold]{rung_label(next(r for r in result.rungs if r.name == result.best_name))}[/bold]"
                           f" — report in {result.out_dir}/ (results.json, report.md, charts)")


def results_dict(result: "AblationResult") -> dict[str, Any]:
    rungs = []
    for rung in result.rungs:
        r = dict(rung.result)
        item = {
            "name": rung.name,
            "changes": rung.changes,
            "recipe": rung.recipe.to_dict(),
            "effect": rung.effect,
            "effect_reason": rung.reason,
            "status": rung.status,
        }
        for key in ("throughput", "throughput_spread", "epoch_time_s", "peak_memory_bytes", "accuracy", "loss",
                    "flops_per_s", "ceiling_fraction"):
            item[key] = r.pop(key, None)
        item.update(r)
        rungs.append(item)
    return {
        "schema_version": SCHEMA_VERSION,
        "environment": result.environment,
        "ceilings_flops_per_s": result.ceilings,
        "best": {"name": result.best_name, "recipe": result.best.to_dict()},
        "baseline_seeds": result.seed_runs,
        "rungs": rungs,
    }


def _markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(result: "AblationResult") -> None:
    out = result.out_dir
    data = results_dict(result)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, out / "results.json")
    charts = write_charts(result)
    env = result.environment
    base = result.rungs[0].result
    lines = [
        "# trainfast ablation report", "",
        f"Measured on **{env['device_name']}** ({env['device']}, {env['cpu_cores']} cores, torch {env['torch']}, "
        f"git {env['git_sha'] or 'n/a'}). CPU flags: {', '.join(env['cpu_flags']) or 'none of note'}.", "",
        "Matmul ceiling: " + ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in result.ceilings.items()) + ".", "",
        _markdown_table(HEADERS, table_rows(result.rungs)), "",
        data_wait_line(result.rungs), "",
        "How to read it: samples/s is the median over timing windows after the first window of each epoch "
        "(compile, allocator and worker warm-up), ± half the interquartile range. Epoch time includes that "
        "warm-up. Speed-up and memory are relative to the baseline. Peak memory is the CUDA allocator peak on "
        "GPU, the rung process's peak RSS on CPU. `of ceiling` is achieved model FLOP/s over the matmul ceiling "
        "in the rung's dtype.", "",
    ]
    if base and "accuracy" in base:
        band = accuracy_note(result)
        lines += [band, ""]
    notes = [f"- **{rung_label(r)}**: no effect on this device — {r.reason}" for r in result.rungs if r.status == "no-effect"]
    notes += [f"- **{rung_label(r)}**: {r.reason}" for r in result.rungs if r.status == "done" and r.reason]
    notes += [f"- **{rung_label(r)}**: failed — {r.result.get('error')}" for r in result.rungs if r.status == "failed"]
    for r in result.rungs:
        if r.status == "done" and r.result.get("data_wait_fraction", 0) > 0.2:
            notes.append(f"- **{rung_label(r)}**: input-bound — {100 * r.result['data_wait_fraction']:.0f}% of the "
                         "epoch was spent waiting for data")
        if r.status == "done" and r.result.get("skipped_files"):
            notes.append(f"- **{rung_label(r)}**: {r.result['skipped_files']} unreadable image(s) skipped "
                         "(paths in the rung's log)")
        state = r.result.get("precision_state") or {}
        if "loss_scale" in state:
            notes.append(f"- **{rung_label(r)}**: loss scaler final scale {state['loss_scale']:g}, "
                         f"{state['skipped_steps']} skipped step(s)"
                         + (f", longest run of skips {state['longest_skip_run']}" if state.get("longest_skip_run") else ""))
        risk = level_note(r.recipe)
        if risk:
            notes.append(f"- **{rung_label(r)}**: {risk}")
    above = above_ceiling_note(result.rungs)
    if above:
        notes.append(f"- {above}")
    if notes:
        lines += ["## Notes", "", *notes, ""]
    lines += ["## Best combination", "", f"**{result.best_name}**: the fastest rung whose accuracy is not below "
              "the baseline's noise band (risky O3 rungs are measured, never picked).", "", "```json", json.dumps(result.best.to_dict(), indent=2), "```", ""]
    lines += ["## Charts", ""] + [f"![{c.stem}]({c.name})" for c in charts] + [""]
    (out / "report.md").write_text("\n".join(lines))


def above_ceiling_note(rungs: list["Rung"]) -> str | None:
    """Said when a rung's model FLOP/s exceeds the measured matmul ceiling, which a peak cannot allow."""
    above = [rung_label(r) for r in rungs if r.status == "done" and (r.result.get("ceiling_fraction") or 0) > 1]
    if not above:
        return None
    return (f"{', '.join(above)} ran above the measured matmul ceiling: the machine's speed changed during the "
            "run (a shared or throttled machine; the ceiling is measured before and after the ladder and the "
            "higher kept), or the model's FLOP count overstates its work. Compare rungs with each other here.")


def data_wait_line(rungs: list["Rung"]) -> str:
    """Input-bound or not, for every measured rung: the share of the epoch the loop spent waiting for
    the next batch (the rest is computing). Above 20%, faster input would speed the run up."""
    parts = [f"{rung_label(r)} {100 * r.result['data_wait_fraction']:.0f}%"
             + (" (input-bound)" if r.result["data_wait_fraction"] > 0.2 else "")
             for r in rungs if r.status == "done" and "data_wait_fraction" in r.result]
    return "Time waiting for data (share of epoch time; the rest is computing): " + (", ".join(parts) or "—") + "."


def accuracy_note(result: "AblationResult") -> str:
    base = result.rungs[0].result
    band = next((r.result.get("accuracy_band") for r in result.rungs if r.result.get("accuracy_band")), None)
    flagged = [rung_label(r) for r in result.rungs if r.result.get("accuracy_flag")]
    accs = [s["accuracy"] for s in result.seed_runs if s.get("accuracy") is not None]
    seeds = ", ".join(f"{a:.3f}" for a in accs)
    text = (f"Accuracy noise band: ±{band:.3f} around the baseline's mean accuracy over {len(accs)} seed(s) "
            f"({seeds}) on {base['val_samples']} held-out samples: the larger of two binomial standard errors "
            f"of a difference and two seed-to-seed standard deviations. Δ is measured from that mean. ")
    text += ("Outside it (marked !): " + ", ".join(flagged) + ".") if flagged else "Every rung is inside it."
    return text


def write_charts(result: "AblationResult") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in result.rungs if r.status == "done"]
    if not done:
        return []
    labels = [rung_label(r) for r in done]
    specs = [
        ("throughput", "samples/s (median, IQR/2 bars)", [r.result["throughput"] for r in done],
         [r.result["throughput_spread"] for r in done]),
        ("peak_memory", "peak memory (MiB)", [r.result["peak_memory_bytes"] / 2**20 for r in done], None),
        ("accuracy", "held-out accuracy", [r.result["accuracy"] for r in done], None),
    ]
    paths = []
    for name, ylabel, values, errors in specs:
        fig, ax = plt.subplots(figsize=(8, 3.6), dpi=110)
        bars = ax.bar(range(len(values)), values, yerr=errors, capsize=3, color="#3b75af")
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 10 else f"{v:.3f}" for v in values], fontsize=8, padding=2)
        if name == "accuracy" and done[0].result.get("accuracy_band"):
            base, band = done[0].result["accuracy"], done[0].result["accuracy_band"]
            ax.axhspan(base - band, base + band, color="#999", alpha=0.25, label="baseline noise band")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xticks(range(len(values)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel} per rung — {result.environment['device_name']}", fontsize=9)
        fig.tight_layout()
        path = result.out_dir / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
