"""Distributed training on PyTorch's own engine: torch.distributed, launched by torchrun.

Everything that knows about ranks lives here; the engine and the trainer only see small objects:
  - `setup_distributed` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and
    opens the process group (gloo on CPU, nccl on CUDA, one device per local rank). Without torchrun it
    returns a single-process `Dist` whose every method is a no-op, so one code path serves both.
  - samplers: DistributedSampler for training (shuffled with the recipe seed, `set_epoch` every epoch,
    drop_last so every rank runs the same number of steps), unpadded shards for evaluation.
  - wrapping by `strategy`: "ddp" (DistributedDataParallel, one process per device: the default),
    "fsdp" (FSDP2 `fully_shard`, parameters sharded over ranks, mixed precision through its own
    MixedPrecisionPolicy), "dp" (legacy single-process nn.DataParallel with the loss computed inside each
    replica, CUDA only).
  - gradient-sync control for accumulation (what DDP's `no_sync` switches, FSDP2 `set_requires_gradient_sync`).
  - collective decisions: a non-finite loss on any rank stops every rank at the same step; a rank that
    stops answering is named within `dist_timeout_s` (a gloo `monitored_barrier`).
  - reductions of train/eval metrics, rank-0-only writing, `destroy_process_group` at the end, after the
    gloo workers have let go of the last collective's tensors (`drain_collectives`).
"""
from __future__ import annotations

import atexit
import contextlib
import copy
import os
import socket
import time
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, DistributedSampler, Sampler

from .defaults import usable_cpus
from .measure import LossTermsError
from .techniques import apply_wrap_switches, read_wrap_switches, wrap_options


def always_sync(update: bool) -> None:
    """One process (or DataParallel): nothing to hold back."""


# How long a process that is about to exit lets gloo's worker threads finish releasing their last collective.
DRAIN_S = 0.1


def drain_collectives() -> None:
    """Give gloo's worker threads the GIL before the interpreter shuts down. A gloo worker frees a finished
    collective's work object, and with it the Python tensors it was handed, just after the caller's wait()
    has returned; freeing them needs the GIL. A process that ends within a few milliseconds of its last
    collective (every rank of a speed-mode run does: they agree to stop, then leave) reaches interpreter
    finalization first, the worker cannot take the GIL any more, its thread is torn down inside a C++
    destructor and the process aborts ("terminate called without an active exception", exit -6, the
    rung reported failed: seen in CI, and 7 of 30 times on 2 cores with two ranks that all_gather then
    exit; 0 of 40 with this pause). Sleeping releases the GIL, so the workers finish while Python can
    still serve them."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        time.sleep(DRAIN_S)


class RankTimeoutError(RuntimeError):
    """A rank did not answer within dist_timeout_s; the message names it."""


def launched_by_torchrun() -> bool:
    """torchrun (and torch.distributed.elastic) set WORLD_SIZE; a world of one is a plain single process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ShardSampler(Sampler[int]):
    """Evaluation shard: indices rank, rank + world, ... with no padding, so every held-out sample is
    counted exactly once over all ranks (DistributedSampler would repeat up to world-1 samples)."""

    def __init__(self, dataset: Dataset, rank: int, world_size: int) -> None:
        self.indices = range(rank, len(dataset), world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def grad_sync(trained: nn.Module) -> Callable[[bool], None]:
    """`sync(update)` for gradient accumulation, called by the Session's module before each training
    forward: whether the coming backward all-reduces gradients. Only the micro-step that ends in an
    optimizer update does. DDP decides when the forward runs (its reducer prepares for the backward
    there, exactly what its `no_sync()` context switches off); FSDP2 reads its switch in the backward.
    Both settings persist until the next forward sets them again. A no-op in one process."""
    if hasattr(trained, "require_backward_grad_sync"):    # DDP (the module before torch.compile wraps it)
        def sync_ddp(update: bool) -> None:
            trained.require_backward_grad_sync = update
        return sync_ddp
    if hasattr(trained, "set_requires_gradient_sync"):     # FSDP2 module
        return trained.set_requires_gradient_sync
    return always_sync


def warn_unused(unused: list[str]) -> None:
    warnings.warn(
        f"{len(unused)} parameter(s) received no gradient on the first step: {', '.join(unused)}. "
        "DDP would hang or fail on them, so find_unused_parameters=True is on for this run; it "
        "traverses the autograd graph every step. Freeze them (requires_grad=False) or remove them "
        "to avoid that cost, or pass --find-unused-parameters to say you accept it.",
        UnusedParametersWarning, stacklevel=3)


class Collectives:
    """What the ranks of a job agree on and add up, over the separate gloo group (`monitor`, on the CPU: no device
    sync): the collective decisions (every rank raises, skips or stops at the same step) and the reductions of the
    numbers it logs. Dist's base: Dist holds where this process stands (`enabled`, `rank`, `world_size`,
    `timeout_s`, `monitor`), which these read; in a world of one each is a no-op."""

    # --- collective decisions -------------------------------------------------------------------------
    def agree_nonfinite(self, first_bad: int | None) -> list[tuple[int, int]]:
        """Called by every rank at every metrics read (Meter.flush): returns (rank, first non-finite
        step) for every rank that saw one, so all ranks raise at the same read. Also a liveness check: a
        rank that does not arrive within dist_timeout_s is named."""
        if not self.enabled:
            return [] if first_bad is None else [(self.rank, first_bad)]
        self.check_alive()
        every = self.gather(-1 if first_bad is None else first_bad)
        return [(r, step) for r, step in enumerate(every) if step >= 0]

    def gather(self, value: int) -> list[int]:
        """Every rank's integer, on every rank (gloo, CPU: no device sync). The building block of a
        collective decision: e.g. a corrupt-sample count every rank compares to the same threshold."""
        if not self.enabled:
            return [value]
        mine = torch.tensor([value], dtype=torch.long)
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine, group=self.monitor)
        return [int(t) for t in every]

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's picklable value, on every rank (checkpoints gather per-rank RNG and data order)."""
        if not self.enabled:
            return [value]
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, value, group=self.monitor)
        return every

    def agree_finite(self, finite: torch.Tensor) -> bool:
        """nonfinite=skip: a step is kept only if its loss is finite on every rank, so all ranks skip the
        same steps and their replicas stay identical."""
        return min(self.gather(int(finite))) == 1

    def check_alive(self, timeout_s: float | None = None) -> None:
        """gloo monitored_barrier: rank 0 waits for every rank and names the ones that did not come."""
        if not self.enabled:
            return
        timeout = timedelta(seconds=timeout_s or self.timeout_s)
        try:
            dist.monitored_barrier(group=self.monitor, timeout=timeout, wait_all_ranks=True)
        except RuntimeError as exc:
            raise RankTimeoutError(
                f"a rank stopped answering within {timeout.total_seconds():.0f}s (dist_timeout_s); "
                f"seen from rank {self.rank}: {exc}") from exc

    @contextlib.contextmanager
    def watch(self):
        """Around an epoch: a collective that times out (a silent rank) is re-raised naming the silent
        rank(s), found with a short monitored barrier on the separate gloo group."""
        try:
            yield
        except RankTimeoutError:
            raise
        except RuntimeError as exc:
            timed_out = any(word in str(exc).lower() for word in ("timed out", "timeout"))
            if self.enabled and timed_out:
                self.check_alive(timeout_s=min(self.timeout_s, 10.0))   # raises naming the silent rank(s)
            raise

    # --- reductions ---------------------------------------------------------------------------------
    def sum(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self.monitor)
        return t.tolist()

    def reduce_train(self, loss: float, correct: int, samples: int) -> tuple[float, float]:
        """Epoch train loss (mean over ranks of equal step counts) and accuracy over all ranks' samples."""
        if not self.enabled:
            return loss, correct / max(1, samples)
        loss_sum, correct, samples = self.sum([loss, correct, samples])
        return loss_sum / self.world_size, correct / max(1, samples)

    def reduce_terms(self, sums: dict[str, float]) -> dict[str, float]:
        """Each loss term's window sum, averaged over ranks (for logging; Meter.flush). The ranks' term names
        are gathered first: ranks whose models return different terms would otherwise all-reduce lists of
        different lengths and hang; instead every rank raises the same error, naming each rank's terms."""
        if not self.enabled:
            return dict(sums)
        names = sorted(sums)
        every = self.gather_objects(names)
        if any(other != names for other in every):
            listed = "; ".join(f"rank {rank}: {', '.join(keys) or '(none)'}" for rank, keys in enumerate(every))
            raise LossTermsError(f"the ranks' models returned different loss terms ({listed}); every rank must "
                                 "return the same loss dict keys")
        return {name: total / self.world_size for name, total in zip(names, self.sum([sums[n] for n in names]))}

    def reduce_eval(self, metrics: dict[str, float]) -> dict[str, float]:
        if not self.enabled:
            return metrics
        n = metrics["samples"]
        loss_sum, correct, n = self.sum([metrics["loss"] * n, metrics["accuracy"] * n, n])
        return {"loss": loss_sum / max(1, n), "accuracy": round(correct) / max(1, n), "samples": int(n)}


@dataclass
class Dist(Collectives):
    """Where this process stands in the job. The default (world of one) is the single-process no-op."""
    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    strategy: str = "ddp"
    timeout_s: float = 300.0
    find_unused_parameters: bool = False
    monitor: Any = None                      # separate gloo group: monitored_barrier, scalar reductions
    owns_group: bool = False                 # we opened the process group, so we close it
    samplers: list = field(default_factory=list)
    wrapped: Any = None                      # the DDP / FSDP2 module wrap() built: what wrap switches read back

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs and writes reports, metrics and checkpoints."""
        return self.rank == 0

    # --- data ---------------------------------------------------------------------------------------
    def train_sampler(self, dataset: Dataset, seed: int) -> Sampler | None:
        if not self.enabled:
            return None
        # drop_last: every rank gets the same number of samples, hence the same number of steps (a rank
        # with one step more would wait forever in its gradient all-reduce).
        sampler = DistributedSampler(dataset, self.world_size, self.rank, shuffle=True, seed=seed, drop_last=True)
        self.samplers.append(sampler)
        return sampler

    def val_sampler(self, dataset: Dataset) -> Sampler | None:
        if not self.enabled:
            return None
        if self.strategy == "fsdp":
            # FSDP2's forward all-gathers parameters: every rank must run the same number of eval batches,
            # so the shards are padded (up to world-1 samples counted twice; said in the docs).
            return DistributedSampler(dataset, self.world_size, self.rank, shuffle=False)
        return ShardSampler(dataset, self.rank, self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """A different shuffle every epoch, the same on every rank (seed + epoch)."""
        for sampler in self.samplers:
            sampler.set_epoch(epoch)

    # --- model --------------------------------------------------------------------------------------
    def probe_unused(self, model: nn.Module, loss_of: Callable[[nn.Module], torch.Tensor]) -> list[str]:
        """One forward/backward on a copy of the model (`loss_of(copy)`: the run's summed loss on its first
        samples): parameters that get no gradient are named in a warning, and DDP's find_unused_parameters (a
        full autograd-graph traversal every step) is switched on only then. Costs one extra step on a copy,
        once, under DDP only."""
        if not (self.enabled and self.strategy == "ddp") or self.find_unused_parameters:
            return []
        unused = find_unused_parameters(model, loss_of, self.device)
        if unused:
            if self.is_main:
                warn_unused(unused)
            self.find_unused_parameters = True
        return unused

    def wrap(self, model: nn.Module, recipe) -> nn.Module:
        """The module the training step calls. `model` keeps owning the parameters (eval, saving); the
        optimizer is built after this call because FSDP2 replaces parameters with DTensor shards in place."""
        if self.strategy == "dp" and torch.cuda.device_count() > 1:
            return ReplicaForward(nn.DataParallel(ReplicaLoss(model)))
        if not self.enabled:
            return model
        options = wrap_options(recipe, self.strategy)        # the wrap switches' constructor options
        if self.strategy == "fsdp":
            wrapped = apply_fsdp(model, recipe.precision, options)
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            wrapped = DDP(model, device_ids=ids, find_unused_parameters=self.find_unused_parameters, **options)
        apply_wrap_switches(wrapped, recipe, self.strategy)   # then their work on it, in WRAP_ORDER
        self.wrapped = wrapped
        return wrapped

    def wrap_state(self) -> dict[str, Any]:
        """The wrap switches read back from the wrapper this process built (field -> state): every run's proof.
        Empty in one process, where nothing is wrapped."""
        return read_wrap_switches(self.wrapped, self.strategy) if self.wrapped is not None else {}

    def precision_name(self, recipe) -> str:
        """Under FSDP2 the MixedPrecisionPolicy casts parameters, so autocast is not layered on top."""
        return "fp32" if self.enabled and self.strategy == "fsdp" else recipe.precision

    def criterion(self, loss_fn: Callable) -> Callable:
        """dp computes the loss inside each replica; every other strategy uses the loss as given."""
        return ParallelCriterion(loss_fn) if self.strategy == "dp" and torch.cuda.device_count() > 1 else loss_fn

    grad_sync = staticmethod(grad_sync)     # it reads no state of the job: a module function, kept as dist.grad_sync

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Unsharded CPU weights (collective under FSDP2: every rank calls it; rank 0 writes them)."""
        if self.enabled and self.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            drain_collectives()
            dist.destroy_process_group()


class UnusedParametersWarning(UserWarning):
    pass


def rank_threads(environ) -> int | None:
    """Each CPU rank's share of the cores, or None where the user chose (OMP_NUM_THREADS). torchrun's command line
    gives each of several ranks one thread when the user set none; a launch through its Python API (the ablation's
    --nproc rungs) does not, and every rank then takes every core: ranks that oversubscribe the cores wait on each
    other at every collective."""
    if "OMP_NUM_THREADS" in environ:
        return None
    return max(1, usable_cpus() // max(1, int(environ.get("LOCAL_WORLD_SIZE", "1"))))


def setup_distributed(recipe, device: torch.device) -> Dist:
    """The process group from torchrun's environment, or the single-process no-op without it."""
    if not launched_by_torchrun():
        return Dist(device=device, strategy=recipe.strategy, find_unused_parameters=recipe.find_unused_parameters)
    from .recipe import RecipeError

    if recipe.strategy == "dp":
        raise RecipeError("strategy=dp is single-process nn.DataParallel; under torchrun use strategy=ddp")
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    timeout = timedelta(seconds=recipe.dist_timeout_s)
    owns = not dist.is_initialized()          # a caller's own group is used as it is, and left open
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        if owns:
            dist.init_process_group("nccl", timeout=timeout, device_id=device)
    elif owns:
        dist.init_process_group("gloo", timeout=timeout)
    if device.type == "cpu" and (threads := rank_threads(os.environ)) is not None:
        torch.set_num_threads(threads)
    # A separate gloo group for liveness checks and scalar reductions: it still works after a collective
    # of the training group timed out (which closes that group's connections), so it can name the rank.
    monitor = dist.new_group(backend="gloo", timeout=timeout)
    group = Dist(device=device, rank=rank, world_size=world, local_rank=local, strategy=recipe.strategy,
                 timeout_s=recipe.dist_timeout_s, find_unused_parameters=recipe.find_unused_parameters,
                 monitor=monitor, owns_group=owns)
    if owns:
        atexit.register(group.close)      # also after an error (callers close it on success)
    return group


def find_unused_parameters(model: nn.Module, loss_of: Callable[[nn.Module], torch.Tensor],
                           device: torch.device) -> list[str]:
    """Names of trainable parameters with no gradient after one forward/backward (`loss_of(copy)`) on a copy
    with the RNG forked, so the run's weights, BN statistics and random streams are untouched."""
    shadow = copy.deepcopy(model).to(device).train()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        loss_of(shadow).backward()
    return [name for name, p in shadow.named_parameters() if p.requires_grad and p.grad is None]


def apply_fsdp(model: nn.Module, precision: str, options: dict[str, Any] | None = None) -> nn.Module:
    """FSDP2: shard each direct child that holds parameters, then the root (torchtitan's pattern: one
    all-gather per block, overlapped with the previous block's compute). bf16 goes through
    MixedPrecisionPolicy: bf16 compute and all-gathers, fp32 gradient reduction and master shards.
    `options`: the wrap switches' fully_shard keywords (reshard_after_forward), given to every call."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from .techniques.precision import DTYPES

    dtype = DTYPES[precision]
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for child in model.children():
        if any(p.requires_grad for p in child.parameters()):
            fully_shard(child, mp_policy=policy, **(options or {}))
    return fully_shard(model, mp_policy=policy, **(options or {}))


# --- legacy nn.DataParallel with the loss inside each replica (a parallel criterion: no imbalance on the first GPU) ---
# DataParallel runs one process driving all GPUs: it replicates the module every step, scatters inputs,
# and gathers outputs on GPU 0. Gathering the logits and computing the loss there makes GPU 0 hold every
# replica's outputs (it runs out of memory first) and serializes the loss. Here each replica computes its
# own loss and predictions, and only per-replica loss sums and predicted labels are gathered. DDP is still
# preferred: no per-step replication, no GIL contention, gradient all-reduce overlapped with backward.


class ReplicaLoss(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Callable):
        outputs = self.model(inputs)
        n = targets.shape[0]
        return (loss_fn(outputs, targets) * n).reshape(1), outputs.detach().argmax(dim=-1)


class PendingForward:
    """What the engine's `forward(inputs)` returns under dp: the loss needs the targets, so the replicas
    run when the criterion is called. Quacks like outputs for the meter's `argmax`."""

    def __init__(self, module: nn.DataParallel, inputs: torch.Tensor) -> None:
        self.module, self.inputs, self.predictions = module, inputs, None

    def run(self, targets: torch.Tensor, loss_fn: Callable) -> torch.Tensor:
        loss_sums, self.predictions = self.module(self.inputs, targets, loss_fn)
        return loss_sums.sum() / targets.shape[0]

    def detach(self) -> "PendingForward":
        return self

    def argmax(self, dim: int = -1) -> torch.Tensor:
        return self.predictions


class ReplicaForward(nn.Module):
    def __init__(self, parallel: nn.DataParallel) -> None:
        super().__init__()
        self.parallel = parallel

    def forward(self, inputs: torch.Tensor) -> PendingForward:
        return PendingForward(self.parallel, inputs)


class ParallelCriterion:
    def __init__(self, loss_fn: Callable) -> None:
        self.loss_fn = loss_fn

    def __call__(self, outputs: PendingForward, targets: torch.Tensor) -> torch.Tensor:
        return outputs.run(targets, self.loss_fn)


# --- launching workers from Python (ablate --nproc, tests) ---------------------------------------------

def launch_local(fn: Callable, args: tuple, nproc: int, run_id: str = "trainfast", nodes=None) -> Any:
    """Run `fn(*args)` in `nproc` worker processes through torch.distributed.elastic (what torchrun
    uses), rendezvous on 127.0.0.1 at a free port; returns rank 0's return value. `nodes` (nodes.RunNodes): this
    node's share of a job of several nodes instead, met at its endpoint; rank 0's value on node 0, None elsewhere."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    where = (nodes.launch_options() if nodes is not None else
             dict(min_nodes=1, max_nodes=1, run_id=run_id, rdzv_backend="c10d",
                  rdzv_endpoint=f"127.0.0.1:{free_port()}"))
    config = LaunchConfig(nproc_per_node=nproc, max_restarts=0, monitor_interval=0.5, start_method="spawn", **where)
    return elastic_launch(config, fn)(*args).get(0)
