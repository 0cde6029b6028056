"""The optimizer's step compiled with torch.compile (PyTorch's "Compiling the optimizer with torch.compile"
recipe): an eager AdamW update launches a handful of small kernels per parameter tensor (or per group of them,
foreach), each reading and writing the weights and both moments again; compiled, inductor fuses the whole update
into a few kernels that read each tensor once. It pays where the update is a visible part of the step (many
small tensors: a transformer's norms and biases, a small model at a small batch) and costs the compilation on the
first step, which the time to a target counts.

The learning rate is held in each param group as a 0-d tensor, as the recipe's scheduler section does: a scheduler
then writes the new rate into that tensor (torch's schedulers fill a tensor lr in place) and the compiled step
reads it, where a float would be baked into the graph and every warm-up step would compile it again. Turned off,
the step trainfast compiled is put back (the rate stays a tensor; eager optimizers read it as the same number).

It acts on the optimizer object where it is built or adopted: the built-in run's, a Session's user optimizer, the
optimizers Lightning's configure_optimizers() returns and those handed to Accelerate's prepare(), always in place
(the scheduler keeps its optimizer). It cannot act where torch.compile cannot (no C++ compiler for inductor's
CPU kernels), nor on the low-bit Adam, whose update torchao compiles per tensor already (techniques.
OPTIMIZER_ORDER)."""
from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from .compile import effect
from .switch import OptimizerSwitch, RungSpec, Switch

COMPILED = "_trainfast_compiled_step"      # on the step trainfast installed: the step it replaced


def compile_step(optimizer: torch.optim.Optimizer, enabled: bool, scheduler: Any = None) -> torch.optim.Optimizer:
    """`optimizer` with its step compiled (or the step it had before put back), changed in place. A closure
    (Lightning passes one) is evaluated eagerly first, as torch's step would, and the update alone is compiled.
    The wrapper records that the step ran (`_opt_called`), as a scheduler's own wrapper does, so a scheduler
    built before or after does not warn that the step was overridden."""
    if not enabled:
        replaced = getattr(optimizer.step, COMPILED, None)
        if replaced is not None:
            if replaced is False:
                del optimizer.step                   # the class's own step again
            else:
                optimizer.step = replaced
        return optimizer
    if is_compiled(optimizer):
        return optimizer
    for group in optimizer.param_groups:             # a tensor the scheduler fills, not a constant in the graph
        if not isinstance(group.get("lr"), torch.Tensor) and takes_tensor_lr(group):
            group["lr"] = torch.tensor(float(group["lr"]))
    owner = weakref.ref(optimizer)
    update = torch.compile(type(optimizer).step.__get__(optimizer), fullgraph=False)

    @functools.wraps(type(optimizer).step)
    def step(closure: Any = None) -> Any:
        opt = owner()
        opt._opt_called = True
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        update()
        return loss

    step._wrapped_by_lr_sched = True
    setattr(step, COMPILED, optimizer.__dict__.get("step", False))
    optimizer.step = step
    return optimizer


def takes_tensor_lr(group: dict[str, Any]) -> bool:
    """Whether a param group's update takes its rate as a tensor: torch's foreach Adam asked for explicitly does
    only when capturable, which torch.compile makes it on CUDA but not on a CPU. Such a group keeps a float rate
    (a scheduler that changes it then compiles the step again, up to dynamo's cache limit, then runs it eagerly)."""
    return not (group.get("foreach") and not group.get("capturable", True))


def is_compiled(optimizer: Any) -> bool:
    """Whether the step an optimizer runs is the compiled one (read back from the object)."""
    return getattr(getattr(optimizer, "step", None), COMPILED, None) is not None


SWITCHES = (
    Switch(("compile_optimizer",),
           # Named with --switches: its first step pays the compilation, which a short default ladder would
           # mostly measure.
           rungs=(RungSpec("compile_optimizer", {"compile_optimizer": True}, place=71),),
           device_effect=effect,
           optimizer=OptimizerSwitch("compiled optimizer step", is_compiled, default=False, rebuild=compile_step),
           frameworks={"lightning": "each optimizer configure_optimizers() returns, its step compiled in place",
                       "accelerate": "the optimizer handed to prepare(), its step compiled in place"},
           unreachable={"transformers": "the Trainer builds its optimizer itself, and TrainingArguments has no "
                                        "setting that compiles its step"}),
)
