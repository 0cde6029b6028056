"""Where a step waits for its batch: the input-bound verdict, the wait itself (confirmed by replaying a cached
batch), and whether loader workers would win it back or only add their handoff."""
from __future__ import annotations

from .findings import INPUT_BOUND_SHARE, LAUNCH_BOUND_BUSY, MATERIAL_SHARE, NOT_HERE, Finding, Observations, ms, pct


def bound(obs: Observations) -> str | None:
    """input-bound | compute-bound | launch-bound (CUDA profile), or None without a data wait to judge."""
    share, gain = obs.wait_share, obs.replay_gain
    if share is None:
        return None
    if share >= INPUT_BOUND_SHARE and (gain is None or gain >= MATERIAL_SHARE):
        return "input-bound"
    if obs.busy_share is not None and obs.busy_share < LAUNCH_BOUND_BUSY:
        return "launch-bound"
    return "compute-bound"


def data_wait(obs: Observations) -> Finding:
    share, gain, step = obs.wait_share, obs.replay_gain, obs.step_s
    if share is None:
        return Finding("waiting for the next batch", "time", NOT_HERE, no_loader(obs) + ", so the wait for each "
                       "batch cannot be timed apart from the step")
    wait = obs.wait_s
    text = f"{pct(share)} of each step ({ms(wait)} of {ms(step)}) is spent waiting for the next batch"
    if gain is not None:
        text += (f"; replaying one cached batch (no loader) runs a step in {ms(obs.replay_s)}: a faster loader could "
                 f"save at most {pct(max(gain, 0.0))} of the step")
    else:
        text += "; the cached-batch replay was not run for this loop"
    verdict = bound(obs)
    cost = max(0.0, gain) * step if gain is not None else wait
    if verdict == "input-bound":
        if workers_cannot_pay(obs):
            # A wait no worker can win back: a number to know, and the one change that would shorten it
            return Finding("waiting for the next batch", "time", "measured", f"input-bound: {text}; a worker would "
                           f"add {ms(obs.handoff_s)} a batch to hand it over (measured on this loop's batch), more "
                           "than the wait: workers cannot win it back", cost, cost / step,
                           f"not loader workers: {CHEAPER_BATCHES}")
        if handoff_bound(obs):
            return Finding("waiting for the next batch", "time", "measured", f"input-bound: {text}; handing a batch "
                           f"over from a worker costs this process {ms(obs.handoff_s)} (measured on this loop's "
                           "batch): the wait is mostly that handoff, which more workers would not shorten",
                           cost, cost / step, "fewer workers: DataLoader(num_workers=0) builds each batch in this "
                           "process with no handoff, which pays where building one costs less than handing it over; "
                           + CHEAPER_BATCHES)
        if obs.recipe_flags:
            fix = ("--num-workers auto (more loader processes), --prefetch (uint8 transport, normalize on the "
                   "device), --decode-cache for image folders")
        else:
            fix = ("DataLoader(num_workers=N, persistent_workers=True) (`trainfast ablate --switches workers -- "
                   "COMMAND` sets them on the script's training loader as it is and measures them); uint8 images "
                   "from the workers, converted and normalized after the copy to the device; for photos, decode "
                   "once into a cache")
        return Finding("waiting for the next batch", "time", "problem", f"input-bound: {text}", cost, cost / step, fix)
    # Below the input-bound line a saving the replay confirms is still worth knowing (num_workers=0 names its fix)
    material = gain is not None and gain >= MATERIAL_SHARE and share >= MATERIAL_SHARE
    return Finding("waiting for the next batch", "time", "measured" if material else "fine", f"{verdict}: {text}",
                   cost, cost / step)


def no_loader(obs: Observations) -> str:
    return ("the loop draws no batch from a torch DataLoader (it makes its batches itself)" if not obs.recipe_flags
            else "the loop's batches do not come through a trainfast loader (Session.setup)")


def workers_cannot_pay(obs: Observations) -> bool:
    """A loop without workers whose wait per batch is no more than what a worker adds to hand a batch over."""
    return (obs.num_workers == 0 and obs.handoff_s is not None and obs.wait_s is not None
            and obs.handoff_s >= obs.wait_s)


def handoff_bound(obs: Observations) -> bool:
    """A loop with workers whose wait per batch is within twice what handing a batch over costs: the wait is the
    transfer from the workers, not their work."""
    return (bool(obs.num_workers) and obs.handoff_s is not None and obs.wait_s is not None
            and obs.wait_s <= 2 * obs.handoff_s)


CHEAPER_BATCHES = ("make each batch cheaper to build in this process: a dataset indexed with a whole batch of "
                   "indices at once (a `__getitems__`, or slicing in-memory tensors) instead of one sample at a time "
                   "and a collate")


def num_workers(obs: Observations) -> Finding:
    name = "num_workers=0"
    share, gain = obs.wait_share, obs.replay_gain
    if obs.num_workers is None or share is None:
        return Finding(name, "mistake", NOT_HERE, no_loader(obs) + ": its workers and its wait are unknown")
    if obs.num_workers > 0:
        return Finding(name, "mistake", "fine", f"{obs.num_workers} loader worker(s)")
    text = f"the loader runs in the training process; the wait is {pct(share)} of the step"
    fix = "--num-workers auto" if obs.recipe_flags else "DataLoader(num_workers=2 or more)"
    if workers_cannot_pay(obs):
        text += (f" ({ms(obs.wait_s)}), and a worker would add {ms(obs.handoff_s)} a batch to this process to hand "
                 "the batch over (received from shared memory: measured on this loop's batch): workers cannot win "
                 "the wait back; " + CHEAPER_BATCHES)
        return Finding(name, "mistake", "measured" if share >= MATERIAL_SHARE else "fine", text)
    if gain is not None:
        text += f" and the cached-batch replay is {pct(max(gain, 0.0))} faster"
        # Material only when both say so: a wait the replay does not confirm is the loader's own noise.
        if share >= MATERIAL_SHARE and gain >= MATERIAL_SHARE:
            cost = gain * obs.step_s
            return Finding(name, "mistake", "problem", text, cost, cost / obs.step_s, fix)
    else:
        # Without the replay nothing confirms that workers would win the wait back (on a CPU they take cores
        # from the compute): a problem only where the loop is input-bound; a smaller wait is a number to know.
        if share >= INPUT_BOUND_SHARE:
            text += " (no cached-batch replay for this loop: the wait alone decides, and bounds the saving)"
            return Finding(name, "mistake", "problem", text, obs.wait_s, obs.wait_s / obs.step_s, fix)
        if share >= MATERIAL_SHARE:
            return Finding(name, "mistake", "measured", text + ": loader workers could save up to that, unconfirmed "
                           f"(no cached-batch replay for this loop) and below the {pct(INPUT_BOUND_SHARE)} that "
                           "makes a loop input-bound")
        text += " (no cached-batch replay for this loop: the wait alone decides, and bounds the saving)"
    return Finding(name, "mistake", "fine", text + f": below the {pct(MATERIAL_SHARE)} that would make workers pay")
