"""report.md's "Doctor" section, from the doctor.json that `trainfast doctor --out DIR` writes into an
ablation's folder. doctor.json is read as plain JSON (each finding a dict of name, status, evidence, fix,
cost_s, share), so the report depends on the file's format, not on the doctor's code."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..checkpoint import atomic_write_text

FINDING_KEYS = ("name", "status", "evidence")     # what a finding needs to be listed (its fix may be "")


def saves_text(cost_s: float | None, share: float | None, status: str) -> str:
    """What fixing a finding saves per step: '3.2 ms (14%)'; 'not measured' for a problem with no cost; '' for
    anything that is not a problem or a switch the loop could take (checks/switches.py)."""
    if status not in ("problem", "switch"):
        return ""
    if cost_s is None:
        return "not measured"
    fraction = "" if share is None else f" ({100 * share:.0f}%)" if share >= 0.01 else " (<1%)"
    return f"{cost_s * 1e3:.3g} ms{fraction}"


def read_findings(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """doctor.json's data and its findings; ValueError, KeyError or TypeError when it is not one."""
    data = json.loads(path.read_text())
    findings = data["findings"]
    if not isinstance(findings, list):
        raise TypeError(f"findings is a {type(findings).__name__}, not a list")
    for f in findings:
        if not isinstance(f, dict):
            raise TypeError(f"a finding is a {type(f).__name__}, not an object")
        missing = [k for k in FINDING_KEYS if k not in f]
        if missing:
            raise KeyError(f"a finding has no {', '.join(missing)}")
    return data, findings


def doctor_section(out_dir: str | Path) -> list[str]:
    """report.md's "Doctor" section from a doctor.json in out_dir, or nothing when there is none: the problems,
    ranked, and how many checks were fine."""
    path = Path(out_dir) / "doctor.json"
    if not path.is_file():
        return []
    try:
        data, findings = read_findings(path)
    except (ValueError, KeyError, TypeError) as exc:
        return ["## Doctor", "", f"{path.name} could not be read ({exc}).", ""]
    problems = [f for f in findings if f["status"] == "problem"]
    lines = ["## Doctor", "", f"From `{path.name}` ({data.get('source')} run on {data.get('device')}): "
             f"{len(problems)} problem(s), {sum(f['status'] == 'fine' for f in findings)} check(s) fine, "
             f"{sum(f['status'] == 'not checked here' for f in findings)} not checked here.", ""]
    lines += [f"{i}. **{f['name']}** ({saves_text(f.get('cost_s'), f.get('share'), f['status'])} per step): "
              f"{f['evidence']}. Fix: {f.get('fix', '')}" for i, f in enumerate(problems, 1)]
    return lines + [""] if problems else lines


def replace_doctor_section(report_md: str | Path, lines: list[str]) -> bool:
    """An existing report.md gets `lines` as its Doctor section, in place of an older one, before its
    Recommendation (at the end when it has none); True when one was updated, False when there is no report."""
    path = Path(report_md)
    if not path.is_file():
        return False
    text = path.read_text()
    start = text.find("\n## Doctor\n")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start + 1] + (text[end + 1:] if end >= 0 else "")
    section = "\n".join(lines) + "\n"
    at = text.find("## Recommendation")
    text = text[:at] + section + text[at:] if at >= 0 else text.rstrip("\n") + "\n\n" + section
    atomic_write_text(path, text)
    return True
