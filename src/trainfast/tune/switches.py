"""The switches the search tries, in its priority order, and what a stage-1 rung tells about one of them."""
from __future__ import annotations

import torch

from ..ablation import plan_rungs
from ..recipe import Recipe
from ..results import EffectLabel, Rung, Status
from ..stats import FASTER
from ..techniques import owner, tune_priority

PRECISION_FIELDS = ("precision", "precision_level")

# Where the budget cannot fit every switch, a stage cuts its last ones: this order is the search's priority, as the
# switches declare it (techniques/: RungSpec.tune). After the precision levels (the largest gains where the device
# has a fast half type), the switches that make the arithmetic cheaper or take work off the data path (in our
# ablations: channels_last 1.16-1.30x on top of bf16 on conv nets, the decode cache ~1.08x on photos), then the
# bookkeeping ones, compile last (its runs are the slowest, and a short planned run does not repay it anyway).
PRIORITY = tune_priority()


def single_names(amp: str, image_folder: bool, task: str = "classification") -> list[str]:
    """Stage 1's switches in the search's priority, those the task can run (a language model has no use for an
    image prefetcher: its data is not what prefetch acts on, Task.rules_out). The input switches that pay only once
    the step outruns its input (more loader workers, decoding on the device) are stage 3's (inputs.py): the decode
    cache is tried in both, as it also takes the decode off a CPU step that its workers share the cores with. A
    switch on image-folder files (Switch.data) is tried only where `image_folder`: the data is such a folder."""
    from ..ablation.ladders import LADDERS
    from ..recipe import RecipeError
    from ..tasks import declared

    checker, table = declared(task), LADDERS[task][1]

    def runs(name: str) -> bool:
        if not image_folder and any(owner(f).data == "image_folder" for f in table[name]):
            return False
        if checker.rules_out(table[name]) is not None:
            return False
        try:
            checker.validate(Recipe().replace(**table[name]))
        except RecipeError:
            return False
        return True
    return [f"autocast-{amp}", f"master-{amp}", *(n for n in tune_priority(task) if runs(n))]


def plan_singles(base: Recipe, names: list[str], amp: str, dev: torch.device, slow: str | None,
                 task: str = "classification") -> list[Rung]:
    """Stage 1's rungs: the baseline, then every switch in `names` alone on it, in the search's priority.
    `slow`: why the device's half type is slower than fp32 here (a CPU without half-precision hardware),
    which rules the precision levels out (shown, not run)."""
    rungs = [r for r in plan_rungs(base, names, "each", amp, dev, task) if r.name == "baseline" or r.name in names]
    rungs = rungs[:1] + sorted(rungs[1:], key=lambda r: names.index(r.name))
    if slow:
        for rung in rungs:
            if "precision" in rung.changes:
                rung.rule_out(EffectLabel.SLOW_HALF, slow)
    return rungs


def is_level(rung: Rung) -> bool:
    """Whether the rung's switch is a precision level."""
    return any(k in rung.changes for k in PRECISION_FIELDS)


def firm_gain(rung: Rung) -> bool:
    r = rung.result
    return rung.status == Status.DONE and r.verdict == FASTER and r.is_firm and not r.metric_worse


def kept_level(singles: list[Rung], in_combination: list[str]) -> Rung | None:
    """The precision level the combination keeps (combine keeps at most one), or None."""
    return next((r for r in singles if r.name in in_combination and is_level(r)), None)


def on_level_order(others: list[Rung]) -> list[Rung]:
    """Stage 1b's priority, from what stage 1 found in fp32: the switches that gained firmly there first (the
    largest first), then those it could not fit (PRIORITY order), then those that did not gain (the largest
    estimate first: a switch can pay on top of half precision and not in fp32, as channels_last does)."""
    def key(rung: Rung) -> tuple[int, float]:
        if rung.status != Status.DONE or not rung.result.speedup:
            return 1, float(PRIORITY.index(rung.name) if rung.name in PRIORITY else len(PRIORITY))
        return (0 if firm_gain(rung) else 2), -rung.result.speedup
    return sorted(others, key=key)
