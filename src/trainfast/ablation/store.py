"""The run store: an ablation's folder, so an interrupted ablation resumes instead of starting over.

`out/plan.json` holds the plan (the settings that decide what runs), `out/runs/<rung>-r<i>.json` one finished
run each (the probe's record), both written atomically. With resume, a finished run is read back instead of
run again; a plan that differs from the folder's is refused with the differences named, never mixed. A folder an
earlier version wrote is read here and only here, in today's names (DESCRIPTIVE, comparable_plan, current_record).
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from ..checkpoint import atomic_write_text
from ..recipe import Recipe, RecipeError


# Settings that name what is measured without changing what runs (the metric's name and column, the rate's unit): a
# folder written before one of them was renamed (detection's rate in images/s, once samples/s) still resumes.
DESCRIPTIVE = frozenset({"metric_name", "metric_label", "rate_unit"})


def default_out_dir(kind: str = "ablate") -> Path:
    return Path("runs") / datetime.now().strftime(f"{kind}-%Y%m%d-%H%M%S")


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON, written atomically (values JSON does not know are written as text)."""
    atomic_write_text(path, json.dumps(data, indent=1, default=str))


def jsonable(value: Any) -> Any:
    """`value` as it reads back from JSON (what plan.json holds), for comparing a plan with a folder's."""
    return json.loads(json.dumps(value, default=str))


def comparable_plan(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new` (this command's plan, as JSON) as the folder's plan `old` would have written it: a Recipe field added
    since the folder was written, at its default in every rung, changes nothing that runs, so it is left out of
    the comparison (each new switch would otherwise make every older folder unresumable)."""
    old_rungs, new_rungs = old.get("rungs"), new.get("rungs")
    if not isinstance(old_rungs, dict) or not isinstance(new_rungs, dict):
        return new
    defaults = jsonable(Recipe().to_dict())
    trimmed = {}
    for name, recipe in new_rungs.items():
        before = old_rungs.get(name)
        if isinstance(before, dict) and isinstance(recipe, dict):
            recipe = {k: v for k, v in recipe.items() if k in before or k not in defaults or v != defaults[k]}
        trimmed[name] = recipe
    return {**new, "rungs": trimmed}


# The observed section's keys (probe/observe.py) that an earlier version wrote under another name: the optimizer's
# implementation was keyed by its switch's field.
OBSERVED_RENAMED = {"optimizer_impl": "optimizer_implementation"}


def current_record(record: dict[str, Any], metric_name: str | None) -> dict[str, Any]:
    """A finished run's record in today's names, whatever version wrote it. A built-in run's record written before
    `metric` ({"name", "goal", "value"}) held its task's judged value in `accuracy` (a language model's validation
    loss, a detector's mAP too): it is moved to `metric`, named as the folder's plan names it (`metric_name`; its
    goal is the ladder's, decided again on resume). A script's observed section takes today's keys
    (OBSERVED_RENAMED), its `by` too."""
    upgraded = dict(record)
    if "metric" not in record and "accuracy" in record:
        value = upgraded.pop("accuracy")
        upgraded["metric"] = {"name": metric_name, "goal": None, "value": value}
    seen = record.get("observed")
    if isinstance(seen, dict):
        upgraded["observed"] = renamed(seen)
        if isinstance(seen.get("by"), dict):
            upgraded["observed"]["by"] = renamed(seen["by"])
    return upgraded


def renamed(section: dict[str, Any]) -> dict[str, Any]:
    return {OBSERVED_RENAMED.get(key, key): value for key, value in section.items()}


class RunStore:
    def __init__(self, out_dir: Path, settings: dict[str, Any], resume: bool) -> None:
        self.dir = out_dir / "runs"
        plan_path = out_dir / "plan.json"
        if plan_path.exists():
            if not resume:
                raise RecipeError(f"{out_dir} already holds an ablation: pass --resume to continue it, or "
                                  "choose another --out")
            old = json.loads(plan_path.read_text())
            new = comparable_plan(old, jsonable(settings))
            diff = [k for k in sorted((set(old) | set(new)) - DESCRIPTIVE) if old.get(k) != new.get(k)]
            if diff:
                raise RecipeError(f"--resume: the plan in {plan_path} differs from this command in "
                                  + "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} here" for k in diff))
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json(plan_path, settings)
        self.resume = resume
        self.metric_name = settings.get("metric_name")

    def load(self, key: str) -> dict[str, Any] | None:
        path = self.dir / f"{key}.json"
        if not self.resume or not path.exists():
            return None
        result = current_record(json.loads(path.read_text()), self.metric_name)
        result["reused"] = True
        return result

    def holds(self, key: str) -> bool:
        """Whether a resumed ladder will read `key`'s run back (load) rather than run it."""
        return self.resume and (self.dir / f"{key}.json").exists()

    def save(self, key: str, result: dict[str, Any]) -> None:
        write_json(self.dir / f"{key}.json", result)
