"""The Task base: what every task declares (readable without torch), and every method a caller uses.

A task is two things. Its declaration (TaskDeclaration: the metric every rung is judged on, the unit its rate counts,
the kinds of data it offers, where `trainfast train` starts, what it refuses) is plain data in a module that imports
no torch (tasks/declarations.py), so the command line reads it and refuses what cannot work before torch loads. Its
implementation (a Task subclass: the step, evaluation, data and model) imports torch, and is imported only when a
task object is built (tasks/__init__.py: build_task). A Task reads its declarations from its `declaration`, so the
two cannot drift.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable

from ..recipe import Recipe, RecipeError
from ..techniques.base import Effect
from ..techniques.static import declared_data
from ..techniques.switch import DATA_KINDS

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class Metric:
    """The number every rung of an ablation is judged on, as the task computes it on held-out data."""
    name: str            # in the report's sentences and results.json: "accuracy", "mAP", "validation loss"
    label: str           # the ablation table's column: "val acc", "mAP", "val loss"
    goal: str = "max"    # "max": higher is better; "min": lower is better

    def value(self, value: float | None) -> dict[str, Any]:
        """The neutral record of one run's (or rung's) metric: {"name", "goal", "value"}."""
        return {"name": self.name, "goal": self.goal, "value": value}


@dataclass(frozen=True)
class TaskDeclaration:
    """What a task declares, read by the rest of trainfast instead of probing a task object, and by the command line
    before torch loads. `refusals`: the task's own rules beyond its data (each recipe -> why it cannot work, or None),
    refused by validate() after the switches on data it does not offer."""
    name: str
    metric: Metric
    rate_unit: str                       # what its rate counts per second: "samples", "images", "tokens"
    # The kinds of data (techniques/switch.py: DATA_KINDS) its batches are: a switch declared on another kind has
    # nothing to act on here. "" (any data) is offered by every task.
    offers: frozenset[str]
    batches: str                         # its batches in words, the second half of a ruled-out switch's reason
    implementation: str                  # "package.module:Class", imported when a task is built
    default_model: str
    default_data: str
    default_recipe: Recipe = Recipe()    # where `trainfast train` starts when no --recipe is given
    loss_terms: bool = False             # the loss is a dict of named terms: logged each, key sets compared on ranks
    models: tuple[str, ...] = ()         # the model names that make a run this task (--task inferred from --model)
    split_class: str = ""                # "package.module:Class": the data (a split) that makes a run this task
    check_name: Callable[[str], None] | None = None   # refuses a model name it does not have (None: judged later)
    folders: tuple[str, ...] = ()        # the --data kinds whose value is a folder (KIND:PATH)
    parse_data: Callable[[str], Any] | None = None    # its --data parser (dataspecs.py: no torch)
    image_size: str = ""                 # why --image-size means nothing to it ("": it takes one)
    commands: tuple[str, ...] = ("ablate", "tune", "doctor", "train")   # the subcommands that run its built-in work
    refusals: tuple[Callable[[Recipe], str | None], ...] = field(default=())
    # The switches whose rungs it does not run, each with why: ruled out as not applicable (a rung named with
    # --switches is said, not refused, as any switch with nothing to act on is).
    not_run: dict[str, str] = field(default_factory=dict)

    @property
    def ladder(self) -> str:
        """The name of its default ladder (ablation/ladders.py: LADDERS): each task has its own, by its name."""
        return self.name

    # --- which switches its data offers something to, and what else it refuses -------------------------
    def data_reason(self, field_name: str) -> str | None:
        """Why the switch owning `field_name` has nothing to act on in this task's data (its declared kind is not
        offered), or None."""
        kind = declared_data().get(field_name, "")
        if kind in self.offers:
            return None
        return f"{field_name} acts on {DATA_KINDS[kind]}; the {self.name} task's batches are {self.batches}"

    def rules_out(self, changes: dict[str, Any]) -> str | None:
        """Why a rung that switches `changes` cannot act in this task (every reason, once), or None."""
        reasons = [why for why in map(self.data_reason, changes) if why]
        return "; ".join(dict.fromkeys(reasons)) or None

    def validate(self, recipe: Recipe) -> None:
        """What cannot work for this task, refused before any work starts: a switch turned on (away from the default)
        whose data this task does not offer, then the task's own refusals."""
        default = Recipe()
        for name, value in recipe.to_dict().items():
            why = self.data_reason(name) if value != getattr(default, name) else None
            if why:
                raise RecipeError(f"{name}={value!r}: {why}")
        for refusal in self.refusals:
            why = refusal(recipe)
            if why:
                raise RecipeError(why)

    def check_image_size(self, image_size: int | None) -> None:
        if image_size is not None and self.image_size:
            raise RecipeError(f"--image-size {image_size}: {self.image_size}")

    def check_data(self, spec: str | None) -> None:
        """A --data spec none of its loaders reads, refused by the loaders' own parser before any work starts."""
        if spec is not None and self.parse_data is not None:
            self.parse_data(spec)

    def check_command(self, command: str) -> None:
        """A subcommand that has no built-in work for this task (its -- COMMAND form still runs a script)."""
        if command not in self.commands:
            raise RecipeError(f"trainfast {command} runs the built-in classification run only; measure --task "
                              f"{self.name} with trainfast ablate (or {command} -- python your_script.py)")


class Declared:
    """A Task attribute that is its declaration's (on the class and on its objects alike)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = name

    def __get__(self, task: Task | None, cls: type[Task]) -> Any:
        return getattr(cls.declaration, self.field)


class Task(ABC):
    """A task's implementation: the few points where tasks differ, so the training step (engine.py) never branches
    on the task. Abstract where each task has its own; the shared rules (which switches it rules out, how a batch is
    counted, its warm-up) are defaults here. Its declarations are its `declaration`'s."""
    declaration: ClassVar[TaskDeclaration]
    name = Declared()
    metric = Declared()
    rate_unit = Declared()
    offers = Declared()
    batches = Declared()
    loss_terms = Declared()
    default_model = Declared()
    default_data = Declared()
    default_recipe = Declared()
    ladder = Declared()
    loss_fn: Callable | None = None      # a loss on the model's outputs, where the task has one (the doctor's FLOPs)

    def __init__(self, loss_fn: Callable | None = None, dist=None, recipe: Recipe | None = None) -> None:
        """How build_task makes every task. `loss_fn`: a loss on the model's outputs (a task whose model computes
        its own refuses one); `dist`: the run's Dist, whose criterion wraps the training loss (strategy=dp computes
        it inside each replica); `recipe`: the run's, for a task whose own step a switch acts on."""

    # --- the declarations' rules -------------------------------------------------------------------------
    def data_reason(self, field: str) -> str | None:
        return self.declaration.data_reason(field)

    def rules_out(self, changes: dict[str, Any]) -> str | None:
        return self.declaration.rules_out(changes)

    def validate(self, recipe: Recipe) -> None:
        self.declaration.validate(recipe)

    def check_model(self, name: str) -> None:
        """A model name it does not have, refused before any work starts (the declaration's check by default)."""
        if self.declaration.check_name is not None:
            self.declaration.check_name(name)

    def task_effect(self, field: str, device: torch.device, model: nn.Module | None, split,
                     value: Any = None) -> Effect:
        """Whether a switch can act here: ruled out where this task does not offer its data or does not run it
        (TaskDeclaration.not_run), else the techniques' judgement of the device and model and the data's own
        (tasks/effects.py)."""
        from .effects import data_effect

        why = self.data_reason(field) or self.declaration.not_run.get(field)
        if why:
            return Effect(False, why, applies=False)
        return data_effect(field, device, model, split, value)

    # --- what most tasks share ---------------------------------------------------------------------------
    def count_batch(self, batch: Any) -> int:
        """How many `rate_unit` a training batch holds (its samples; a batch that says what its rate counts, a
        language model's real tokens, by that): the clock counts batches the same way (measure.clock.batch_samples),
        so a run's record and the report say one unit. (measure imports torch: read here, not at the top.)"""
        from ..measure.clock import batch_samples

        return batch_samples(batch)

    def tokens_per_sample(self, split) -> float | None:
        """Tokens in a sample, where the rate counts tokens (its rate in samples/s is shown beside it); None."""
        return None

    def apply_schedule(self, state, steps_per_epoch: int) -> None:
        """The recipe's warm-up (warmup_steps) is already the state's schedule (session.build_state)."""

    # --- what only image files have (the decode cache, unreadable and host-decoded files) ---------------
    def prepare_split(self, split, recipe: Recipe, dist=None):
        """The split as the run reads it: as it is (a task whose data are not image folders has no decode cache)."""
        return split

    def build_file_counts(self):
        """What the run counts of its files pass by pass, its record's data section (data/filecounts.py): nothing
        here (its data are not image files), with no collective to take."""
        from ..data.filecounts import NoFiles

        return NoFiles()

    # --- the step ------------------------------------------------------------------------------------------
    @abstractmethod
    def forward(self, model: Callable, inputs: Any, targets: Any) -> tuple[Any, Any]:
        """(outputs, loss) of a training batch; the loss a tensor, or a dict of named terms (loss_terms)."""

    @abstractmethod
    def score(self, outputs: Any, targets: Any) -> tuple[Any, int]:
        """(correct or None, count): what the Meter counts per step, on the device."""

    @abstractmethod
    def probe_batch(self, samples: list, device: torch.device) -> tuple[Any, Any]:
        """A batch of a few dataset samples on the device, for the unused-parameter probe."""

    # --- evaluation and the records ------------------------------------------------------------------------
    @abstractmethod
    def evaluate(self, model: nn.Module, batches: Iterable, precision, dist) -> dict[str, Any]:
        """Held-out metrics, over every rank's shard."""

    @abstractmethod
    def judged(self, metrics: dict[str, Any]) -> float:
        """The value of `metric` in what evaluate() returned."""

    @abstractmethod
    def rung_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The other numbers of evaluate() an ablation run records: "loss", "val_samples" (the held-out samples
        the metric's noise band is a proportion of; None when it is none), and the task's own."""

    @abstractmethod
    def train_metrics(self, stats, dist) -> dict[str, Any]:
        """The task's training fields of the epoch record, reduced over the ranks."""

    @abstractmethod
    def val_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The task's held-out fields of the epoch record."""

    @abstractmethod
    def summary(self, record: dict[str, Any]) -> str:
        """An epoch record's numbers in one line (`trainfast train`)."""

    # --- data, model, loaders ------------------------------------------------------------------------------
    @abstractmethod
    def load_data(self, spec: str, image_size: int | None):
        """The split a --data spec names (the declaration's check_image_size first)."""

    @abstractmethod
    def build_model(self, name: str, split) -> nn.Module:
        """The named model, for this split."""

    @abstractmethod
    def resolve_workers(self, recipe: Recipe, split, device: torch.device) -> Recipe:
        """The recipe with num_workers="auto" measured on this task's own loader."""

    @abstractmethod
    def build_loaders(self, split, recipe: Recipe, device: torch.device, dist) -> tuple[Any, Any]:
        """(training, validation) batches on the device."""

    @abstractmethod
    def flops_per_sample(self, model: nn.Module, split, recipe: Recipe) -> float | None:
        """Training FLOPs of one unit of the rate; None when they cannot be counted."""
