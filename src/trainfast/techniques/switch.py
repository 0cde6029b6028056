"""A switch, declared once: the Recipe fields it owns and everything the rest of trainfast needs to know about it.

Every technique module declares its switch(es) in a module-level `SWITCHES` tuple, next to the code that applies
it. The ladders (ablation), the fields paired timing must not split (paired.py), the fields a resume may change
(checkpoint.py), the tune's priority, what the framework adapters cannot set, `device_model_effect` and the `trainfast
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


def builds_nothing(params: Any, recipe: Any) -> None:
    """The no-op build: the optimizer's class is not this switch's to choose."""
    return None


def keeps(optimizer: Any, value: Any, scheduler: Any = None) -> Any:
    """The no-op rebuild: the optimizer as it is."""
    return optimizer


@dataclass(frozen=True)
class OptimizerSwitch:
    """A switch that acts on the optimizer (its implementation flag, the precision of its state, ...): how the
    built-in run builds it, how a Session and the framework adapters rebuild a user's, and how a run reads it
    back, through the same functions. They are applied in techniques.OPTIMIZER_ORDER.

    label:     the setting as a run records and proves it ("optimizer implementation", "optimizer moments").
    state(optimizer): the setting read back from an optimizer object (the proof a run records under `label`).
    default:   the value that asks for nothing: a Session keeps the user's optimizer as it is.
    build(params, recipe): the built-in run's optimizer, where this switch chooses its class (None: the next
               switch in OPTIMIZER_ORDER builds it; the implementation flag's always does, torch's own class).
    rebuild(optimizer, value, scheduler): the optimizer with `value` (the same object changed in place, or the
               same param groups in another object, `scheduler` rebound to it). Where it cannot, it raises
               ValueError (RecipeError), TypeError or RuntimeError with why (a class with no such flag, ...).
    replaces:  why the later switches in OPTIMIZER_ORDER do not apply while this one's value is not `default`
               (it builds a class of its own that takes none of them); "" where it keeps the class.
    plugins:   {plugin ("deepspeed", "fsdp"): why that plugin decides the setting itself}.
    trainer_optim(value, optim): transformers' TrainingArguments.optim for `value`, given the script's `optim`
               (None: nothing to set); raises ValueError with why where the Trainer has no such choice. None:
               the Trainer has no setting for it.
    trainer_optim_of(optimizer): the `optim` name an optimizer the Trainer built reads as, where this switch
               tells it (None: not this switch's to tell).
    """
    label: str
    state: Callable[[Any], Any]
    default: Any = None
    build: Callable[[Any, Any], Any] = builds_nothing
    rebuild: Callable[..., Any] = keeps
    replaces: str = ""
    plugins: Mapping[str, str] = field(default_factory=dict)
    trainer_optim: Callable[[Any, str], str | None] | None = None
    trainer_optim_of: Callable[[Any], str | None] | None = None


@dataclass(frozen=True)
class ProcessWideSwitch:
    """A switch that belongs to a whole process (a runtime's variable, the C library's allocator, a library-wide
    flag): how every kind of run gets it, and how a running process proves it has it. The ablation's spawn
    environment, a run's read-back and its guard, the framework adapters, a Session and `trainfast train`'s
    start-up all loop over these declarations (techniques/__init__.py), so a new process-wide switch is its module.

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


def no_options(value: Any) -> Mapping[str, Any]:
    return {}


def leave_wrapped(wrapped: Any, value: Any) -> None:
    """Nothing to do to the wrapped module once it is built."""


def reads_nothing(wrapped: Any) -> Any:
    return None


def as_given(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class WrapSwitch:
    """A switch that acts on the data-parallel wrapper (DDP, FSDP2's fully_shard) rather than on the model inside
    it or the whole process: its bucket size, gradient views, a communication hook, resharding after the forward.
    distributed.py builds the wrapper with every declared wrap switch's `options` and then runs each one's
    `apply`, in WRAP_ORDER (techniques/__init__.py); the Session and the built-in run get them through
    build_state, and every run's record reads each one back from the wrapper it built (`state`).

    label:      the setting as a run's proof records it (DDP's `bucket_cap_mb`, FSDP2's `reshard_after_forward`).
    strategies: the wrappers it acts on (Recipe.strategy: "ddp", "fsdp"); another strategy leaves it alone.
    options(value): the wrapper's constructor keywords for the recipe's value ({} where the value asks for the
                wrapper's own default: a default passed explicitly is not always the default, DDP's bucket cap
                keeps a small first bucket only when none is given).
    apply(wrapped, value): what is done to the wrapper once it is built (register a communication hook).
    state(wrapped): the setting read back from the wrapper (DDP keeps `bucket_bytes_cap`,
                `gradient_as_bucket_view`, `static_graph`): the proof every run records.
    ranks:      the fewest processes a job needs for the wrapper to exist: with fewer (one process: no wrapper
                at all) the switch cannot act, and an ablation says "not applicable" instead of timing noise.
    keyword:    the DDP constructor keyword that holds it, its value the switch's: the frameworks' DDP settings take
                it under the same name (Lightning's DDPStrategy(**kwargs), Accelerate's DistributedDataParallelKwargs),
                so their adapters set it there and read it back (frameworks/wrapping.py); "": none can.
    trainer_argument: the transformers TrainingArguments field the Trainer builds its DDP's `keyword` from ("":
                it has none; the switch then declares the Trainer unreachable).
    show(value): the state `value` asks for, as state() reads it (DDP's own default for the value that asks for
                none: the proof of a baseline).
    comm_hook:  a communication hook's name among Accelerate's DDPCommunicationHookType values ("bf16", "fp16",
                "power_sgd"): Accelerate's DistributedDataParallelKwargs(comm_hook=...) registers it on the DDP it
                builds, so its adapter sets it there (frameworks/wrapping.py); "": Accelerate cannot. comm_state(value):
                its comm_state_option for the recipe's value (PowerSGD's rank).
    """
    label: str
    strategies: tuple[str, ...] = ("ddp",)
    options: Callable[[Any], Mapping[str, Any]] = no_options
    apply: Callable[[Any, Any], None] = leave_wrapped
    state: Callable[[Any], Any] = reads_nothing
    ranks: int = 2
    keyword: str = ""
    trainer_argument: str = ""
    show: Callable[[Any], Any] = as_given
    comm_hook: str = ""
    comm_state: Callable[[Any], Mapping[str, Any]] = no_options


@dataclass
class TrainBatches:
    """A run's training batches as the batch switches act on them (BatchSwitch), and what each did there.

    The built-in run describes its own documents (`lengths`; `loader` None: trainfast builds the loader); a Session
    and a framework adapter describe the script's DataLoader (its collate function, the sampler trainfast
    may replace: None where a batch sampler of the script's own draws the batches). The switches' hooks read these,
    return the collate function and sampler the run takes, and write down the settings they made (`settings`:
    (field, setting, wanted, the script's own), a framework run's proof), the values read back (`proofs`) and why
    one could not act (`cannot`, by field; a counting collator keeps the same dict, so a Session reads it after the
    run)."""
    collate: Any
    loader: Any = None
    lengths: list[int] | None = None
    sampler: Any = None
    batch_size: int | None = None
    seed: int = 0
    generator: Any = None
    dist: Any = None
    model: Any = None                 # the model the batches reach (an adapter's: packing needs its position_ids)
    checks_model: bool = False        # a framework's step calls the model: whether it takes the packed rows is checked
    one_row: bool = False             # trainfast's own model's attention skips across documents (flex, flash)
    collate_name: str = "collate_fn"  # the collate function's name in the proof (a Trainer's: data_collator)
    settings: list[tuple[str, str, Any, Any]] = field(default_factory=list)
    proofs: list[tuple[str, Any, bool | None]] = field(default_factory=list)
    cannot: dict[str, str] = field(default_factory=dict)

    def set(self, field_: str, setting: str, wanted: Any, script: Any) -> None:
        self.settings.append((field_, setting, wanted, script))

    def prove(self, setting: str, read_back: Any, applied: bool | None = None) -> None:
        self.proofs.append((setting, read_back, applied))


@dataclass(frozen=True)
class BatchSwitch:
    """A switch that acts on the training batches: how they are collated (padded, rounded, packed) and which
    samples share one (the sampler). The built-in run (tasks/lm.py), a Session's adopted loader (data/adopt.py) and
    every framework adapter (frameworks/packing.py, frameworks/hf.py) loop over these declarations
    (techniques/__init__.py: collate_batches, choose_sampler, batch_refusals), so a new batch switch is its module.
    Every hook is called with the switch's value (only a value that asks for something in a Session or the
    built-in run; a framework run's baseline passes the off value too, so its proof says what the script had).

    collate(batches, value): the collate function the run takes (batches.collate set, replaced or wrapped);
                 None: it leaves the collate function alone.
    wraps:       collate wraps the function rather than setting it: it runs after the switches that set the
                 script's own collator (a wrapper would hide their attribute), on the counting collator.
    counts:      its proof needs the padding of the script's batches counted (text/packing.py's counting
                 collator wraps the script's collate function), and no padding to remove is why it cannot act.
    sampler(batches, value): the sampler drawing the training order (None: the loader's own stands); where it
                 cannot act, why goes to batches.cannot.
    batch_sampler(batches, value): the batch sampler drawing whole batches, each of a size of its own (a token
                 budget); it replaces batch_size and any sampler. None: batch_size samples at a time.
    refuse(collate_fn, value): why the collate function a run ended up with could not take it (None: it could):
                 read after the run, the counting collator's counts and its refusals included.
    state(collate_fn, loader): [(setting, read back, applied or None)]: the proof read at the end of a
                 framework run from what its collator and loader did ("{collate}" in a setting: the collate
                 function's name there).
    arguments(args, value): the framework's own setting where it has one (the Trainer's TrainingArguments): set
                 there, [(setting, wanted, the script's own or None)]; a switch with it is not set on the
                 Trainer's collator. read_arguments(args, loader): [(setting, read back)].
    trainer_refusal(trainer, notes): why a Trainer of the script's own cannot take it (TRL packing itself), the
                 script's setting appended to `notes`; None: it can.
    """
    collate: Callable[[TrainBatches, Any], Any] | None = None
    wraps: bool = False
    counts: bool = False
    sampler: Callable[[TrainBatches, Any], Any] | None = None
    batch_sampler: Callable[[TrainBatches, Any], Any] | None = None
    refuse: Callable[[Any, Any], str | None] | None = None
    state: Callable[[Any, Any], list[tuple[str, Any, bool | None]]] | None = None
    arguments: Callable[[Any, Any], list[tuple[str, Any, Any]]] | None = None
    read_arguments: Callable[[Any, Any], list[tuple[str, Any]]] | None = None
    trainer_refusal: Callable[[Any, list[str]], str | None] | None = None


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
class RunContext:
    """What a run is, as far as whether a switch can act in it: what a switch's `context_effect` and the world-size
    judgement (Switch.ranks) read. A part not known before the run (a script's model, data, saves or workers) is None,
    and counts as acting: only what is known rules a switch out.

    device:   the torch.device the run trains on.
    model:    the model the switches would act on (None: a script's, not known before it runs).
    split:    the run's data (None: not known yet).
    ranks:    the processes of the job (its world size); strategy: its wrapper (Recipe.strategy), None if not known.
    builtin:  trainfast's own loop runs the steps (engine.py): what it does itself, a switch cannot add.
    saves:    whether the run saves checkpoints during its steps (None: not known).
    workers:  the loader's worker processes (None: not known).
    """
    device: Any = None
    model: Any = None
    split: Any = None
    ranks: int = 1
    strategy: str | None = None
    builtin: bool = False
    saves: bool | None = None
    workers: int | None = None


@dataclass(frozen=True)
class Switch:
    """One switch (or one group of settings), declared next to its code.

    fields:     the Recipe fields it owns (each field has exactly one owner; tests/test_switches.py checks).
    rungs:      its rungs in the ablation ladders (none: a setting, not a measured switch).
    own_process: the setting belongs to the whole process (a global flag, the allocator, worker processes,
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
    optimizer:  how it builds, rebuilds and reads back the optimizer, for the switches that act on it
                (OptimizerSwitch); its field is placed in techniques/__init__.py's OPTIMIZER_ORDER.
    process_wide: how a process-wide switch reaches every process and is read back (ProcessWideSwitch); its module
                is named in techniques/__init__.py's PROCESS_WIDE_MODULES (read before torch loads).
    wrap:       how it acts on the DDP / FSDP2 wrapper, for the switches that do (WrapSwitch); its field is placed
                in techniques/__init__.py's WRAP_ORDER.
    batch:      how it acts on the training batches (BatchSwitch: their collate function, their sampler).
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
    context_effect(run): whether it can act in this run (RunContext: the loop that runs the steps, its saves, its
                loader workers): an Effect with the reason where the run leaves it nothing to change; None: it acts
                in any run the device, model and data allow.
    observed:   the key of a script's observed section (probe/observe.py) that shows it on, read there from the
                objects the script ran (its autocast, its model, its optimizer, its loader), whoever set them: its
                first field is what the section's `by` says trainfast or the script turned on. "": not observed.
    """
    fields: tuple[str, ...]
    rungs: tuple[RungSpec, ...] = ()
    own_process: bool = False
    resumable: bool | tuple[str, ...] = False
    frameworks: Mapping[str, str] = field(default_factory=dict)
    unreachable: Mapping[str, str] = field(default_factory=dict)
    served_value: Any = None
    device_effect: Callable[[torch.device], Effect] | None = None
    model_effect: Callable[[nn.Module], Effect] | None = None
    value_effect: Callable[[Any, torch.device, nn.Module | None], Effect] | None = None
    data: str = ""
    model: ModelSwitch | None = None
    optimizer: OptimizerSwitch | None = None
    process_wide: ProcessWideSwitch | None = None
    changes_math: bool = False
    wrap: WrapSwitch | None = None
    batch: BatchSwitch | None = None
    data_idle: str = ""
    prepare: Callable[[Any, Any], Any] | None = None
    shrinks: Mapping[str, str] = field(default_factory=dict)
    loss: LossSwitch | None = None
    rewrite: RecipeRewrite | None = None
    context_effect: Callable[[RunContext], Effect] | None = None
    observed: str = ""

    @property
    def name(self) -> str:
        """The switch's name: its rung's when it has one, else its first field's."""
        return self.rungs[0].name if len(self.rungs) == 1 else self.fields[0]

    @property
    def resumable_fields(self) -> tuple[str, ...]:
        return self.fields if self.resumable is True else tuple(self.resumable or ())

    @property
    def ranks(self) -> int:
        """The fewest processes of a job it can act in (a wrap switch's wrapper exists only with several)."""
        return self.wrap.ranks if self.wrap is not None else 1

    def reason_unreachable(self, adapter: str) -> str | None:
        return self.unreachable.get(adapter) or self.unreachable.get(EVERY_ADAPTER)


def setting(*fields: str, own_process: bool = False, resumable: bool = False, unreachable: str = "") -> Switch:
    """A Recipe field that is part of what is trained or how the run behaves, not a speed switch: no rung, and
    the framework adapters leave it to the script (`unreachable`, when a rung could carry it)."""
    return Switch(tuple(fields), own_process=own_process, resumable=resumable,
                  unreachable={EVERY_ADAPTER: unreachable} if unreachable else {})
