"""In-process pairing: every built-in run also timed against the baseline in alternating blocks inside its own
process, so process-level state (which of a shared machine's cores, what memory, which clock) cancels from the
ratio. Scored on the ratios where both rungs have them, on the runs' own rates otherwise; a rung whose switch
sets the whole process is compared across processes only, and says why."""
import math
import time

import pytest
import torch
from conftest import VirtualTime, scored_rung
from torch import nn

from trainfast.ablation.paired import PAIRED_BLOCKS, time_paired, unpaired_reason
from trainfast.ablation.scoring import ladder_noises, paired_repeats, pick_best, score_rungs
from trainfast.measure import BLOCK_SECONDS
from trainfast.recipe import Recipe
from trainfast.report.notes import caveats
from trainfast.stats import FASTER, SAME


def with_pairs(rung, ratios, reference_rate=1000.0, disturbed=0):
    """Give each run of a scored rung its in-process pair: rung blocks at ratio x the reference's rate."""
    for run, ratio in zip(rung.repeats, ratios):
        rate = ratio * reference_rate
        blocks = [{"samples": 64, "seconds": 64 / rate, "steps": 4, "disturbed": i < disturbed}
                  for i in range(PAIRED_BLOCKS)]
        ref = [{"samples": 64, "seconds": 64 / reference_rate, "steps": 4, "disturbed": False}] * PAIRED_BLOCKS
        run["paired"] = {"blocks": {"rung": blocks, "reference": ref}, "rate": rate,
                         "reference_rate": reference_rate, "ratio": ratio}
    return rung


# Processes that settle at two speeds (the baseline's 1000 or 700 samples/s, whatever the rung): the runs' own
# rates spread by ~20%, while inside each process the rung ran 1.30x (or 1.00x) the baseline's step.
LEVELS = [1.0, 0.7, 1.0, 0.7]


def split_ladder():
    base = scored_rung("baseline", [1000 * x for x in LEVELS], 0.9)
    fast = scored_rung("channels_last", [1300 * x for x in reversed(LEVELS)], 0.9, channels_last=True)
    same = scored_rung("fused", [1000 * x for x in reversed(LEVELS)], 0.9, optimizer_impl="fused")
    return base, fast, same


def test_process_level_spread_hides_a_30pc_gain_across_processes_and_the_pairs_resolve_it():
    base, fast, same = split_ladder()
    score_rungs([base, fast, same], {"fp32": 1e12})
    assert fast.result.verdict == SAME          # across processes: the 20% split swamps the gain
    base, fast, same = split_ladder()
    with_pairs(base, [1.0, 1.01, 0.99, 1.0])
    with_pairs(fast, [1.30, 1.28, 1.31, 1.29])
    with_pairs(same, [1.0, 0.99, 1.01, 1.0])
    score_rungs([base, fast, same], {"fp32": 1e12})
    assert fast.result.verdict == FASTER and abs(fast.result.speedup - 1.295) < 0.01
    assert same.result.verdict == SAME
    noise = base.result.noise
    assert noise["paired"] and noise["sigma_log"] < 0.02 < noise["process_sigma_log"]
    best, _, _ = pick_best([base, fast, same])
    assert best is fast


def test_a_rung_without_pairs_is_judged_on_the_runs_own_rates_and_says_why():
    base, fast, same = split_ladder()
    with_pairs(base, [1.0, 1.01, 0.99, 1.0])
    with_pairs(same, [1.0, 0.99, 1.01, 1.0])
    for run in fast.repeats:                    # its switch sets the process: no pair
        run["paired"] = {"unpaired": "passive_threads set(s) the whole process, so both runs of a pair would share it"}
    assert paired_repeats(fast) is None and paired_repeats(base) is not None
    noises = ladder_noises([base, fast, same])
    assert noises.paired is not None and noises.process is not None
    score_rungs([base, fast, same], {"fp32": 1e12})
    assert fast.result.verdict == SAME          # the process noise, not the pairs', judges it
    assert not fast.result.noise["paired"] and base.result.noise["paired"]
    assert any("across fresh processes only" in c and "passive_threads" in c for c in caveats(fast))


def test_disturbed_paired_blocks_are_left_out_and_their_runs_named():
    base = with_pairs(scored_rung("baseline", [1000] * 3, 0.9), [1.0] * 3)
    rung = with_pairs(scored_rung("amp", [1500] * 3, 0.9, precision="bf16"), [1.5, 1.5, 1.5], disturbed=0)
    rung.repeats[1]["paired"]["blocks"]["rung"][0] = {"samples": 64, "seconds": 5.0, "steps": 4, "disturbed": True}
    score_rungs([base, rung], {"fp32": 1e12, "bf16": 1e12})
    assert abs(rung.result.speedup - 1.5) < 0.01       # the disturbed block's 5 s left out
    assert any("seed 1: 1" in c and "disturbed" in c for c in caveats(rung))


def test_switches_that_set_the_whole_process_are_not_paired():
    base = Recipe()
    assert unpaired_reason(base.replace(precision="bf16", channels_last=True, optimizer_impl="fused"), base) is None
    assert unpaired_reason(base.replace(compile=True), base) is None       # per model: the reference stays eager
    for field, value in (("passive_threads", True), ("reuse_memory", True), ("cudnn_benchmark", True),
                         ("num_workers", 2)):
        why = unpaired_reason(base.replace(**{field: value}), base)
        assert why is not None and field in why
    assert "worker processes" in unpaired_reason(base.replace(num_workers=2), base.replace(num_workers=2))
    assert "multi-process" in unpaired_reason(base, base, nproc=2)


class Sleepy(nn.Module):
    """A tiny classifier whose forward also sleeps (on `clock`: advances it): a step of known extra cost."""

    def __init__(self, sleep_s: float, clock=time) -> None:
        super().__init__()
        self.sleep_s, self.clock = sleep_s, clock
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))

    def forward(self, x):
        self.clock.sleep(self.sleep_s)
        return self.net(x)


# The fast suite times the pair on a virtual clock (each step exactly its forward's sleep); the slow suite on the
# real one, with real sleeps beside the real steps.
@pytest.mark.parametrize("clock", ["virtual", pytest.param("real", marks=[pytest.mark.slow, pytest.mark.alone])])
def test_the_pair_measures_each_runs_own_step_in_alternating_blocks(clock, monkeypatch):
    import trainfast.measure.clock
    from trainfast.run import as_split, assemble_run

    virtual = VirtualTime() if clock == "virtual" else None
    if virtual:
        monkeypatch.setattr(trainfast.measure.clock, "time", virtual)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (256, 3, 8, 8), generator=g, dtype=torch.uint8)
    train = torch.utils.data.TensorDataset(images, torch.randint(0, 10, (256,), generator=g))
    split = as_split(train, train, num_classes=10, mean=[0.5] * 3, std=[0.25] * 3)
    recipe = Recipe(batch_size=16)
    # virtual: steps of 1/256 and 1/64 s, sums of which the clock adds up exactly
    quick_s, slow_s = (1 / 256, 1 / 64) if virtual else (0.0, 0.02)
    quick = assemble_run(Sleepy(quick_s, virtual or time), split, recipe, device="cpu", env=False)
    slow = assemble_run(Sleepy(slow_s, virtual or time), split, recipe, device="cpu", env=False)
    try:
        pair = time_paired(quick, slow, check=False)
    finally:
        quick.close()
        slow.close()
    assert len(pair["blocks"]["rung"]) == len(pair["blocks"]["reference"]) == PAIRED_BLOCKS
    assert all(b["steps"] == pair["steps_per_block"]["reference"] - 1 for b in pair["blocks"]["reference"])
    assert all(b["steps"] == pair["steps_per_block"]["rung"] - 1 for b in pair["blocks"]["rung"])
    assert abs(pair["ratio"] - pair["rate"] / pair["reference_rate"]) < 1e-9
    if virtual:
        # blocks of at least BLOCK_SECONDS of each run's own steps (plus the first, left out), and the rates of
        # 16 samples a step exactly: 1,024 and 4,096 samples/s
        assert pair["steps_per_block"] == {"reference": 1 + math.ceil(BLOCK_SECONDS / slow_s),
                                           "rung": 1 + math.ceil(BLOCK_SECONDS / quick_s)}
        assert pair["reference_rate"] == 16 / slow_s and pair["rate"] == 16 / quick_s and pair["ratio"] == 4
    else:
        # The slow side sleeps 20 ms a step: its rate is at most 16 / 0.02 = 800 samples/s, the quick side's far above.
        assert pair["reference_rate"] < 800 < pair["rate"] and pair["ratio"] > 2


def test_pairs_are_asked_for_and_off_by_default():
    from trainfast.ablation.loop import LadderOptions
    from trainfast.cli import build_parser

    assert LadderOptions().paired is False
    parser = build_parser()
    assert parser.parse_args(["ablate"]).paired is False
    assert parser.parse_args(["ablate", "--paired"]).paired is True
    assert parser.parse_args(["tune", "--paired"]).paired is True
