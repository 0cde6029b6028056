"""Low-bit optimizer states: Adam's two moments (exp_avg, exp_avg_sq) kept in 8 or 4 bits per value, quantized
block-wise with one scale per block of 256 (torchao's AdamW8bit / AdamW4bit), instead of fp32. AdamW holds 8 bytes
of state per parameter, twice the fp32 weights themselves: 8-bit states make it about 2 bytes, 4-bit about 1, which
is the first memory a fine-tune of a language model gets back without touching its activations.

The update's arithmetic changes (the moments carry quantization error), so the switch is judged on the validation
loss, not on its speed alone. torchao compiles each parameter's update with torch.compile (the first step pays for
it, and a CPU needs a C++ compiler); tensors under 4,096 values keep fp32 states (torchao's own rule: their
scales would cost more than they save).

The built-in run builds the low-bit AdamW in place of torch's; a user's own Adam/AdamW (a Session, Lightning's
configure_optimizers, an optimizer passed to Accelerate's prepare) is rebuilt as the low-bit class with the same
param groups and hyperparameters, its scheduler rebound; a transformers Trainer gets its own `optim` choice
(adamw_torch_8bit / adamw_torch_4bit, which build the same torchao classes)."""
from __future__ import annotations

import importlib.util
from typing import Any

import torch

from ..quiet import quiet_imports
from .base import Effect
from .optimizer import TRAINER_ADAMW, TRAINER_LOW_BIT, rebind_scheduler
from .switch import OptimizerSwitch, RungSpec, Switch

STATES = ("full", "8bit", "4bit")
# The Trainer's own names for the same optimizers (TrainingArguments.optim)
TRAINER_OPTIM = {"full": TRAINER_ADAMW["default"], **TRAINER_LOW_BIT}
# Why the implementation switch (and any other after this one in techniques.OPTIMIZER_ORDER) does not apply
LOW_BIT = ("the low-bit Adam's update is one compiled kernel per tensor (torchao), a class of its own: no "
           "foreach/fused choice, and no other optimizer switch acts on it")
# The hyperparameters a torchao Adam takes from a torch Adam/AdamW param group; the others (foreach, fused,
# capturable, differentiable) choose torch's kernels, which the compiled low-bit step replaces.
GROUP_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad")
INSTALL = "needs torchao (pip install torchao): its AdamW8bit / AdamW4bit hold the low-bit states"


def effect(device: torch.device) -> Effect:
    if importlib.util.find_spec("torchao") is None:
        return Effect(False, INSTALL)
    from .compile import effect as compile_effect

    compiled = compile_effect(device)       # each parameter's update is a compiled kernel
    if not compiled.acts:
        return Effect(False, f"torchao compiles the low-bit update: {compiled.reason}")
    return compiled


def low_bit_class(state: str, decoupled: bool = True) -> type[torch.optim.Optimizer]:
    """torchao's Adam with `state` moments: AdamW (decoupled weight decay) or Adam (L2 added to the gradient)."""
    try:
        with quiet_imports():            # torchao's import notices (its enums registered with torch) held
            from torchao import optim
    except ImportError as exc:
        from ..recipe import RecipeError

        raise RecipeError(f"optimizer_state={state!r} {INSTALL}") from exc
    bits = {"8bit": "8bit", "4bit": "4bit"}[state]
    return getattr(optim, f"{'AdamW' if decoupled else 'Adam'}{bits}")


def build_low_bit(params, recipe) -> torch.optim.Optimizer | None:
    """The built-in run's AdamW with low-bit states (recipe.optimizer is adamw: Recipe refuses sgd with it); None
    with full states (torch's optimizer, techniques/optimizer.py)."""
    if recipe.optimizer_state == "full":
        return None
    return low_bit_class(recipe.optimizer_state)(params, lr=recipe.lr, weight_decay=recipe.weight_decay)


def state_of(optimizer: Any) -> str:
    """What an optimizer keeps its moments in, read from its class: "8bit", "4bit", or "full"."""
    name = type(getattr(optimizer, "optimizer", optimizer)).__name__
    return next((s for s in ("8bit", "4bit") if name.endswith(s)), "full")


def apply_optimizer_state(optimizer: torch.optim.Optimizer, state: str, scheduler=None) -> torch.optim.Optimizer:
    """`optimizer` with its moments in `state`: "full" keeps the user's object; otherwise a torch Adam/AdamW is
    built again as torchao's low-bit class on the same param groups (lr, betas, eps, weight decay per group),
    `scheduler` rebound. Refused, with the class named: another optimizer (its state is not Adam's two moments),
    maximize=True, an optimizer that has already stepped (its fp32 moments are not converted), and a low-bit
    optimizer asked for full states (the script's own: its moments are not converted back)."""
    from ..recipe import RecipeError

    had = state_of(optimizer)
    if had == state:
        return optimizer
    if state == "full":
        raise RecipeError(f"the script's own {type(optimizer).__name__} keeps its {had} moments")
    cls = type(optimizer)
    if cls not in (torch.optim.AdamW, torch.optim.Adam):
        raise RecipeError(f"optimizer_state={state!r}: {cls.__module__}.{cls.__name__} is not torch's Adam or AdamW; "
                          "the low-bit states are Adam's two moments (use optimizer_state=full with this optimizer)")
    if any(group.get("maximize") for group in optimizer.param_groups):
        raise RecipeError(f"optimizer_state={state!r}: the low-bit Adam has no maximize=True")
    if optimizer.state:
        raise RecipeError(f"optimizer_state={state!r}: this optimizer has already stepped; its fp32 moments are not "
                          "converted (set the switch before the first step)")
    decoupled = cls is torch.optim.AdamW or any(g.get("decoupled_weight_decay") for g in optimizer.param_groups)
    groups = [{"params": group["params"], **{k: group[k] for k in GROUP_KEYS if k in group}}
              for group in optimizer.param_groups]
    rebuilt = low_bit_class(state, decoupled)(groups, **{k: optimizer.defaults[k] for k in GROUP_KEYS
                                                          if k in optimizer.defaults})
    for old, new in zip(optimizer.param_groups, rebuilt.param_groups):
        if "initial_lr" in old:                 # a scheduler set it: the schedule continues from it
            new["initial_lr"] = old["initial_lr"]
    if scheduler is not None:
        rebind_scheduler(scheduler, rebuilt)
    return rebuilt


def trainer_optim(state: str, optim: str) -> str | None:
    """The Trainer's AdamW with `state` moments, from the script's `optim` (one of its torch AdamWs); full states
    take a low-bit one back to the plain AdamW and leave any other as it is (None)."""
    if state == "full":
        return TRAINER_OPTIM["full"] if optim in TRAINER_LOW_BIT.values() else None
    if optim not in (*TRAINER_ADAMW.values(), *TRAINER_LOW_BIT.values()):
        raise ValueError(f"the script's optim {optim!r} is not one of the Trainer's torch AdamWs (only "
                         f"{' / '.join(TRAINER_ADAMW.values())} have low-bit twins)")
    return TRAINER_OPTIM[state]


def trainer_optim_of(optimizer: Any) -> str | None:
    """The Trainer's name for torchao's AdamW8bit / AdamW4bit (None: full states, not this switch's to tell)."""
    state = state_of(optimizer)
    return TRAINER_OPTIM[state] if state != "full" else None


SWITCHES = (
    Switch(("optimizer_state",),
           # A memory switch: named with --switches, never in a default ladder (it trades speed and a changed
           # update for memory, which only a run short of memory wants); the tune's memory stage tries 8-bit states.
           rungs=(RungSpec("optimizer_state", {"optimizer_state": "8bit"}, place=72, tune_memory=3),
                  RungSpec("optimizer_state_4bit", {"optimizer_state": "4bit"}, place=73)),
           device_effect=effect,
           changes_math=True,              # the moments carry quantization error
           optimizer=OptimizerSwitch("optimizer moments", state_of, default="full", build=build_low_bit,
                                     rebuild=apply_optimizer_state, replaces=LOW_BIT, trainer_optim=trainer_optim,
                                     trainer_optim_of=trainer_optim_of),
           shrinks={"optimizer_state": "optimizer_state (8-bit or 4-bit Adam states)"},
           frameworks={"transformers": "TrainingArguments.optim (adamw_torch_8bit / adamw_torch_4bit)",
                       "lightning": "each Adam/AdamW configure_optimizers() returns, rebuilt (schedulers rebound)",
                       "accelerate": "the Adam/AdamW, rebuilt before prepare() (schedulers rebound)"}),
)

