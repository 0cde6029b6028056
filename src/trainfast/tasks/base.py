"""The Task base: what every task declares, and the rules derived from those declarations.

A task is what a batch, a loss and a metric mean (tasks/__init__.py lists its methods). Its declarations here are
what the rest of trainfast reads instead of probing the object: the metric every rung is judged on (its name, its
table label, whether higher or lower is better), the unit its rate counts and how a batch is counted, the kinds of
data it offers (a switch declared on a kind it does not offer is ruled out with the declaration's reason, before
any run), its default ladder and where `trainfast train` starts (model, data, recipe).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable

from ..recipe import Recipe, RecipeError
from ..techniques import owners
from ..techniques.base import Effect
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


class Task:
    """The declarations every task makes, with the defaults most share, and the methods the built-in run calls
    (subclasses implement them; tasks/__init__.py says what each is for)."""
    name: ClassVar[str]
    metric: ClassVar[Metric] = Metric("accuracy", "val acc")
    # What the rate counts, per second, and how one training batch is counted (count_batch): the clock counts
    # batches the same way (measure.clock.batch_samples), so a run's record and the report say one unit.
    rate_unit: ClassVar[str] = "samples"
    # The kinds of data (techniques/switch.py: DATA_KINDS) its batches are: a switch declared on another kind has
    # nothing to act on here. "" (any data) is offered by every task.
    offers: ClassVar[frozenset[str]] = frozenset({""})
    batches: ClassVar[str] = ""          # its batches in words, the second half of a ruled-out switch's reason
    loss_terms: ClassVar[bool] = False   # the loss is a dict of named terms: logged each, key sets compared on ranks
    loss_fn: Callable | None = None      # a loss on the model's outputs, where the task has one (the doctor's FLOPs)
    default_data: ClassVar[str]
    default_recipe: ClassVar[Recipe] = Recipe()   # where `trainfast train` starts when no --recipe is given

    @property
    def ladder(self) -> str:
        """The name of its default ladder (ablation/ladders.py: LADDERS): each task has its own, by its name."""
        return self.name

    @property
    def default_model(self) -> str:
        raise NotImplementedError

    def count_batch(self, batch: Any) -> int:
        """How many `rate_unit` a training batch holds (its samples; a batch that says what its rate counts, a
        language model's real tokens, by that). (measure imports torch: read here, not at the top, so the CLI can
        name the tasks before torch loads.)"""
        from ..measure.clock import batch_samples

        return batch_samples(batch)

    # --- which switches its data offers something to ----------------------------------------------------
    def data_reason(self, field: str) -> str | None:
        """Why the switch owning `field` has nothing to act on in this task's data (its declared kind is not
        offered), or None."""
        switch = owners().get(field)
        if switch is None or switch.data in self.offers:
            return None
        return f"{field} acts on {DATA_KINDS[switch.data]}; the {self.name} task's batches are {self.batches}"

    def rules_out(self, changes: dict[str, Any]) -> str | None:
        """Why a rung that switches `changes` cannot act in this task (every reason, once), or None."""
        reasons = [why for why in map(self.data_reason, changes) if why]
        return "; ".join(dict.fromkeys(reasons)) or None

    def validate(self, recipe: Recipe) -> None:
        """What cannot work for this task, refused before any work starts: a switch turned on (away from the
        default) whose data this task does not offer. Subclasses add their own refusals."""
        default = Recipe()
        for field, value in recipe.to_dict().items():
            why = self.data_reason(field) if value != getattr(default, field) else None
            if why:
                raise RecipeError(f"{field}={value!r}: {why}")

    def field_effect(self, field: str, device: torch.device, model: nn.Module | None, split,
                     value: Any = None) -> Effect:
        """Whether a switch can act here: ruled out where this task does not offer its data, else the techniques'
        judgement of the device and model and the data's own (tasks/effects.py)."""
        from .effects import field_effect

        why = self.data_reason(field)
        if why:
            return Effect(False, why, applies=False)
        return field_effect(field, device, model, split, value)

    # --- what the ablation reads about the run ----------------------------------------------------------
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

    # --- what each task implements ------------------------------------------------------------------------
    def forward(self, model: Callable, inputs: Any, targets: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def score(self, outputs: Any, targets: Any) -> tuple[Any, int]:
        raise NotImplementedError

    def evaluate(self, model: nn.Module, batches: Iterable, precision, dist) -> dict[str, Any]:
        raise NotImplementedError

    def judged(self, metrics: dict[str, Any]) -> float:
        """The value of `metric` in what evaluate() returned."""
        raise NotImplementedError

    def rung_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The other numbers of evaluate() an ablation run records: "loss", "val_samples" (the held-out samples
        the metric's noise band is a proportion of; None when it is none), and the task's own."""
        raise NotImplementedError
