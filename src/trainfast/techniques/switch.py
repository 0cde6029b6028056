"""A switch, declared once: the Recipe fields it owns and everything the rest of trainfast needs to know about it.

Every technique module declares its switch(es) in a module-level `SWITCHES` tuple, next to the code that applies
it. The ladders (ablation), the fields paired timing must not split (paired.py), the fields a resume may change
(checkpoint.py), the tune's priority, what the framework adapters cannot set, `field_effect` and the `trainfast
switches` table are all derived from these declarations (techniques/__init__.py), so adding a switch is its module
and its Recipe field: no table elsewhere to remember. A Recipe field that is not a speed switch (epochs, lr, the
non-finite policy, ...) is declared too, as a `Switch` with no rung, so every field has exactly one owner and its
process scope and resumability are written down where it is defined.

This module imports nothing heavy: techniques/threads.py is read before torch loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .base import Effect

ADAPTERS = ("transformers", "lightning", "accelerate")   # the framework adapters (frameworks/): each switch says
EVERY_ADAPTER = "*"                                      # how each sets it, or why it cannot
ON_MODEL = "the model, before the framework wraps it (the switch's own apply_model, read back from the model)"
AMP = "{amp}"            # a rung's value replaced by the half type chosen for the device (bf16 or fp16)
# The kinds of data a switch can act on (Switch.data), each with what it is: a task offers some of them
# (tasks/base.py: Task.offers) and rules out, with this text as the reason, a switch on a kind it does not offer.
DATA_KINDS = {
    "": "any data",
    "images": "image batches (NCHW tensors a conv net reads)",
    "stacked": "batches stacked at one shape (copied into recycled buffers of that shape)",
    "image_folder": "image-folder files decoded per sample (--data imagefolder:PATH)",
    "padded_sizes": "detection images of different sizes, padded per batch by the model (--task detection)",
    "documents": "a language model's documents of different lengths, padded per batch (--task lm)",
}


@dataclass(frozen=True)
class RungSpec:
    """One rung of the ablation ladders: its name (what --switches takes), the fields it changes and its place.

    `place` orders every ladder (the lower, the earlier; in a cumulative ladder a rung inherits every rung above
    it). `default_in`: the tasks whose default ladder runs it (others name it with --switches). `places`: a task
    where it sits elsewhere. `tasks`: the tasks that can name it at all (None: every task; a task still rules out a
    rung on data it does not offer, and refuses one that cannot work for it, each with the reason). `tune`: its
    priority in the tune's first stage, where a tight budget cuts the last ones (None: not tried there);
    `tune_inputs`: tried in the tune's input stage, once the recipe waits for its batches; `tune_changes(recipe,
    cpus)`: the rungs (name, changes) that stage tries on top of `recipe` with `cpus` usable CPUs (None: this
    rung's own changes, where the recipe does not have them yet). `tune_memory`: its order in the memory stage
    (--memory-limit: each alone, then all together, at the full batch); `tune_target`: its order among the
    candidates the to-target stage (--target) tries on top of the rate pick (a switch that changes the math).
    `held_note`: (its order, its words) among the input switches the report names where an epoch is held by its
    input and the rung lacks them (each where it can act on the run's device and data)."""
    name: str
    changes: Mapping[str, Any]
    place: float
    default_in: tuple[str, ...] = ()
    places: Mapping[str, float] = field(default_factory=dict)
    tasks: tuple[str, ...] | None = None
    tune: float | None = None
    tune_inputs: float | None = None
    tune_changes: Callable[[Any, int], list[tuple[str, dict[str, Any]]]] | None = None
    tune_memory: float | None = None
    tune_target: float | None = None
    held_note: tuple[float, str] | None = None

    def tune_steps(self, recipe, cpus: int) -> list[tuple[str, dict[str, Any]]]:
        """The input stage's rungs for this switch on top of `recipe` (tune/inputs.py)."""
        if self.tune_changes is not None:
            return self.tune_changes(recipe, cpus)
        if all(getattr(recipe, name) == value for name, value in self.changes.items()):
            return []
        return [(self.name, dict(self.changes))]

    def place_in(self, task: str) -> float:
        return self.places.get(task, self.place)

    def named_in(self, task: str | None) -> bool:
        """Whether `task` can name it; None (a user's script, whose task is not known): every rung."""
        return self.tasks is None or task is None or task in self.tasks


@dataclass(frozen=True)
class ModelSwitch:
    """A switch that acts on the model object itself (its memory format, its checkpointing): how the built-in
    run, a Session and every framework adapter set it, through the same functions.

    apply(model, value): the model with the switch set to `value`, on or off (off undoes what a script did
    itself); state(model): the setting read back, the proof a run records under `label`; show(value): the state
    `value` asks for, as state() reads it; a state equal to `default` is the framework's own default (recorded as
    "not set" for the script); target(model): the module inside `model` that holds the switch (a wrapper or a
    LightningModule around a timm/transformers model), `model` itself when None. `idle`: values that ask for
    nothing (the attention backend's "model": the script's own stands), neither set nor proven."""
    label: str
    apply: Callable[[Any, Any], Any]
    state: Callable[[Any], Any]
    show: Callable[[Any], Any] = bool
    default: Any = None
    target: Callable[[Any], Any] | None = None
    idle: tuple = ()


@dataclass(frozen=True)
class ProcessSwitch:
    """A switch that belongs to a whole process (a runtime's variable, the C library's allocator, a library-wide
    flag): how every kind of run gets it, and how a running process proves it has it. The ablation's spawn
    environment, a run's read-back and its guard, the framework adapters, a Session and `trainfast train`'s
    start-up all loop over these declarations (techniques/__init__.py), so a new process switch is its module.

    label:        the setting as a run's proof records it (the variable, the library flag).
    environ():    the variables a process starts with to have it ({} where it cannot act here): the ablation adds
                  them to every run's environment, a built-in rung's and a user's command's alike.
    in_effect():  whether this process has it (what every run records, and what the guard checks before timing).
    apply(on):    set it (or undo what this module set) in a running process; None where only a process's start
                  can. A user's command gets it as soon as it imports torch, whatever its code (no Session needed).
    before_torch(): what `trainfast train` does before it imports torch when the recipe asks for it (a variable a
                  runtime reads once, as it loads); a switch with one is never timed in a process forked from one
                  that already loaded torch, and a Session that starts too late says so (`late`).
    keep:         how a user keeps it in a script trainfast cannot reach (no Session, no framework adapter).
    late:         said when a Session asks for it in a process that started without it (before_torch switches).
    """
    label: str
    environ: Callable[[], Mapping[str, str]]
    in_effect: Callable[[], bool]
    keep: str
    apply: Callable[[bool], bool] | None = None
    before_torch: Callable[[], bool] | None = None
    late: str = ""


@dataclass(frozen=True)
class LossSwitch:
    """A switch that replaces how a task computes its own loss (the next-token loss in chunks): the loss the step
    and evaluation call instead of the task's. It reaches only a loop whose task computes the loss (the built-in
    run); a script's loss is computed by its own code, so a Session there reports it in unsupported().

    task:        the task whose loss it provides (its rung names that task alone).
    loss(model, inputs, labels) -> loss: the training step's loss.
    loss_sum(model, inputs, labels) -> (summed loss, predicted count): evaluation's, so a run's peak stays the step's.
    excludes:    the switches it cannot be combined with, each with why; two loss switches on at once are refused
                 too (a task has one loss).
    unreachable: why it cannot reach a script's own loss (what Session.unsupported() says).
    """
    task: str
    loss: Callable[[Any, Any, Any], Any]
    loss_sum: Callable[[Any, Any, Any], Any]
    unreachable: str
    excludes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecipeRewrite:
    """A switch that is arithmetic on other Recipe fields (a bigger batch, with the learning rate and warm-up
    following it): made concrete once, where a recipe becomes concrete (the built-in run's Session, `trainfast
    train`'s step count, the tune's candidates), and never by changing a Session's recipe from outside.

    apply(recipe): the concrete recipe, the switch back at its no-op value, so applying it twice is applying once.
    asks(recipe):  whether `recipe` still asks for it (not concrete yet).
    own_loop:      why a script's own loop cannot get it (it builds its own loader, optimizer and schedule): what
                   Session.unsupported() says.
    settings(fields, current): for a framework that keeps the same numbers as settings of its own (a Trainer's
                   batch size, learning rate, warm-up): the run's switched `fields` and the framework's `current`
                   values of the Recipe fields it makes concrete -> {Recipe field: (value, the switched field that
                   decides it)}; {} where `fields` does not ask for it.
    """
    apply: Callable[[Any], Any]
    asks: Callable[[Any], bool]
    own_loop: str
    settings: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, tuple[Any, str]]] | None = None


@dataclass(frozen=True)
class Switch:
    """One switch (or one group of settings), declared next to its code.

    fields:     the Recipe fields it owns (each field has exactly one owner; tests/test_switches.py checks).
    rungs:      its rungs in the ablation ladders (none: a setting, not a measured switch).
    process:    the setting belongs to the whole process (a global flag, the allocator, worker processes,
                saves, ranks): a rung that changes it is never timed in one process beside the baseline.
    resumable:  it may change between a run and its resume without changing the trajectory (True: every
                field it owns; a tuple: those fields).
    frameworks: how each framework adapter (ADAPTERS) sets it: the framework's own setting, or ON_MODEL.
    unreachable: why an adapter cannot set it ({adapter or EVERY_ADAPTER: reason}), said before a run;
    served_value: the one value every framework gives it anyway (precision_level's "autocast": their mixed
                precision is O1), which a run may ask for where the switch is otherwise unreachable.
    device_effect / model_effect: whether it can act on this device / this model (an Effect with the reason);
                None: it acts everywhere. A model of None (a script's, not known before it runs) counts as acting.
    value_effect: for a switch of several values (the attention backend), whether this value can act on this
                device and model: value_effect(value, device, model).
    data:       the kind of data it acts on (DATA_KINDS): a task that does not offer it rules the switch out
                (tasks/base.py), one that does judges its data (tasks/effects.py): "" any data, "images" image
                batches, "stacked" batches of one shape, "image_folder" files decoded per sample, "padded_sizes"
                detection images of different sizes, "documents" language-model documents of different lengths.
    model:      how it acts on the model object, for the switches that do (ModelSwitch).
    process_hooks: how a process-wide switch reaches every process and is read back (ProcessSwitch); its module
                is named in techniques/__init__.py's PROCESS_MODULES (read before torch loads).
    changes_math: it changes the arithmetic of training, not only its speed (the batch size, the rounding of a
                half precision, which samples share a batch, the loss's normalization, quantized optimizer
                state): a run with it follows another trajectory, so it is judged on the time to reach a target
                loss or accuracy, not on its rate alone. False: the same update up to float reordering.
    data_idle:  said where the task offers its kind of data but this run's data is not of it (the decode cache on
                data already in memory): a no-effect, something a user can turn on that does nothing here; "" (the
                default): not applicable to this data.
    prepare(split, recipe): what a run with it reads, made once before the runs that turn it on (the decode cache,
                built on disk once so each run opens it rather than each building it); `recipe` is one of theirs.
    shrinks:    the memory it shrinks, by the category a step's memory is split into (measure/memory.py: ITEMS), each
                with the switch in words: what the memory breakdown names where that category holds the most.
    loss:       how it replaces the task's own loss, for the switches that do (LossSwitch).
    rewrite:    how it is made concrete on the recipe's other fields, for the switches that are arithmetic on them
                (RecipeRewrite).
    """
    fields: tuple[str, ...]
    rungs: tuple[RungSpec, ...] = ()
    process: bool = False
    resumable: bool | tuple[str, ...] = False
    frameworks: Mapping[str, str] = field(default_factory=dict)
    unreachable: Mapping[str, str] = field(default_factory=dict)
    served_value: Any = None
    device_effect: Callable[[torch.device], Effect] | None = None
    model_effect: Callable[[nn.Module], Effect] | None = None
    value_effect: Callable[[Any, torch.device, nn.Module | None], Effect] | None = None
    data: str = ""
    model: ModelSwitch | None = None
    process_hooks: ProcessSwitch | None = None
    changes_math: bool = False
    data_idle: str = ""
    prepare: Callable[[Any, Any], Any] | None = None
    shrinks: Mapping[str, str] = field(default_factory=dict)
    loss: LossSwitch | None = None
    rewrite: RecipeRewrite | None = None

    @property
    def name(self) -> str:
        """The switch's name: its rung's when it has one, else its first field's."""
        return self.rungs[0].name if len(self.rungs) == 1 else self.fields[0]

    @property
    def resumable_fields(self) -> tuple[str, ...]:
        return self.fields if self.resumable is True else tuple(self.resumable or ())

    def reason_unreachable(self, adapter: str) -> str | None:
        return self.unreachable.get(adapter) or self.unreachable.get(EVERY_ADAPTER)


def setting(*fields: str, process: bool = False, resumable: bool = False, unreachable: str = "") -> Switch:
    """A Recipe field that is part of what is trained or how the run behaves, not a speed switch: no rung, and
    the framework adapters leave it to the script (`unreachable`, when a rung could carry it)."""
    return Switch(tuple(fields), process=process, resumable=resumable,
                  unreachable={EVERY_ADAPTER: unreachable} if unreachable else {})
