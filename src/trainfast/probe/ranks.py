"""Each rank's own figures in a distributed run, as the probe times them (measure/ranks.py says what they mean and
how the straggler is judged).

`PhaseClock` times, on this rank, the two parts of a step that no collective evens out: the training forward
(hooks on the module the loop calls) and the optimizer step (torch's global optimizer-step hooks), summed per
optimizer update and closed when the probe closes the step. Its cost: four host clock reads a step. The data wait
is the step clock's own. The clock is the host's: on a GPU, where the host runs ahead of the device, these are the
host's times (the record says `clock`), and the wait stays the device's (measure/clock.py).

`gather_ranks` collects every rank's figures on every rank with one small all_gather_object, at a point every rank
reaches together (speed mode's stop, the built-in run's end, a Session's close), never inside the timed steps.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ..instruments.loaders import LoaderListener, listen
from ..measure.ranks import judge_ranks, rank_figures

# DDP's own timing (`_get_ddp_logging_data()`, nanoseconds): averages over the iterations it samples (its first
# ten and every hundredth after), filled on CPU (gloo) and CUDA alike.
DDP_FIGURES = {"forward_compute_s": "avg_forward_compute_time", "backward_compute_s": "avg_backward_compute_time",
               "backward_comm_s": "avg_backward_comm_time",
               "overlap_s": "avg_backward_compute_comm_overlap_time"}


class PhaseClock:
    """This rank's forward and optimizer seconds per optimizer update (the module docstring). `active()`: whether the
    run's own clock is the one running (the built-in run times some steps on a clock of its own, which these must not
    count). `module` None: a loop whose model is unknown (the doctor's), timed by global module hooks that keep the
    outermost module of each call (a Python call per module call, in the doctor's short run only); `closes`: each
    optimizer step closes its own step (no probe closes it); `loader`: the wait for each batch is timed here too, in
    torch DataLoader iterators' `__next__` (a script without a Session, whose step clock sees optimizer steps only),
    into `data_s`."""

    def __init__(self, module: torch.nn.Module | None, active: Callable[[], bool] = lambda: True,
                 closes: bool = False, loader: bool = False) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.active, self.closes, self.depth = active, closes, 0
        self.data_s: list[float] | None = [] if loader else None
        self._data = 0.0
        self._restore = self._wrap_loader() if loader else None
        self.forward_s: list[float] = []
        self.optimizer_s: list[float] = []
        self._forward = self._optimizer = 0.0
        self._started: float | None = None
        self._stepping: float | None = None
        self.module = module
        # Where this rank is in its step, for its heartbeat (rankfaults.py): one assignment per hook.
        self.phase = "start"
        self.handles = [register_optimizer_step_pre_hook(self._step_begins),
                        register_optimizer_step_post_hook(self._step_ends)]
        if module is not None:
            self.handles += [module.register_forward_pre_hook(self._forward_begins),
                             module.register_forward_hook(self._forward_ends)]
        else:
            from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

            self.handles += [register_module_forward_pre_hook(self._outer_begins),
                             register_module_forward_hook(self._outer_ends)]

    def _training(self, module: torch.nn.Module) -> bool:
        return module.training and torch.is_grad_enabled() and self.active()

    def _forward_begins(self, module, args) -> None:
        self._started = time.perf_counter() if self._training(module) else None
        if self._started is not None:
            self.phase = "forward"

    def _forward_ends(self, module, args, output) -> None:
        if self._started is not None:
            self._forward += time.perf_counter() - self._started
            self._started = None
            self.phase = "backward"

    def _wrap_loader(self) -> Callable[[], None]:
        """Times each next(batch) into this step's data seconds (instruments/loaders.py); returns what stops it."""
        return listen(_DataWait(self))

    def _outer_begins(self, module, args) -> None:
        if self.depth == 0:
            self._forward_begins(module, args)
        self.depth += 1

    def _outer_ends(self, module, args, output) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth == 0:
            self._forward_ends(module, args, output)

    def _step_begins(self, optimizer, args, kwargs) -> None:
        self._stepping = time.perf_counter() if self.active() else None
        if self._stepping is not None:
            self.phase = "optimizer"

    def _step_ends(self, optimizer, args, kwargs) -> None:
        if self._stepping is not None:
            self._optimizer += time.perf_counter() - self._stepping
            self._stepping = None
            if self.closes:
                self.close_step()

    def close_step(self) -> None:
        """An optimizer update closed the step: its phases are kept, the next step's start from zero. A step whose
        optimizer is still inside its post-hooks (the probe's global hook closes the step there) is counted to now."""
        if self._stepping is not None:
            self._optimizer += time.perf_counter() - self._stepping
            self._stepping = None
        self.phase = "data"
        self.forward_s.append(self._forward)
        self.optimizer_s.append(self._optimizer)
        if self.data_s is not None:
            self.data_s.append(self._data)
        self._forward = self._optimizer = self._data = 0.0

    def where(self) -> tuple[str, int]:
        """This rank's phase and the steps it has closed (its heartbeat's record)."""
        return self.phase, len(self.forward_s)

    def remove(self) -> None:
        self.phase = "done"
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self._restore is not None:
            self._restore()
            self._restore = None


class _DataWait(LoaderListener):
    """Each next(batch)'s seconds, into the phase clock's data seconds of the step (a batch that ends the pass too)."""

    def __init__(self, clock: PhaseClock) -> None:
        self.clock = clock

    def around_next(self, iterator, fetch):
        started = time.perf_counter()
        try:
            return fetch()
        finally:
            self.clock._data += time.perf_counter() - started


def ddp_figures(module: Any) -> dict[str, float] | None:
    """DDP's own compute, communication and overlap averages in seconds, and the communication it left exposed (not
    overlapped with the backward's compute); None where the module is not DDP or has sampled no iteration yet."""
    read = getattr(module, "_get_ddp_logging_data", None)
    if read is None:
        return None
    try:
        data = read()
    except RuntimeError:
        return None
    figures = {name: data[key] / 1e9 for name, key in DDP_FIGURES.items() if data.get(key)}
    if "backward_comm_s" not in figures:
        return None
    figures["exposed_comm_s"] = max(0.0, figures["backward_comm_s"] - figures.get("overlap_s", 0.0))
    return figures


def start_phases(probe, module: torch.nn.Module | None, active: Callable[[], bool] = lambda: True):
    """A PhaseClock for a run of several processes (None in one: there is no other rank to compare with); a script
    without a Session has its loader's waits timed by it."""
    if probe.world_size == 1:
        return None
    import os

    from ..rankfaults import HEARTBEATS_ENV, Heartbeat

    clock = PhaseClock(module, active, loader=probe.session is None)
    if os.environ.get(HEARTBEATS_ENV):       # a run of the ablation: where its ranks' heartbeats go (rankfaults.py)
        Heartbeat(os.environ[HEARTBEATS_ENV], int(os.environ.get("RANK", "0")), clock.where)
    return clock


def collect_ranks(probe) -> None:
    """Every rank's figures gathered and judged into `probe.ranks`, once; called by every rank at the same point
    (the module docstring). A run of one process, or one that never stepped, has none."""
    if probe.ranks is not None or probe.phases is None or probe.timer is None:
        return
    import os

    import torch.distributed as dist

    session = probe.session
    if session is None and not (dist.is_available() and dist.is_initialized()):
        return                  # ranks started by torchrun that never opened a process group: nothing to gather over
    timing = probe.timing()
    start = timing.warmup_steps
    clock = probe.phases
    waits = [s.data_wait_s for s in probe.timer.steps[start:start + len(timing.step_seconds)]]
    end = start + len(waits)
    if clock.data_s is not None:             # no Session: the loader's waits as the phase clock timed them
        waits = clock.data_s[start:end]
    mine = rank_figures(session.dist.rank if session is not None else int(os.environ.get("RANK", "0")),
                        timing.step_seconds[:len(waits)], waits, clock.forward_s[start:end],
                        clock.optimizer_s[start:end], timing.step_samples[:len(waits)])
    device = probe.device or torch.device("cpu")
    mine.update(clock="host" if device.type == "cuda" else "cpu",
                ddp=ddp_figures(session.dist.wrapped if session is not None else clock.module))
    gather = session.dist.gather_objects if session is not None else all_gather_objects
    probe.ranks = judge_ranks(gather(mine))
    clock.remove()


def all_gather_objects(value: Any) -> list[Any]:
    """A script without a Session: every rank's value over its own default process group."""
    import torch.distributed as dist

    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, value)
    return every


def agree_max(probe, value: int) -> int:
    """The largest `value` over every rank of the probe's run (each calls this at the same update: a collective),
    through its Session's process group where it has one, else torch.distributed's default group; `value` itself
    in one process."""
    if probe.session is not None:
        return max(probe.session.dist.gather(value))
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = probe.device if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor([value], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
