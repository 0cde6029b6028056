"""What a switch can act on in a task's data: the part of a switch's effect that depends on the data, judged here
(the techniques judge the device and the model, techniques/__init__.py: device_model_effect). A switch declares the kind
of data it acts on (techniques/switch.py: Switch.data); a task that does not offer that kind rules it out first
(tasks/base.py: Task.data_reason), and each kind has one judge below for the data a task does offer.
What the run itself allows (its processes, the loop that runs its steps, its saves, its loader workers: a RunContext,
techniques/switch.py) is judged before any of them, from each switch's declaration (context_effect)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..techniques import device_model_effect
from ..techniques import owners, ranks_effect
from ..techniques.base import ACTS, Effect
from ..techniques.switch import RunContext

if TYPE_CHECKING:
    import torch
    from torch import nn


def image_folder(field: str, model, split) -> Effect:
    """Files decoded per sample: the decode cache and device decoding replace that decoding. Without a split
    (not known yet) it counts as acting."""
    from ..data.imagefolder import ImageFiles

    if split is None or any(isinstance(d, ImageFiles) for d in (split.train, split.val)):
        return ACTS
    switch = owners().get(field)
    if switch is not None and switch.data_idle:
        return Effect(False, f"{field} {switch.data_idle}")
    return Effect(False, f"{field} decodes image-folder files; this data is already in memory", applies=False)


def padded_sizes(field: str, model, split) -> Effect:
    """Detection images of different sizes, padded per batch by the model: grouping by aspect ratio pads less."""
    from ..detection.batching import aspect_ratio_groups

    sizes = getattr(getattr(split, "train", None), "sizes", None)
    if sizes is None:
        return Effect(False, "aspect-ratio grouping acts on detection data (images of different sizes); these "
                             "batches are stacked at one size", applies=False)
    fixed = getattr(getattr(model, "transform", None), "fixed_size", None)
    if fixed:
        return Effect(False, f"the model resizes every image to {fixed[0]}x{fixed[1]}: no batch is padded, so "
                             "grouping changes nothing", applies=False)
    if len(set(aspect_ratio_groups(sizes))) < 2:
        return Effect(False, "every training image falls in one aspect-ratio group: grouping changes nothing",
                      applies=False)
    return ACTS


def documents(field: str, model, split) -> Effect:
    """Language-model documents of different lengths, padded per batch: packing and length grouping remove that
    padding. Data of another kind, or documents all of one length, have none."""
    lengths = getattr(getattr(split, "train", None), "lengths", None)
    if split is None:
        return ACTS
    if lengths is None:
        return Effect(False, f"{field} acts on a language model's batches of documents of different lengths; these "
                             "batches are stacked samples of one shape", applies=False)
    if len(set(lengths)) < 2:
        return Effect(False, f"every training document is {lengths[0]} tokens long: no batch is padded, so {field} "
                             "has nothing to remove", applies=False)
    return ACTS


def offered(field: str, model, split) -> Effect:
    """Image batches, or batches of one shape: whether the task's data is of that kind is the task's declaration
    (tasks/base.py: Task.offers), and nothing in the data itself decides more (the model's judge does: a
    channels_last on a model without convolutions)."""
    return ACTS


DATA_JUDGES: dict[str, Callable[[str, object, object], Effect]] = {
    "images": offered, "stacked": offered, "image_folder": image_folder, "padded_sizes": padded_sizes,
    "documents": documents}


def holds(kind: str, split) -> bool:
    """Whether `split` holds data of `kind` (techniques/switch.py: DATA_KINDS) a switch on that kind acts on (None:
    not known yet, counts as holding it)."""
    return DATA_JUDGES[kind]("", None, split).acts


def data_effect(field: str, device: torch.device, model: nn.Module | None, split=None, value=None) -> Effect:
    """Whether the switch owning `field` (at `value`, for a switch of several values) can act here: on the device
    and the model (the technique's judgement), then on the data (`split`; None: not known yet, counts as acting)."""
    acts = device_model_effect(field, device, model, value)
    switch = owners().get(field)
    if not acts.acts or switch is None or not switch.data:
        return acts
    on_data = DATA_JUDGES[switch.data](field, model, split)
    return on_data if not on_data.acts else acts


def changes_effect(changed: dict, device: torch.device, model: nn.Module | None, split=None,
                   effect_of: Callable[..., Effect] = data_effect) -> Effect:
    """A set of switched fields acts if any one of them acts; otherwise say why none does. `effect_of`: a task's
    own judgement of a field (tasks/detection.py), by default data_effect above."""
    effects = [effect_of(name, device, model, split, value=value) for name, value in changed.items()]
    if not effects or any(e.acts for e in effects):
        reasons = [e.reason for e in effects if e.reason]
        return Effect(True, "; ".join(reasons))
    return Effect(False, "; ".join(dict.fromkeys(e.reason for e in effects)), applies=all(e.applies for e in effects))


def context_effect(field: str, run: RunContext) -> Effect:
    """Whether the switch owning `field` can act in the run `run` describes: first the job's processes and wrapper
    (Switch.ranks: a switch that acts on the data-parallel wrapper cannot act in one process, which has none, nor on
    a wrapper it is not for), then what the switch declares about a run (Switch.context_effect: a loop that already
    does what it does, a run with no saves or no loader workers for it to act on)."""
    alone = ranks_effect(field, run.ranks, run.strategy)
    switch = owners().get(field)
    if not alone.acts or switch is None or switch.context_effect is None:
        return alone
    return switch.context_effect(run)


def in_context(effect_of: Callable[..., Effect], run: RunContext) -> Callable[..., Effect]:
    """`effect_of` (the device, model and data's judgement), judged first on the run itself (context_effect)."""
    def judge(field: str, device: torch.device, model: nn.Module | None, split=None, value=None) -> Effect:
        alone = context_effect(field, run)
        return alone if not alone.acts else effect_of(field, device, model, split, value=value)
    return judge
