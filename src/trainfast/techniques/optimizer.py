"""The optimizer and its implementation switch: "for-loop" updates one tensor at a time, "foreach" groups
tensors into multi-tensor kernels, "fused" does the whole update in one kernel per dtype/device.
"default" passes nothing, so torch picks (foreach on CUDA, for-loop on CPU), exactly as a plain loop.

A user's own optimizer (trainfast.Session) is adopted rather than replaced: its parameters are remapped
onto the tensors the run really steps (O2's fp32 masters, FSDP2's shards), and a non-default
implementation rebuilds it as the same class with the same param groups, its scheduler rebound."""
from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from typing import Any, Iterable

import torch

from .base import ACTS, Effect
from .switch import RungSpec, Switch

# optimizer_impl -> the constructor flags that select it
IMPL_FLAGS: dict[str, dict[str, bool]] = {
    "default": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def effect(device: torch.device) -> Effect:
    return ACTS


def build_optimizer(params: Iterable[torch.nn.Parameter], recipe) -> torch.optim.Optimizer:
    kwargs = IMPL_FLAGS[recipe.optimizer_impl]
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, momentum=0.9, weight_decay=recipe.weight_decay, **kwargs)
    return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay, **kwargs)


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warm-up over `warmup_steps` (the detection reference's warmup_lr_scheduler), then constant. With 0 warm-up
    steps the factor is exactly 1.0, so the LR is bit-identical to no scheduler."""
    # Under fp16 the GradScaler skips optimizer.step() on overflow (always on the first steps, while the
    # scale calibrates); the schedule still advances once per step, as in torchvision's reference
    # engine, so torch's "scheduler.step() before optimizer.step()" warning is expected and not a bug.
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`")

    def factor(step: int) -> float:
        if step >= warmup_steps:
            return 1.0
        return (step + 1) / warmup_steps

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def remap_params(optimizer: torch.optim.Optimizer, mapping: dict[int, torch.Tensor]) -> None:
    """Replace, in place, every parameter of `optimizer` whose id is in `mapping` by its new tensor (per-param
    state moves along). Param groups and their hyperparameters stay as the user made them."""
    for group in optimizer.param_groups:
        group["params"] = [mapping.get(id(p), p) for p in group["params"]]
    for old in list(optimizer.state):
        new = mapping.get(id(old))
        if new is not None and new is not old:
            optimizer.state[new] = optimizer.state.pop(old)


def apply_optimizer_impl(optimizer: torch.optim.Optimizer, impl: str, scheduler=None) -> torch.optim.Optimizer:
    """The optimizer with `impl` selected. "default" keeps the user's object as it is; otherwise the same class
    is built again on the same param groups with the impl's flags, its state carried over, and `scheduler`
    (with the schedulers it chains) rebound to the new object. Refuses an optimizer class that has no such
    flag (a non-torch optimizer, LBFGS...) with a message naming it."""
    flags = IMPL_FLAGS[impl]
    if not flags:
        return optimizer
    return rebuild_optimizer(optimizer, flags, scheduler, impl)


def rebuild_optimizer(optimizer: torch.optim.Optimizer, flags: dict[str, Any], scheduler=None,
                      impl: str | None = None) -> torch.optim.Optimizer:
    """The same class built again on the same param groups with `flags` (foreach/fused; None: torch picks),
    state carried over and `scheduler` rebound; `impl` names the switch in the error for an optimizer that
    takes no such flag."""
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    missing = [name for name in ("foreach", "fused") if name not in accepted]
    if any(name in missing for name in flags):
        from ..recipe import RecipeError

        raise RecipeError(f"optimizer_impl={impl or flags!r}: {cls.__module__}.{cls.__name__} takes no "
                          f"{'/'.join(missing)} argument; use optimizer_impl=default with this optimizer")
    # foreach and fused exclude each other: the one not asked for is switched off explicitly.
    chosen = {**{name: False for name in ("foreach", "fused") if name in accepted}, **flags}
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    groups = [{**group, **chosen} for group in optimizer.param_groups]
    rebuilt = cls(groups, **{**defaults, **chosen})
    if optimizer.state:
        rebuilt.load_state_dict(optimizer.state_dict())
        for group in rebuilt.param_groups:         # load_state_dict restored the old groups' flags
            group.update(chosen)
    if scheduler is not None:
        rebind_scheduler(scheduler, rebuilt)
    return rebuilt


def rebind_scheduler(scheduler, optimizer: torch.optim.Optimizer) -> None:
    """Point `scheduler` (and the schedulers a SequentialLR/ChainedScheduler holds) at `optimizer`. The param
    groups are the same dicts' contents (initial_lr included), so the schedule continues where it was."""
    for each in (scheduler, *getattr(scheduler, "_schedulers", ())):
        each.optimizer = optimizer
    track_step_calls(optimizer)


def track_step_calls(optimizer: torch.optim.Optimizer) -> None:
    """What LRScheduler's constructor does to the optimizer it is given: wrap `step` so it records that it ran
    (`_opt_called`). Without it a rebound scheduler warns that optimizer.step() was overridden."""
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        return
    owner = weakref.ref(optimizer)
    step = type(optimizer).step

    @functools.wraps(step)
    def wrapper(*args: Any, **kwargs: Any):
        opt = owner()
        opt._opt_called = True
        return step(opt, *args, **kwargs)

    wrapper._wrapped_by_lr_sched = True
    optimizer.step = wrapper


FREES = "frees the gradients already (torch's default set_to_none=True)"
SWITCHES = (
    Switch(("optimizer_impl",),
           rungs=(RungSpec("fused", {"optimizer_impl": "fused"}, place=70, default_in=("classification", "lm"),
                           tune=5),),
           device_effect=effect,
           frameworks={"transformers": "TrainingArguments.optim (adamw_torch / adamw_torch_fused)",
                       "lightning": "each optimizer configure_optimizers() returns, rebuilt (schedulers rebound)",
                       "accelerate": "the optimizer, rebuilt before prepare() (schedulers rebound)"}),
    # zero_grad(set_to_none=True) changes something only in a loop that zeroes in place
    Switch(("set_to_none",),
           rungs=(RungSpec("set_to_none", {"set_to_none": True}, place=20, default_in=("classification", "detection"),
                           tune=4),),
           frameworks={"accelerate": "the prepared optimizer's zero_grad(set_to_none=...)"},
           unreachable={"transformers": f"the Trainer's zero_grad() {FREES}",
                        "lightning": f"Lightning's optimizer_zero_grad calls optimizer.zero_grad(), which {FREES}"}),
)
