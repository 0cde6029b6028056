"""What the doctor says: the ranked findings of its observations printed (print_findings), written to
doctor.json (write_doctor) and into an ablation's report.md beside it (doctor)."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..checks import Finding, Observations, run_checks, untimed
from ..report import doctor_section, replace_doctor_section, saves_text


def write_doctor(out_dir: Path, obs: Observations, findings: list[Finding]) -> Path:
    from ..checkpoint import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "doctor.json"
    step = obs.step_s
    atomic_write_text(path, json.dumps({
        "source": obs.source, "device": obs.device,
        "step_s": step, "steps_run": obs.steps_run, "timed_steps": len(obs.step_seconds),
        "findings": [f.to_dict() for f in findings],
        "observations": asdict(obs)}, indent=1, default=str))
    return path


def print_findings(findings: list[Finding], obs: Observations, console=None) -> None:
    """The ranked list as a table (what, verdict, what fixing it saves), then each finding's evidence and fix."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    style = {"problem": "bold red", "switch": "yellow", "fine": "green", "measured": "cyan", "not checked here": "dim"}
    step = f" of {obs.step_s * 1e3:.1f} ms (median)" if obs.step_seconds else ""
    table = Table(title=f"trainfast doctor: {obs.source} run on {obs.device}, {len(obs.step_seconds)} timed "
                        f"steps{step}")
    for col in ("#", "status", "check", "saves per step"):
        table.add_column(col)
    for i, f in enumerate(findings, 1):
        table.add_row(str(i), f"[{style.get(f.status, '')}]{f.status}[/]", f.name,
                      saves_text(f.cost_s, f.share, f.status))
    console.print(table)
    if obs.steps_run and not obs.step_seconds:
        console.print(f"[bold]note:[/bold] {untimed(obs)}", highlight=False)
    for i, f in enumerate(findings, 1):
        console.print(f"[bold]{i}. {f.name}[/bold] [{style.get(f.status, '')}]{f.status}[/]: {f.evidence}",
                      highlight=False)
        if f.fix and f.status in ("problem", "switch"):
            console.print(f"   [bold]fix:[/bold] {f.fix}", highlight=False)
    problems = [f for f in findings if f.status == "problem"]
    console.print(f"{len(problems)} problem(s)" + (": fix them in the order above (the costliest measured first)"
                                                    if problems else "; nothing to fix in what was checked"))


def doctor(obs: Observations, out_dir: str | Path, show: bool = True) -> list[Finding]:
    """The ranked findings of these observations: printed (show), written to out_dir/doctor.json, and into
    an ablation's report.md there if one exists."""
    out_dir = Path(out_dir)
    findings = run_checks(obs)
    write_doctor(out_dir, obs, findings)
    replace_doctor_section(out_dir / "report.md", doctor_section(out_dir))
    if show:
        print_findings(findings, obs)
    return findings
