"""What a person reads: the live table, results.json, report.md and the charts.

The claim, the evidence and the environment sit together: every number in the table is in results.json
with the recipe that produced it and the machine it was measured on.
"""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .stats import FIRM, MIN_EFFECT
from .techniques.base import NOT_APPLICABLE

from .techniques.precision import SLOW_HALF, cpu_flags, level_note, not_run_text, opt_level

if TYPE_CHECKING:
    from .ablate import AblationResult, Rung

SCHEMA_VERSION = 2
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


def fmt_sig(x: float | None, digits: int = 3) -> str:
    """`x` with `digits` significant figures, trailing zeros kept (5.40, 45.3, 453; 1,234 stays whole)."""
    if x is None:
        return "—"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def fmt_rate(x: float | None, spread: float | None = None) -> str:
    """A rate to 3 significant figures, and its ± at the same decimals."""
    if x is None:
        return "—"
    text = fmt_sig(x)
    if spread is None:
        return text
    decimals = len(text.split(".")[1]) if "." in text else 0
    return f"{text} ± {spread:,.{decimals}f}"


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


def fmt_speedup(r: dict) -> str:
    if r.get("speedup") is None:
        return "—"
    lo, hi = r.get("speedup_interval") or (None, None)
    return f"{r['speedup']:.2f}x" + (f" ({lo:.2f}–{hi:.2f})" if lo is not None and lo != hi else "")


def short_verdict(v: dict | None) -> str:
    """'faster by 77%' / 'slower by 8%' / 'no measurable difference' from a comparison's fields; a verdict a
    rerun would not reliably repeat (stats.rerun_agreement) ends in '?'."""
    if not v or "verdict" not in v:
        return "—"
    mark = "" if v.get("firm", True) else " ?"
    if v["verdict"] == "faster":
        return f"faster by {100 * (v['speedup'] - 1):.0f}%{mark}"
    if v["verdict"] == "slower":
        return f"slower by {100 * (1 - v['speedup']):.0f}%{mark}"
    return v["verdict"] + mark


NO_SESSION = "no-session"     # a rung's effect when the measured script never creates a trainfast.Session


@dataclass(frozen=True)
class Columns:
    """What the ablation table shows: the built-in run's epoch time and held-out accuracy, or for a user's
    script (`ablate -- COMMAND`) its run time, the metric it reported and its rate unit (steps/s when the
    samples of a step are unknown)."""
    cumulative: bool = True
    unit: str = "samples/s"
    time_label: str = "epoch s"
    time_key: str = "epoch_time_s"
    metric_label: str = "val acc"

    @classmethod
    def for_settings(cls, settings: dict[str, Any], rungs: list["Rung"] | None = None) -> "Columns":
        cumulative = settings.get("mode", "cumulative") == "cumulative"
        if not settings.get("command"):
            return cls(cumulative, metric_label=settings.get("metric_label", cls.metric_label))   # detection: mAP
        units = {run.get("rate_unit") for r in rungs or [] for run in r.repeats}
        metric = settings.get("metric") or {}
        name = metric.get("name") or next((k for r in rungs or [] for run in r.repeats for k in run.get("reported", {})),
                                          None)
        return cls(cumulative, "steps/s" if "steps/s" in units else "samples/s", "run s", "wall_s",
                   name if settings.get("measure") == "full" and name else "metric")


def table_rows(rungs: list["Rung"], columns: Columns = Columns()) -> list[list[str]]:
    """The ablation table, shared by the live display and report.md."""
    rows = []
    width = len(headers(columns))
    for rung in rungs:
        r = rung.result
        label = rung_label(rung)
        if rung.status == "no-effect":
            text = {NO_SESSION: "no effect: " + rung.reason, NOT_APPLICABLE: "not applicable: " + rung.reason,
                    SLOW_HALF: not_run_text(rung.reason)}
            rows.append([label, text.get(rung.effect, "no effect on this device")] + ["—"] * (width - 2))
            continue
        if rung.status == "failed":
            rows.append([label, "failed: " + r.get("error", "")[:60]] + ["—"] * (width - 2))
            continue
        if rung.status == "skipped":
            rows.append([label, "skipped: not in the time budget"] + ["—"] * (width - 2))
            continue
        if not r or not rung.repeats:
            rows.append([label, rung.status] + [""] * (width - 2))
            continue
        verdict = "reference" if rung.name == "baseline" else short_verdict(r)
        if rung.status != "done":
            verdict += f" (so far: {len(rung.repeats)} repeat(s))"
        acc = "—" if r.get("accuracy") is None else f"{r['accuracy']:.3f}"
        if rung.name != "baseline" and "accuracy_delta" in r:
            acc += f" ({r['accuracy_delta']:+.3f}{' !' if r['accuracy_flag'] else ''})"
        frac = f"{100 * r['ceiling_fraction']:.1f}%" if r.get("ceiling_fraction") is not None else "—"
        mem = fmt_bytes(r["peak_memory_bytes"])
        if r.get("memory_ratio") and rung.name != "baseline":
            mem += f" ({r['memory_ratio']:.2f}x)"
        row = [label, fmt_rate(r["throughput"], r.get("throughput_spread")), fmt_speedup(r), verdict]
        if columns.cumulative:
            row.append(short_verdict(r.get("vs_previous")))
        seconds = r.get(columns.time_key)
        rows.append(row + ["—" if seconds is None else f"{seconds:.1f}", mem, acc, frac])
    return rows


def headers(columns: Columns = Columns()) -> list[str]:
    cols = ["rung", f"{columns.unit} (± 95% CI)", "speed-up (95% CI)", "verdict vs baseline"]
    if columns.cumulative:
        cols.append("vs rung above")
    return cols + [columns.time_label, "peak memory", f"{columns.metric_label} (Δ)", "% of matmul peak"]


class Display:
    """A rich live table plus a progress bar for the running rung; plain lines when not on a terminal."""

    def __init__(self, rungs: list["Rung"], ceilings: dict[str, float], env: dict[str, Any], show: bool = True,
                 settings: dict[str, Any] | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.rungs, self.ceilings, self.env, self.show, self.settings = rungs, ceilings, env, show, settings or {}
        self.console = Console()
        if not self.console.is_terminal:
            # Piped or logged: no live redraws, and wide enough that the final table is not wrapped.
            self.console = Console(width=max(self.console.width, 230))
        self.progress_bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=self.console)
        self.task = None
        self.live = None

    def _render(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"trainfast ablate — {self.env['device_name']} ({self.env['device']})")
        columns = Columns.for_settings(self.settings, self.rungs)
        for h in headers(columns):
            table.add_column(h, justify="left" if h == "rung" else "right")
        for row in table_rows(self.rungs, columns):
            table.add_row(*row)
        return Group(table, self.progress_bar)

    def __enter__(self):
        from rich.live import Live

        if self.show:
            ceil = ", ".join(f"{k}: {v / 1e9:,.0f} GFLOP/s" for k, v in self.ceilings.items())
            self.console.print(f"[bold]measured matmul peak[/bold] {ceil}")
            if self.console.is_terminal:
                self.live = Live(self._render(), console=self.console, refresh_per_second=4)
                self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(*exc)
        return False

    def start_rung(self, rung: "Rung", seed: int, run: int = 1, runs: int = 1) -> None:
        if self.task is not None:
            self.progress_bar.remove_task(self.task)
        what = f"{rung_label(rung)} — seed {seed}, run {run} of {runs}"
        self.task = self.progress_bar.add_task(what, total=None, loss="…")
        if self.show and self.live is None:
            self.console.print(f"running {what} …")
        self.update()

    def reused(self, rung: "Rung", repeat: int) -> None:
        if self.show:
            self.console.print(f"reused {rung_label(rung)}, run {repeat + 1} (finished before the interruption)")

    def progress(self, rung: "Rung", event: dict) -> None:
        self.progress_bar.update(self.task, completed=event["step"], total=event["total"], loss=f"{event['loss']:.3f}")
        self.update()

    def update(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def final(self, result: "AblationResult", interrupted: bool = False) -> None:
        if not self.show:
            return
        if self.live is None:
            self.console.print(self._render().renderables[0])
        if interrupted:
            done = sum(len(r.repeats) for r in result.rungs)
            self.console.print(f"[bold]interrupted[/bold]: {done} run(s) finished; partial report in "
                               f"{result.out_dir}/; continue with the same command and --resume")
            return
        repeatability = repeatability_line(result)
        if repeatability:
            self.console.print(repeatability)
        self.console.print(best_line(result) + f" — report in {result.out_dir}/ (results.json, report.md, charts)")


def best_line(result: "AblationResult") -> str:
    """The recommendation, the rungs not measurably different from it, and how often a rerun would recommend
    the same (stats.recommendation_odds): an answer one run gives and the next may not is said to be one."""
    labels = {r.name: rung_label(r) for r in result.rungs}
    text = f"recommended: {labels[result.best_name]}"
    others = [n for n in result.tie if n != result.best_name]
    if others:
        text += (f" (tied with {', '.join(labels[n] for n in others)}: not measurably different from it; of the "
                 "rungs not measurably slower than the fastest, the simplest is recommended, and a `?` verdict is "
                 "within the noise)")
    same = result.odds.get(result.best_name)
    if same is None:
        return text
    if same >= FIRM:
        return text + f". A rerun would recommend the same about {100 * same:.0f}% of the time"
    rest = ", ".join(f"{labels[n]} {100 * p:.0f}%" for n, p in result.odds.items() if n != result.best_name and p >= 0.05)
    return (text + f". A rerun would recommend the same only about {100 * same:.0f}% of the time ({rest}): these "
            "rungs are within the noise of each other here, so which of them is recommended is not a finding; "
            "more --repeats separate them")


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
            "verdict": {"no-effect": "not run: slower on this device" if rung.effect == SLOW_HALF
                        else "no effect on this device", "failed": "failed"}.get(rung.status, r.pop("verdict", None)),
        }
        for key in ("throughput", "throughput_interval", "throughput_spread", "speedup", "speedup_interval",
                    "epoch_time_s", "peak_memory_bytes", "accuracy", "loss", "flops_per_s", "ceiling_fraction"):
            item[key] = r.pop(key, None)
        item.update(r)
        item["runs"] = rung.repeats            # every process's own numbers, step times included
        rungs.append(item)
    return {
        "schema_version": SCHEMA_VERSION,
        "environment": result.environment,
        "settings": result.settings,
        "ceilings_flops_per_s": result.ceilings,
        "best": {"name": result.best_name, "recipe": result.best.to_dict(), "tie": result.tie,
                 "rerun_odds": result.odds},
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
    columns = Columns.for_settings(result.settings, result.rungs)
    repeatability = repeatability_line(result)
    lines = [
        "# trainfast ablation report", "",
        f"Measured on **{env['device_name']}** ({env['device']}, {env['cpu_cores']} cores, torch {env['torch']}, "
        f"git {env['git_sha'] or 'n/a'}). CPU flags: {', '.join(env['cpu_flags']) or 'none of note'}.", "",
        "Measured matmul peak (the roof for `% of matmul peak`): "
        + ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in result.ceilings.items()) + ".", "",
        _markdown_table(headers(columns), table_rows(result.rungs, columns)), "",
        data_wait_line(result.rungs), "",
        *([repeatability, ""] if repeatability else []),
        how_to_read(result), "",
    ]
    if base and base.get("accuracy") is not None:
        band = accuracy_note(result)
        lines += [band, ""]
    ruled_out = {NO_SESSION: "no effect", SLOW_HALF: "not run"}
    notes = [f"- **{rung_label(r)}**: {ruled_out.get(r.effect, 'no effect on this device')} — {r.reason}"
             for r in result.rungs if r.status == "no-effect"]
    notes += [f"- **{rung_label(r)}**: {r.reason}" for r in result.rungs if r.status in ("done", "skipped") and r.reason]
    for r in result.rungs:
        if r.status == "failed":
            tail = r.result.get("log_tail") or ""
            notes.append(f"- **{rung_label(r)}**: failed — {r.result.get('error')}"
                         + ("\n\n  ```\n" + "\n".join("  " + line for line in tail.splitlines()) + "\n  ```" if tail else ""))
    for r in result.rungs:
        if r.status == "done" and r.result.get("data_wait_fraction", 0) > 0.2:
            notes.append(f"- **{rung_label(r)}**: input-bound — {100 * r.result['data_wait_fraction']:.0f}% of the "
                         "timed steps was spent waiting for data")
        if r.status == "done" and any(run["timing"].get("all_disturbed") for run in r.repeats):
            notes.append(f"- **{rung_label(r)}**: in some run every block of steps was disturbed (other processes "
                         "used more than a quarter of the machine throughout): its rate comes from disturbed steps; "
                         "run it again on a quieter machine")
        disturbed = sum(r.result.get("disturbed_steps") or [])
        if r.status == "done" and disturbed:
            clean = sum(r.result.get("timed_steps") or [])
            notes.append(f"- **{rung_label(r)}**: {disturbed} step(s) left out as disturbed (other processes used "
                         f"more than a quarter of the machine meanwhile); its rate comes from {clean} clean steps"
                         + (" — too few for a firm verdict: run it again on a quieter machine"
                            if min(r.result.get("timed_steps") or [0]) < 8 else ""))
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
    from .doctor import markdown_section

    lines += markdown_section(out)         # `trainfast doctor --out` this folder: its findings, when present
    lines += ["## Recommendation", "", best_line(result) + ".", "",
              "Candidates are the baseline and the measured rungs whose accuracy is not below the baseline's noise "
              "band (risky O3 rungs are measured, never recommended). A rung is recommended over a simpler one only "
              "when it is measurably faster than it, with a firm verdict (a `?` verdict, one a rerun would not "
              "repeat at least 80% of the time, is within the noise and never changes the recommendation): the "
              "fastest rung, when it is measurably faster than the baseline, or the simplest of the rungs that are "
              "measurably faster than the baseline and not measurably slower than it. The rungs not measurably "
              "different from the recommendation are its tie (`best.tie` in results.json). How often a rerun would "
              "recommend each rung (`best.rerun_odds`): 400 simulated reruns, each rung's mean drawn around this "
              "run's with this run's error and the rerun's own (the pooled noise), the same rule applied.", "",
              "```json", json.dumps(result.best.to_dict(), indent=2), "```", ""]
    lines += ["## Charts", ""] + [f"![{c.stem}]({c.name})" for c in charts] + [""]
    (out / "report.md").write_text("\n".join(lines))


def how_to_read(result: "AblationResult") -> str:
    st = result.settings
    budget = st.get("budget", {})
    return (
        f"How to read it: every rung ran {st.get('repeats')} time(s), each in a fresh process, in interleaved order "
        "(every rung once, then every rung again; repeat i with seed + i in every rung), so a slow spell of the "
        "machine hits all rungs alike. Each run is timed over its steady steps: warm-up (compilation, allocator, "
        "worker start-up) ends where step times settle, detected per run, and the data is cycled past the epoch "
        f"until at least {budget.get('steps')} steady steps (or {budget.get('floor')} once they take "
        f"{budget.get('seconds'):g} s) are timed. samples/s is total samples over total time of those steps (what a "
        "clock around them reads), the mean over repeats, ± the half-width of its 95% interval. The speed-up is "
        "the geometric mean over paired repeats of rate(rung) / rate(reference); its 95% interval is a paired "
        "t-interval with the process-to-process noise pooled over every rung (log rate = rung + pass + noise; "
        "with one repeat, a block bootstrap over the steps of that process instead). A rung is `faster` or `slower` "
        f"only when that interval excludes 1.0, the effect is at least {100 * st.get('min_effect', 0):.0f}%, and "
        "(with repeats) the estimate clears that line by the margin that makes a rerun of the same command call "
        "it too at least 80% of the time; otherwise `no measurable difference`, so that two runs agree. "
        "`vs rung above` judges what adding this rung's switch bought. "
        "Epoch s is the mean wall time of the accuracy run's epochs, warm-up included (evaluation excluded). "
        "Peak memory is the CUDA allocator peak on GPU, the rung process's peak RSS on CPU (the largest over "
        "repeats). `% of matmul peak` is the model's FLOP/s (torch.utils.flop_counter) over the best matmul "
        "FLOP/s measured in the rung's dtype on this machine before and after the ladder: a measured peak, "
        "not the hardware's limit.")


def above_ceiling_note(rungs: list["Rung"]) -> str | None:
    """Said when a rung's model FLOP/s exceeds the measured matmul ceiling, which a peak cannot allow."""
    above = [rung_label(r) for r in rungs if r.status == "done" and (r.result.get("ceiling_fraction") or 0) > 1]
    if not above:
        return None
    return (f"{', '.join(above)} ran above 100% of the measured matmul peak. The peak is the best of a few "
            "2048x2048 products before and after the ladder; a model whose layers are larger or better fused than "
            "one such product, a machine that ran faster during the ladder than during those probes (a shared or "
            "throttled machine), or a FLOP count that overstates the model's work can all exceed it. Compare "
            "the rungs with each other here, not with 100%.")


def repeatability_line(result: "AblationResult") -> str | None:
    """How repeatable these verdicts are, from the measured process-to-process noise: the smallest difference
    found in 80% of runs, the verdicts a rerun may not repeat (marked ?), and the repeats that would make 10%
    (or --min-effect, if larger) detectable. None without a pooled noise estimate (one repeat)."""
    noise = next((r.result.get("noise") for r in result.rungs if r.status == "done" and r.result.get("noise")), None)
    if not noise:
        return None
    from .ablate import unsettled

    shaky = [rung_label(r) + ("" if r.result.get("firm", True) else " (vs baseline)")
             for r in result.rungs if r.status == "done" and r.name != "baseline" and unsettled(r)]
    (target, repeats), = noise["repeats_for"].items()
    text = (f"Repeatability: the process-to-process noise is {100 * noise['sigma_log']:.1f}% per run (pooled over the "
            f"rungs, {noise['df']} df); with {result.settings.get('repeats')} repeats a speed-up below "
            f"~{100 * noise['detectable_effect']:.0f}% between two rungs is found in fewer than 80% of runs. ")
    settle = result.settings.get("settle")
    if settle:
        passes = settle["passes"]
        why = ", ".join(dict.fromkeys(name for p in passes for name in p["unsettled"]))
        text += (f"{len(passes)} pass(es) of every rung were added after the {passes[0]['repeat'] - 1} asked for, "
                 f"because verdicts were within the noise or gains of {100 * result.settings.get('min_effect', MIN_EFFECT):.0f}% or "
                 f"more were not yet resolved ({why}), while another pass fitted in the {settle['within_s']:.0f} s "
                 + ("allowed (tune: half the budget left when this stage began, all of it in the last stage). "
                    if "stage" in result.settings else "of --settle-within. "))
    if shaky:
        text += (f"Verdicts marked ? ({', '.join(shaky)}) would be repeated by a rerun less than 80% of the time: "
                 "their differences sit near the decision threshold, within the noise, and another run may call "
                 "them otherwise. ")
    else:
        text += "Every verdict here would be repeated by a rerun at least 80% of the time. "
    together = joint_agreement(result)
    if together is not None:
        text += (f"All the verdicts against the baseline at once: a rerun would repeat every one of them about "
                 f"{100 * together:.0f}% of the time (the product of their chances, as if independent). ")
    return text + f"`--repeats {repeats}` would make a {100 * float(target):.0f}% difference detectable."


def joint_agreement(result: "AblationResult") -> float | None:
    """The chance that a rerun repeats every verdict against the baseline: the product of the verdicts' own
    chances (stats.rerun_agreement), which treats them as independent (they share the baseline's repeats, so
    this is a rough figure). A ladder of a dozen verdicts each repeated 90% of the time is repeated whole only
    ~30% of the time: the report says so rather than letting one run's table pass for the answer."""
    chances = [r.result["agreement"] for r in result.rungs
               if r.status == "done" and r.name != "baseline" and r.result.get("agreement") is not None]
    return math.prod(chances) if chances else None


def data_wait_line(rungs: list["Rung"]) -> str:
    """Input-bound or not, for every measured rung: the share of the timed steps the loop spent waiting for
    the next batch (the rest is computing). Above 20%, faster input would speed the run up."""
    parts = [f"{rung_label(r)} {100 * r.result['data_wait_fraction']:.0f}%"
             + (" (input-bound)" if r.result["data_wait_fraction"] > 0.2 else "")
             for r in rungs if r.status == "done" and "data_wait_fraction" in r.result]
    return "Time waiting for data (share of the timed steps; the rest is computing): " + (", ".join(parts) or "—") + "."


def accuracy_note(result: "AblationResult") -> str:
    base = result.rungs[0].result
    band = next((r.result.get("accuracy_band") for r in result.rungs if r.result.get("accuracy_band") is not None), None)
    flagged = [rung_label(r) for r in result.rungs if r.result.get("accuracy_flag")]
    accs = [s["accuracy"] for s in result.seed_runs if s.get("accuracy") is not None]
    seeds = ", ".join(f"{a:.3f}" for a in accs)
    runs = result.settings.get("repeats", 1)
    if band is None:        # one baseline run finished (a seed failed or --noise-seeds 1): nothing to judge against
        name = Columns.for_settings(result.settings, result.rungs).metric_label
        return (f"{name}: no noise band (one baseline run); give the baseline more seeds with --noise-seeds "
                "to judge the metric.")
    if base.get("val_samples") is None:         # a script's own metric: seed-to-seed noise only
        name = Columns.for_settings(result.settings, result.rungs).metric_label
        text = (f"{name} noise band: ±{band:.3g} around the baseline's mean over {len(accs)} seed(s) ({seeds}): two "
                f"seed-to-seed standard deviations, scaled for comparing a rung's mean over its {runs} seed(s) with "
                "that mean. Δ is measured from that mean. ")
        if band == 0:
            text += ("The seeds all gave the same value: if the script seeds its own random generators after "
                     "creating the Session, the ablation's seeds do not reach it and any change is flagged. ")
        return text + (("Outside it (marked !): " + ", ".join(flagged) + ".") if flagged else "Every rung is inside it.")
    name = result.settings.get("metric_name", "accuracy")     # detection: mAP
    title = name if name[1:2].isupper() else name[0].upper() + name[1:]       # "mAP" stays "mAP"
    proxy = "" if name == "accuracy" else (f" (for {name}, those of a proportion of that size: a proxy, as {name} "
                                           "is not a share of images)")
    text = (f"{title} noise band: ±{band:.3f} around the baseline's mean {name} over {len(accs)} "
            f"seed(s) ({seeds}) on {base['val_samples']} held-out samples: the larger of two binomial standard errors "
            f"of a difference{proxy} and two seed-to-seed standard deviations (scaled for comparing a rung's mean over "
            f"its {runs} seed(s) with that mean). Δ is measured from that mean. ")
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
    rates = [r.result["throughput"] for r in done]
    intervals = [r.result.get("throughput_interval") or (v, v) for r, v in zip(done, rates)]
    rate_errors = [[v - lo for v, (lo, hi) in zip(rates, intervals)], [hi - v for v, (lo, hi) in zip(rates, intervals)]]
    columns = Columns.for_settings(result.settings, result.rungs)
    specs = [
        ("throughput", f"{columns.unit} (95% interval bars)", rates, rate_errors),
        ("peak_memory", "peak memory (MiB)", [r.result["peak_memory_bytes"] / 2**20 for r in done], None),
    ]
    if all(r.result.get("accuracy") is not None for r in done):
        held_out = "held-out " + result.settings.get("metric_name", "accuracy")
        specs.append(("accuracy", held_out if not result.settings.get("command") else columns.metric_label,
                      [r.result["accuracy"] for r in done], None))
    paths = []
    for name, ylabel, values, errors in specs:
        fig, ax = plt.subplots(figsize=(8, 3.6), dpi=110)
        bars = ax.bar(range(len(values)), values, yerr=errors, capsize=3, color="#3b75af")
        texts = [fmt_sig(v) for v in values]
        if name == "throughput":     # the verdict against the baseline under each rate
            texts = [t + ("" if r.name == "baseline" else "\n" + short_verdict(r.result).replace("no measurable difference", "no diff."))
                     for t, r in zip(texts, done)]
        ax.bar_label(bars, labels=texts, fontsize=7, padding=2)
        tops = [v + (errors[1][i] if errors else 0) for i, v in enumerate(values)]
        ax.set_ylim(0, max(tops) * 1.25)          # room for the labels above the tallest bar
        if name == "accuracy" and done[0].result.get("accuracy_band"):
            base, band = done[0].result.get("accuracy_reference", done[0].result["accuracy"]), done[0].result["accuracy_band"]
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
