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
from .switch import OptimizerSwitch, RunContext, RungSpec, Switch

# optimizer_impl -> the constructor flags that select it
IMPL_FLAGS: dict[str, dict[str, bool]] = {
    "default": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
# The Trainer's torch AdamWs (transformers' TrainingArguments.optim): the unfused/fused pair this switch chooses
# between, and the low-bit twins the optimizer's state switch chooses (optimizer_state.py), which an
# implementation asked of the Trainer turns back into one of the pair.
TRAINER_ADAMW = {"default": "adamw_torch", "fused": "adamw_torch_fused"}
TRAINER_LOW_BIT = {"8bit": "adamw_torch_8bit", "4bit": "adamw_torch_4bit"}


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


def impl_flags(impl: str) -> dict[str, Any]:
    """The constructor flags of an optimizer implementation; "default" clears any the script passed (what torch
    picks when none is given), so a framework's baseline turns off the script's own fused=True."""
    return IMPL_FLAGS[impl] if impl != "default" else {"fused": None, "foreach": None}


def switch_impl(optimizer: torch.optim.Optimizer, impl: str, scheduler=None) -> torch.optim.Optimizer:
    """`optimizer` rebuilt with exactly `impl` ("default" clears the script's flags): same class, same groups,
    scheduler rebound."""
    return rebuild_optimizer(optimizer, impl_flags(impl), scheduler, impl)


def impl_of(optimizer: torch.optim.Optimizer) -> str:
    """What an optimizer runs, read from its param groups: "fused", "foreach", "for-loop", or "default"."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if group.get("fused"):
        return "fused"
    if group.get("foreach"):
        return "foreach"
    return "for-loop" if group.get("foreach") is False else "default"


def trainer_optim(impl: str, optim: str) -> str:
    """The Trainer's AdamW for `impl`, from the script's `optim` (one of its torch AdamWs, a low-bit one included:
    an implementation asked turns it back into the fp32 pair)."""
    if optim not in (*TRAINER_ADAMW.values(), *TRAINER_LOW_BIT.values()):
        raise ValueError(f"the script's optim {optim!r} has no fused/unfused pair among the Trainer's optim choices "
                         f"(only {' / '.join(TRAINER_ADAMW.values())})")
    if impl not in TRAINER_ADAMW:
        raise ValueError(f"the Trainer's optim choices have no {impl!r} AdamW")
    return TRAINER_ADAMW[impl]


def trainer_optim_of(optimizer: torch.optim.Optimizer) -> str | None:
    """The Trainer's name for a torch AdamW it built, read from its `fused` flag (None: not a torch AdamW)."""
    if type(optimizer).__name__ != "AdamW":
        return None
    fused = bool(optimizer.param_groups[0].get("fused")) if optimizer.param_groups else False
    return TRAINER_ADAMW["fused" if fused else "default"]


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
ZERO_GRAD_NOTE = ("the built-in loop's zero_grad() already frees the gradients (PyTorch's default); "
                  "it acts on a script that zeroes in place")


def zeroing_effect(run: RunContext) -> Effect:
    """set_to_none has something to change only in a loop that zeroes in place: trainfast's own loop calls
    zero_grad() with torch's default, which frees the gradients already (engine.py)."""
    return Effect(False, ZERO_GRAD_NOTE, applies=False) if run.builtin else ACTS


SWITCHES = (
    Switch(("optimizer_impl",),
           rungs=(RungSpec("fused", {"optimizer_impl": "fused"}, place=70, default_in=("classification", "lm"),
                           tune=5),),
           device_effect=effect, observed="optimizer_implementation",
           optimizer=OptimizerSwitch(
               "optimizer implementation", impl_of, default="default", build=build_optimizer, rebuild=switch_impl,
               plugins={"deepspeed": "DeepSpeed wraps and steps the optimizer itself (its own fused kernels, ZeRO "
                                     "partitions)"},
               trainer_optim=trainer_optim, trainer_optim_of=trainer_optim_of),
           frameworks={"transformers": "TrainingArguments.optim (adamw_torch / adamw_torch_fused)",
                       "lightning": "each optimizer configure_optimizers() returns, rebuilt (schedulers rebound)",
                       "accelerate": "the optimizer, rebuilt before prepare() (schedulers rebound)"}),
    # zero_grad(set_to_none=True) changes something only in a loop that zeroes in place
    Switch(("set_to_none",),
           rungs=(RungSpec("set_to_none", {"set_to_none": True}, place=20, default_in=("classification", "detection"),
                           tune=4),),
           context_effect=zeroing_effect,
           frameworks={"accelerate": "the prepared optimizer's zero_grad(set_to_none=...)"},
           unreachable={"transformers": f"the Trainer's zero_grad() {FREES}",
                        "lightning": f"Lightning's optimizer_zero_grad calls optimizer.zero_grad(), which {FREES}"}),
)
