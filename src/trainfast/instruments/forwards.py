"""The forward hooks, one of the doctor's instruments (watch.py puts them around a loop): on the model (or, for
a script whose model is unknown, global module hooks that keep only the outermost module of each call), they
see the input shape of every training forward, nn.DataParallel, and the evaluation forwards: those in eval mode
that still build an autograd graph (no torch.no_grad()), and the grad-free ones of the trained model left in
training mode (no model.eval(): dropout drops, batch norm uses and updates batch statistics). At the end the
model is tested on an input it trained and one it evaluated on (evalcheck.py)."""
from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

import torch
from torch import nn

from .evalcheck import check_eval_dropout, mode_dependent
from .tensors import tensors_of


class ForwardWatch:
    """The forward hooks of a Watch (`watch`: its model, steps, sync counter, hook guard and its wait for an
    evaluation, which an evaluation forward may end), and the tests run on the model at the end."""

    paused = False            # the doctor's own forwards (the eval-dropout test) are not the loop's

    def __init__(self, watch) -> None:
        self.watch = watch
        model = watch.model
        self.shapes: list[list] = []
        self.eval_forwards = 0
        self.eval_graph: Counter = Counter()        # module class -> eval forwards that built a graph
        self.train_mode_evals = 0                   # grad-free forwards of the trained model in training mode
        self.train_mode_modules: dict[str, int] = {}
        self.train_mode_input: Any = None
        # The first grad-free training-mode forward of a run, held back (module, inputs) until the next forward
        # says whether it was an evaluation; False inside a run already counted; None outside one.
        self._grad_free: tuple | bool | None = None
        self.data_parallel = False
        # the trained module (for the eval-dropout check)
        self.root: weakref.ref | None = weakref.ref(model) if model is not None else None
        self._trained: nn.Module | None = None
        self.last_input: Any = None
        self.compute_dtype: torch.dtype | None = None   # of the training forwards: autocast's, or the weights'
        self._depth = 0

    def register(self) -> list:
        """The hooks, each behind the watch's guard: on the model when it is known, else on every module."""
        from torch.nn.modules import module as module_hooks

        model, safe = self.watch.model, self.watch.safe
        if model is not None:
            return [model.register_forward_pre_hook(safe(self._pre_root)),
                    model.register_forward_hook(safe(self._post_root))]
        return [module_hooks.register_module_forward_pre_hook(safe(self._pre_any)),
                module_hooks.register_module_forward_hook(safe(self._post_any), always_call=True)]

    def _pre_any(self, module, args):
        self._depth += 1
        if self._depth == 1:
            self._pre_root(module, args)

    def _post_any(self, module, args, output):
        depth, self._depth = self._depth, max(0, self._depth - 1)
        if depth == 1:
            self._post_root(module, args, output)

    @staticmethod
    def is_model(module: nn.Module) -> bool:
        """A module with trainable parameters: the model, not a loss module called on its own."""
        return any(p.requires_grad for p in module.parameters())

    def _pre_root(self, module: nn.Module, args) -> None:
        watch = self.watch
        if self.paused or not self.is_model(module):
            return
        if len(self.shapes) < 3 and any(isinstance(m, nn.DataParallel) for m in module.modules()):
            self.data_parallel = True          # looked for in the first forwards only: a walk of every module
        if not (module.training and torch.is_grad_enabled()):
            return
        watch.counter.in_eval = False
        self._grad_free = None      # a lone grad-free forward before this one was part of the step, not evaluation
        if watch.stopped:
            return
        self.shapes.append(shape_of(args))
        self.compute_dtype = compute_dtype(module, watch.device_type)
        if self.root is None or self.root() is not module:
            self.root = weakref.ref(module)
            # held too: a loop that ends before its watched steps are over is checked after it returned, when
            # nothing else may hold its model (one model at most: the latest trained)
            self._trained = module
        if args and watch.steps >= 1 and self.last_input is None:
            self.last_input = _detached(tuple(args))  # a copy: loaders recycle their buffers

    def _post_root(self, module: nn.Module, args, output) -> None:
        """Evaluation forwards: in eval mode (with or without autograd), or grad-free in training mode."""
        watch = self.watch
        if self.paused or not self.is_model(module) or (module.training and torch.is_grad_enabled()):
            return
        if module.training:
            if self.root is None or self.root() is not module:
                return                 # a grad-free forward of another model (a frozen teacher's, say)
            # One grad-free forward followed by a training forward is part of the step (pseudo-labels, a target
            # computed by the model itself); two in a row, or one the loop ends on, are an evaluation.
            if self._grad_free is None:
                self._grad_free = (module, _detached(tuple(args)) if args else None)
                return
            if self._grad_free:                # the first of this run, held back until now
                self._note_train_mode_eval(*self._grad_free)
            self._note_train_mode_eval(module, args)
            self._grad_free = False
        else:
            self.eval_forwards += 1
            watch.counter.in_eval = True
            if torch.is_grad_enabled() and any(t.requires_grad for t in tensors_of(output)):
                self.eval_graph[type(module).__name__] += 1
        if watch.wait_started is not None and self.eval_seen >= watch.EVAL_FORWARDS:
            watch.finish("reached")

    def _note_train_mode_eval(self, module: nn.Module, inputs: tuple | None) -> None:
        self.train_mode_evals += 1
        if self.train_mode_input is None and inputs:
            self.train_mode_input, self.train_mode_modules = _detached(tuple(inputs)), mode_dependent(module)

    @property
    def eval_seen(self) -> int:
        """Evaluation forwards seen so far, whatever their mode."""
        return self.eval_forwards + self.train_mode_evals

    # --- tests run on the model, at the end ---------------------------------------------------------------

    def _test_model(self, inputs: Any, training: bool) -> dict[str, Any] | None:
        model = self.root() if self.root is not None else None
        if model is None or inputs is None:
            return None
        self.paused = True
        try:
            return check_eval_dropout(model, *inputs, training=training)
        except Exception as exc:      # a model that will not take its input again: say so, never crash the loop
            return {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            self.paused = False

    def dropout_check(self) -> dict[str, Any] | None:
        """check_eval_dropout on the last training input."""
        return self._test_model(self.last_input, training=False)

    def train_mode_check(self) -> dict[str, Any] | None:
        """The evaluation forwards left in training mode: how many, the modules that act differently there
        and, when there are none, two forwards of the first such input compared (F.dropout following
        self.training). None when there were none."""
        if self._grad_free:                    # the loop ended on a lone grad-free forward: its evaluation
            self._note_train_mode_eval(*self._grad_free)
            self._grad_free = False
        if not self.train_mode_evals:
            return None
        repeat = None if self.train_mode_modules else self._test_model(self.train_mode_input, training=True)
        return {"forwards": self.train_mode_evals, "modules": self.train_mode_modules, "repeat": repeat}


def shape_of(args: tuple) -> list:
    return [list(t.shape) for t in tensors_of(args[:1])]


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple) and hasattr(value, "_fields"):          # a namedtuple
        return type(value)(*(_detached(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def compute_dtype(model: nn.Module, device_type: str) -> torch.dtype:
    """The dtype a training forward computes its matmuls in: autocast's where the loop runs the model under it
    (the hook runs inside the loop's `with autocast`), else the weights' own (a model cast to bf16), else fp32."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    return weight.dtype if weight is not None and weight.dtype in (torch.bfloat16, torch.float16) else torch.float32
