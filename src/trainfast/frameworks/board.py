"""The switchboard: which switches a run asked for, what each framework adapter set in their place, what the
script itself had, and the proof read back from the framework when the run's result is written.

A switch is one framework setting serving one Recipe field (transformers' `optim` serves optimizer_impl; its
`bf16` and `fp16` both serve precision). Its proof is read from the objects the framework ended up with (the
Trainer's arguments, the precision plugin, the optimizer's `fused` flag, the loader's workers), never from
what was asked: a switch whose read-back differs from what was wanted is "not applied", and the ablation
reports it so instead of timing it as "no measurable difference".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

UNSET = "<not set>"       # the script had no value of its own for a setting (the framework's default applied)


def plain(value: Any) -> Any:
    """A value as the result file keeps it: enums by value, classes and other objects by name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    inner = getattr(value, "value", None)
    if isinstance(inner, (str, int)):
        return inner
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


@dataclass
class Switch:
    field: str                     # the Recipe field it serves
    setting: str                   # the framework's name for it
    wanted: Any                    # what this run asked the framework for
    script: Any = UNSET            # what the script had (UNSET: the framework's default)
    read_back: Any = None          # what the framework ended up with (filled when the result is written)
    applied: bool | None = None    # read_back matches wanted; None: nothing could be read back yet

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "setting": self.setting, "wanted": plain(self.wanted),
                "script": plain(self.script), "read_back": plain(self.read_back), "applied": self.applied}


@dataclass
class FrameworkRecord:
    """One framework's switches in this process."""
    name: str                      # "transformers", "lightning", "accelerate"
    version: str
    switches: dict[str, Switch] = field(default_factory=dict)      # by setting
    unsupported: dict[str, str] = field(default_factory=dict)      # Recipe field -> why it has no switch here
    readers: list[Callable[["FrameworkRecord"], None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def set(self, field_: str, setting: str, wanted: Any, script: Any = UNSET) -> Switch:
        """Record that `setting` was set to `wanted` for `field_` (the script's own value kept once: the first
        time a setting is met is the script's)."""
        old = self.switches.get(setting)
        switch = Switch(field_, setting, wanted, old.script if old is not None else script)
        self.switches[setting] = switch
        return switch

    def prove(self, setting: str, read_back: Any, applied: bool | None = None) -> None:
        """The value read back for `setting`; applied unless told otherwise: read_back == wanted."""
        switch = self.switches.get(setting)
        if switch is None:
            return
        switch.read_back = read_back
        switch.applied = (plain(read_back) == plain(switch.wanted)) if applied is None else applied

    def to_dict(self) -> dict[str, Any]:
        for read in self.readers:
            try:
                read(self)
            except Exception as exc:         # a read-back that fails leaves its switches unproven, not the run
                self.notes.append(f"read-back failed: {type(exc).__name__}: {exc}")
        return {"version": self.version, "switches": {k: s.to_dict() for k, s in self.switches.items()},
                "unsupported": dict(self.unsupported), "notes": list(self.notes)}


@dataclass
class Board:
    """Every framework met in this process, for the switches `fields` (the Recipe fields the run asked for)."""
    fields: dict[str, Any]
    frameworks: dict[str, FrameworkRecord] = field(default_factory=dict)
    # Samples in one optimizer step of one process (per-device batch x accumulation), where the framework says:
    # the probe then reports samples/s instead of steps/s.
    samples_per_step: int | None = None
    held: dict[str, Any] = field(default_factory=dict)     # what the adapters' read-backs read, held to the end
    # The evaluation the framework itself computed (the Trainer's evaluate(), Lightning's logged metrics, values
    # given to accelerator.log), by the names the script gave them, latest value kept: they join the run's
    # `reported` dict, where a Session script's tf.report values are, and the ablation judges them alike.
    metrics: dict[str, float] = field(default_factory=dict)
    # The metric the script declares it cares about ({"name", "goal", "source"}: metric_for_best_model, a
    # ModelCheckpoint's monitor), None if it declares none (ablation/metric.py picks another).
    declared: dict[str, Any] | None = None
    # Told each evaluation's numbers as the framework computes them (the probe: a point of the run's curve)
    on_metrics: Callable[[dict[str, float]], None] | None = None

    def record_metrics(self, values: dict[str, Any]) -> None:
        """Keep the numbers among `values` (tensors of one element read out; anything else left alone)."""
        kept = {}
        for name, value in values.items():
            if hasattr(value, "numel") and value.numel() == 1:
                value = value.item()
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                kept[str(name)] = float(value)
        self.metrics.update(kept)
        if kept and self.on_metrics is not None:
            self.on_metrics(kept)

    def declare(self, name: str, goal: str, source: str) -> None:
        """The script's own choice of metric; the first declaration met stands (a script's later Trainer for a
        test pass does not replace the one it trained with)."""
        if self.declared is None and name:
            self.declared = {"name": name, "goal": goal, "source": source}

    def framework(self, name: str, version: str) -> FrameworkRecord:
        if name not in self.frameworks:
            self.frameworks[name] = FrameworkRecord(name, version)
        return self.frameworks[name]

    def asked(self, name: str) -> bool:
        return name in self.fields

    def to_dict(self) -> dict[str, Any]:
        return {name: record.to_dict() for name, record in self.frameworks.items()}

    def overridden(self) -> dict[str, list]:
        """The script's own settings a switch replaced: "framework.setting" -> [the script's, the run's]."""
        return {f"{name}.{s.setting}": [plain(s.script), plain(s.wanted)]
                for name, record in self.frameworks.items() for s in record.switches.values()
                if s.script != UNSET and plain(s.script) != plain(s.wanted)}
