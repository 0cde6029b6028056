"""Batch size as a switch: the effective batch `batch_scale` (k) times the recipe's, with the learning rate and
the warm-up following it, so that a bigger batch is a fair experiment rather than a slower-learning run.

Why the learning rate moves. A batch k times larger averages k times more gradients, so each step's gradient has
about 1/k of the variance and the run takes k times fewer steps per epoch. Left at the same learning rate, it
covers less ground per sample and falls behind. Two rules are in use:
  - "linear": lr x k (Goyal et al., "Accurate, Large Minibatch SGD"). For SGD with momentum, k small steps are
    about one step of k times the size, so the same samples cover the same distance.
  - "sqrt": lr x sqrt(k) (the square-root rule, Malladi et al.'s for Adam). Adam's update is normalized by
    the gradient's second moment, so its step already does not grow with the gradient; keeping the update's noise
    the same calls for the square root. The default, as the built-in runs use AdamW.
  - "none": the learning rate as the recipe has it (the user tuned it for the bigger batch already).
Neither rule holds without limit: past the "critical batch size" a bigger batch stops buying fewer samples, which
is why the switch is judged on the time to reach a target loss or accuracy, never on its rate alone.

Why the warm-up moves. A warm-up is there for the first samples, while the weights and Adam's moments are far from
settled; with k times fewer steps per sample, warmup_steps // k (rounded, at least 1 where there was one) covers
the same number of samples.

What accumulation trades. scale_by="accumulation" keeps the micro-batch and accumulates k times more of them per
optimizer step (grad_accum_steps x k): the same effective batch and the same update up to float rounding (the
loss of each micro-batch is divided by the accumulation count, so the summed gradient is the big batch's mean),
the activation memory of one micro-batch, and slower steps (k forward/backward passes of a small batch use the
device less well than one of a big batch). It is the memory-saving way to the same effective batch.

Applied once: `apply_batch_scale(recipe)` is the concrete recipe (batch_size or grad_accum_steps, lr and
warmup_steps changed) with batch_scale back to 1, so applying it twice changes nothing. It is declared as a recipe
rewrite (RecipeRewrite), which is applied where a recipe becomes concrete: the built-in run's Session, before the
loaders, the optimizer and the schedule are built; a transformers Trainer gets the same numbers on its own arguments
(`trainer_settings`, set by frameworks/hf.py)."""
from __future__ import annotations

import math
from typing import Any, Mapping

from .switch import RecipeRewrite, RungSpec, Switch

# Why a script's own loop is not scaled: its batch size, learning rate and warm-up are three objects of its own
# that must change together, and trainfast has no setting that changes all three (a Session says it too).
OWN_LOOP = ("the script builds its own DataLoader, optimizer and schedule: the batch size, the learning rate "
            "and the warm-up would have to change together, and trainfast does not rebuild the script's {what}")
UNREACHABLE = {"lightning": OWN_LOOP.format(what="DataLoaders and configure_optimizers()"),
               "accelerate": OWN_LOOP.format(what="objects before prepare()")}
SESSION = OWN_LOOP.format(what="DataLoader, optimizer and scheduler")


def lr_factor(k: int, rule: str) -> float:
    """The learning rate's multiplier for a batch `k` times bigger under `rule` ("linear", "sqrt" or "none")."""
    factors = {"linear": float(k), "sqrt": math.sqrt(k), "none": 1.0}
    if rule not in factors:
        from ..recipe import RecipeError

        raise RecipeError(f"lr_scaling={rule!r} is not one of {', '.join(factors)}")
    return factors[rule]


def scale_warmup(steps: int, k: int) -> int:
    """`steps` warm-up steps for a batch `k` times bigger: steps / k rounded half up, at least 1 where there was a
    warm-up (a run that had one keeps one), 0 where there was none."""
    if steps <= 0:
        return 0
    return max(1, (steps + k // 2) // k)


def scale_values(k: int, rule: str, by: str, batch_size: int, grad_accum_steps: int, lr: float,
                 warmup_steps: int) -> dict[str, Any]:
    """The concrete values for an effective batch `k` times bigger, by the Recipe's field names: batch_size
    (by="batch") or grad_accum_steps (by="accumulation") times k, lr times lr_factor(k, rule), warmup_steps
    scaled. The one arithmetic the built-in run and the Trainer adapter share."""
    if by not in ("batch", "accumulation"):
        from ..recipe import RecipeError

        raise RecipeError(f"scale_by={by!r} is not one of batch, accumulation")
    sizes = ({"batch_size": batch_size * k, "grad_accum_steps": grad_accum_steps} if by == "batch" else
             {"batch_size": batch_size, "grad_accum_steps": grad_accum_steps * k})
    return {**sizes, "lr": lr * lr_factor(k, rule), "warmup_steps": scale_warmup(warmup_steps, k)}


def apply_batch_scale(recipe):
    """The concrete recipe of `recipe`'s batch_scale: batch_size or grad_accum_steps multiplied, lr and
    warmup_steps scaled, batch_scale reset to 1 (so a second application is a no-op). batch_scale=1: `recipe`."""
    if recipe.batch_scale == 1:
        return recipe
    values = scale_values(recipe.batch_scale, recipe.lr_scaling, recipe.scale_by, recipe.batch_size,
                          recipe.grad_accum_steps, recipe.lr, recipe.warmup_steps)
    return recipe.replace(**values, batch_scale=1)


def asks(recipe) -> bool:
    """Whether `recipe` still asks for a bigger batch (not made concrete yet)."""
    return recipe.batch_scale != 1


def trainer_settings(fields: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """A framework's own batch (or accumulation), learning rate and warm-up (`current`, by the Recipe's field
    names; a warm-up of None is one the framework keeps in another form and is left alone) scaled as the built-in
    run scales its own: {field: (value, the switched field that decides it)}. Each is decided by the field the run
    names (scale_by for the size, lr_scaling for the learning rate) where it names it, so every field it switches
    is proven by a setting. {} where the run's `fields` do not scale the batch."""
    if "batch_scale" not in fields:
        return {}
    from ..recipe import Recipe

    rule, by = fields.get("lr_scaling", Recipe.lr_scaling), fields.get("scale_by", Recipe.scale_by)
    warmup = current.get("warmup_steps")
    values = scale_values(int(fields["batch_scale"]), rule, by, current["batch_size"], current["grad_accum_steps"],
                          current["lr"], 0 if warmup is None else int(warmup))
    size = "batch_size" if by == "batch" else "grad_accum_steps"
    owner = {size: "scale_by" if "scale_by" in fields else "batch_scale",
             "lr": "lr_scaling" if "lr_scaling" in fields else "batch_scale"}
    if warmup is not None:
        owner["warmup_steps"] = "batch_scale"
    return {name: (values[name], field_) for name, field_ in owner.items()}


SWITCHES = (
    Switch(("batch_scale", "lr_scaling", "scale_by"),
           # Opt-in (--switches), late in the ladders and not in the tune: a bigger batch changes the math, so it
           # is only meaningful judged on time to target, and cumulative rungs after it would inherit its batch.
           # `tune --target` tries the two bigger batches on its rate pick (tune/target.py), where samples to target
           # are measured over seeds and a changed batch can be weighed.
           rungs=(RungSpec("batch_2x", {"batch_scale": 2}, place=75, tune_target=1),
                  RungSpec("batch_4x", {"batch_scale": 4}, place=76, tune_target=2),
                  RungSpec("accum_4x", {"batch_scale": 4, "scale_by": "accumulation"}, place=77)),
           changes_math=True,
           rewrite=RecipeRewrite(apply_batch_scale, asks, SESSION, trainer_settings),
           frameworks={"transformers": "per_device_train_batch_size (or gradient_accumulation_steps) x k, "
                                       "learning_rate and warmup_steps scaled"},
           unreachable=UNREACHABLE),
)
