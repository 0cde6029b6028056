"""A user's DataLoader, adopted by `trainfast.Session.setup`.

The rule: the user's own loader object is kept whenever the run asks nothing of it, so a plain loop's data
order (its sampler, its generator, its draws from the global RNG) is kept bit for bit. Otherwise a
DataLoader is rebuilt with the same dataset, batch size, drop_last, sampler and collate function, and only
the changes the run needs:
  - under torchrun: a RandomSampler becomes a DistributedSampler (shuffled with the recipe's seed; the
    Session's loader calls `set_epoch` at every pass), a SequentialSampler an unpadded evaluation shard
    (distributed.Dist); a loader that already has a DistributedSampler keeps it. The generator becomes
    one per rank, so worker seeds differ per (rank, worker, epoch): torch seeds worker w of a pass with
    base_seed + w, base_seed drawn from that generator at every pass. (In one process the user's own
    generator or the seeded global RNG already gives per-(worker, epoch) streams.)
  - `num_workers`, `persistent_workers`, `prefetch_factor` when the recipe sets them (a Recipe left at the
    defaults 0 / False / None keeps the loader's own settings; "auto" measures, once, on the first loader)
  - `pin_memory` where it acts (CUDA with pin_memory or prefetch)
  - mean/std without `prefetch`: the dataset is wrapped to normalize its uint8 images on the host
    (data/device.py states the contract)
A loader that is not a DataLoader (a list of batches, a custom iterable) is used as it is: trainfast only
moves its batches to the device; under torchrun it must shard itself.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler, Sampler,
                              SequentialSampler)

from ..techniques.transfer import pin_memory_for
from .datasets import HostNormalized
from .loader import choose_num_workers, loader_generator, seed_worker, with_workers, worker_context


def adopt_loader(loader: Iterable, recipe, device: torch.device, dist, mean=None, std=None,
                 train: bool = False) -> Iterable:
    """`train`: the training loader, which the padding switches act on."""
    if not isinstance(loader, DataLoader):
        return loader
    changes = loader_changes(loader, recipe, device, dist, mean, std, train)
    return rebuild_loader(loader, **changes) if changes else loader


def loader_changes(loader: DataLoader, recipe, device: torch.device, dist, mean, std,
                   train: bool = False) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if dist.enabled:
        changes.update(shard(loader, recipe, dist))
    if train:
        changes.update(batch_changes(loader, recipe, dist))
    if recipe.num_workers not in (0, loader.num_workers):
        changes["num_workers"] = recipe.num_workers
    if recipe.persistent_workers and not loader.persistent_workers:
        changes["persistent_workers"] = True
    if recipe.prefetch_factor is not None and recipe.prefetch_factor != loader.prefetch_factor:
        changes["prefetch_factor"] = recipe.prefetch_factor
    if pin_memory_for(recipe, device) and not loader.pin_memory:
        changes["pin_memory"] = True
    if mean is not None and not recipe.prefetch:
        changes["dataset"] = HostNormalized(loader.dataset, mean, std)
    if changes and loader.worker_init_fn is not seed_worker:
        # Rebuilt anyway: workers also re-seed python and numpy from their torch seed (data/loader.py).
        changes["worker_init_fn"] = functools.partial(seed_then, loader.worker_init_fn)
    return changes


def batch_changes(loader: DataLoader, recipe, dist) -> dict[str, Any]:
    """The recipe's batch switches on a script's own training loader, through their declarations
    (techniques/padding.py): set on its collate function (a transformers collator's pad_to_multiple_of, in place),
    a counting collator wrapped around it where a switch removes padding (text/packing.py: it packs with
    padding_free), a sampler chosen (a length-grouped one). What cannot act is recorded on the counting collator
    with why (the Session reports it: Session.unsupported)."""
    from ..techniques import TrainBatches, asked_batches, batch_switches, choose_sampler, collate_batches

    values = asked_batches(recipe)
    if not values:
        return {}
    batches = TrainBatches(loader.collate_fn, loader=loader, sampler=own_sampler(loader), seed=recipe.seed,
                           dist=dist)
    count = any(hooks.counts for name, hooks in batch_switches() if name in values)
    changes: dict[str, Any] = {}
    collate = collate_batches(batches, values, count)
    if collate is not loader.collate_fn:
        changes["collate_fn"] = collate
    sampler = choose_sampler(batches, values)
    if sampler is not None:
        changes["sampler"] = sampler
    return changes


def seed_then(user_init: Callable[[int], None] | None, worker_id: int) -> None:
    """seed_worker, then the user's own worker_init_fn (a module-level function: picklable for spawn)."""
    seed_worker(worker_id)
    if user_init is not None:
        user_init(worker_id)


def own_sampler(loader: DataLoader) -> Sampler | None:
    """The sampler that orders the samples: the one inside torch's BatchSampler (or the loader's, without
    batching); None for a custom batch sampler, which trainfast does not take apart."""
    if loader.batch_sampler is None or type(loader.batch_sampler) is BatchSampler:
        return loader.sampler
    return None


def shard(loader: DataLoader, recipe, dist) -> dict[str, Any]:
    from ..recipe import RecipeError

    per_rank = {"generator": loader_generator(recipe.seed, dist.rank)}
    sampler = own_sampler(loader) or getattr(loader.batch_sampler, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        return per_rank
    if isinstance(loader.dataset, IterableDataset):
        raise RecipeError("under torchrun trainfast shards a DataLoader through its sampler, and an IterableDataset "
                          "has none: shard it by rank inside the dataset (torch.distributed.get_rank())")
    if own_sampler(loader) is None:
        raise RecipeError(f"under torchrun trainfast cannot shard a DataLoader with its own batch_sampler "
                          f"({type(loader.batch_sampler).__name__}); build it on a DistributedSampler")
    if isinstance(sampler, RandomSampler):
        return {**per_rank, "sampler": dist.train_sampler(loader.dataset, recipe.seed)}
    if isinstance(sampler, SequentialSampler):
        return {**per_rank, "sampler": dist.val_sampler(loader.dataset)}
    raise RecipeError(f"under torchrun trainfast cannot shard a DataLoader whose sampler is "
                      f"{type(sampler).__name__}; give it a DistributedSampler")


def rebuild_loader(loader: DataLoader, **changes: Any) -> DataLoader:
    """A new DataLoader like `loader`, with `changes` (any DataLoader argument, and `dataset`)."""
    dataset = changes.pop("dataset", loader.dataset)
    if isinstance(loader.dataset, IterableDataset):
        batching = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    elif own_sampler(loader) is not None:
        batching = {"batch_size": loader.batch_size, "drop_last": loader.drop_last,
                    "sampler": changes.pop("sampler", loader.sampler)}
    else:
        batching = {"batch_sampler": loader.batch_sampler}
        changes.pop("sampler", None)
    settings = {"num_workers": loader.num_workers, "collate_fn": loader.collate_fn, "pin_memory": loader.pin_memory,
                "timeout": loader.timeout, "worker_init_fn": loader.worker_init_fn,
                "multiprocessing_context": loader.multiprocessing_context, "generator": loader.generator,
                "prefetch_factor": loader.prefetch_factor, "persistent_workers": loader.persistent_workers,
                "pin_memory_device": loader.pin_memory_device, "in_order": loader.in_order, **changes}
    if settings["num_workers"] == 0:       # the DataLoader refuses worker-only settings without workers
        settings.update(prefetch_factor=None, persistent_workers=False, multiprocessing_context=None, timeout=0)
    elif settings["multiprocessing_context"] is None:
        settings["multiprocessing_context"] = worker_context()
    return DataLoader(dataset, **batching, **settings)


def resolve_loader_workers(loader: Iterable, recipe, device: torch.device, mean=None, std=None):
    """num_workers="auto": measured once on `loader` (its batch size and collate function, the run's
    normalization), written into the recipe so every loader of the run uses the same count. A loader whose
    samples cannot be drawn at random (not a DataLoader, an IterableDataset) keeps its own count (0)."""
    if recipe.num_workers != "auto":
        return recipe
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return with_workers(recipe, 0)
    dataset = HostNormalized(loader.dataset, mean, std) if mean is not None and not recipe.prefetch else loader.dataset

    def build(n: int, sampler: Sampler) -> DataLoader:
        return rebuild_loader(loader, dataset=dataset, num_workers=n, sampler=sampler, persistent_workers=False,
                              prefetch_factor=None)

    workers = choose_num_workers(dataset, recipe, device, build=build, batch_size=loader.batch_size or 1)
    return with_workers(recipe, workers)


def epoch_sampler(loader: Iterable) -> Sampler | None:
    """The sampler whose order changes with `set_epoch` (a DistributedSampler), if the loader has one."""
    if not isinstance(loader, DataLoader):
        return None
    sampler = own_sampler(loader) or getattr(loader.batch_sampler, "sampler", None)
    return sampler if hasattr(sampler, "set_epoch") else None


def loader_generators(loader: Iterable) -> list[torch.Generator]:
    """The generators that draw a DataLoader's order and worker seeds (its own, and its sampler's when that
    is another one): what a checkpoint saves so the next pass after a resume shuffles as it would have."""
    if not isinstance(loader, DataLoader):
        return []
    found = [loader.generator, getattr(own_sampler(loader), "generator", None)]
    unique = {id(g): g for g in found if isinstance(g, torch.Generator)}
    return list(unique.values())
