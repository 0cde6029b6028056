"""What the report prints must be readable and true: a run far slower than its twins is named rather than folded
into every interval, an interval that bounds nothing is not printed as a figure, and no epoch is shown faster
than its own step alone. Faked runs: the truth is known."""
from __future__ import annotations

import re

from conftest import scored_rung
from trainfast.ablation.scoring import score_rungs
from trainfast.report.notes import caveats
from trainfast.report.summary import repeatability_line
from trainfast.report.table import Columns, step_alone_text, table_rows
from trainfast.results import AblationResult, RungResult


def test_a_run_three_times_slower_than_its_twin_is_named_and_no_unreadable_interval_is_printed():
    # The baseline's two runs measured 184 and 56 samples/s (the slow one's cores taken by other work).
    rungs = [scored_rung("baseline", [184, 56], 0.9), scored_rung("fused", [161, 165], 0.9, optimizer_impl="fused")]
    rungs[0].repeats[1]["process"] = {"preempted": 22224}
    for block in rungs[0].repeats[1]["timing"]["blocks"]:
        block["foreign_share"] = 0.2                       # other work on the machine, under the disturbed line
    score_rungs(rungs, {"fp32": 1e12}, [0.9, 0.9])
    named = " ".join(caveats(rungs[0]))
    assert re.search(r"the run of seed 1 measured 5\d\.?\d*/s, 3\.\dx slower than its twin\(s\) \(18\d\)", named), named
    assert "preempted 22,224 times" in named and "run the ablation again on a quiet machine" in named
    assert not any("the run of seed" in note for note in caveats(rungs[1]))          # twins that agree: nothing
    rows = table_rows(rungs, Columns(cumulative=False, step_alone=False))
    for row in rows:
        assert "±" not in row[1], row                    # one degree of freedom: no bound printed as a figure
    assert "too few repeats to judge" in rows[1][2] and ("--repeats" in rows[1][2] or "quieter machine" in rows[1][2])
    result = AblationResult(rungs=rungs, environment={}, out_dir=None, best=None, best_name=None, ceilings={},
                            settings={"repeats": 2})
    line = repeatability_line(result)
    assert line.startswith("Repeatability: too few repeats to judge") and "%" in line
    assert "below ~" not in line                          # no detectable difference of thousands of percent


def test_a_slow_run_on_a_quiet_machine_is_said_to_be_its_own_doing():
    """A run 2.3x slower than its twins while other processes used nothing: the machine is not blamed; its slowest
    block is named, and on a compiled rung the likely cause (a compile for a new shape inside the timed steps)."""
    rungs = [scored_rung("baseline", [100, 101, 99], 0.9), scored_rung("compile", [44, 101, 100], 0.9, compile=True)]
    slow = rungs[1].repeats[0]["timing"]["blocks"]
    slow[0]["seconds"] += 15.0                            # one block holds a 15 s compilation
    score_rungs(rungs, {"fp32": 1e12}, [0.9, 0.9, 0.9])
    named = " ".join(caveats(rungs[1]))
    assert "the run of seed 0" in named and "the machine was quiet" in named and "compilation for a new input" in named
    assert "took its cores" not in named


def test_a_readable_interval_is_still_printed():
    rungs = [scored_rung("baseline", [100, 101, 99], 0.9), scored_rung("fast", [150, 152, 149], 0.9, compile=True)]
    score_rungs(rungs, {"fp32": 1e12}, [0.9, 0.9])
    rows = table_rows(rungs, Columns(cumulative=False, step_alone=False))
    assert "±" in rows[1][1] and "(" in rows[1][2] and "too few" not in rows[1][2]
    assert not any("the run of seed" in note for rung in rungs for note in caveats(rung))


def test_an_epoch_never_reads_faster_than_its_step_alone():
    held = RungResult(repeats=3, step_alone=1000.0, epoch_of_step=0.41, noise={"sigma_log": 0.05})
    assert step_alone_text(held).endswith("epoch 41%")
    noisy = RungResult(repeats=3, step_alone=1000.0, epoch_of_step=1.06, noise={"sigma_log": 0.05})
    assert step_alone_text(noisy).endswith("epoch at its step alone (within the noise)")
    odd = RungResult(repeats=3, step_alone=1000.0, epoch_of_step=1.6, noise={"sigma_log": 0.05})
    assert step_alone_text(odd).endswith("epoch at its step alone (the two timings disagree: rerun)")
    one = RungResult(repeats=1, step_alone=1000.0, epoch_of_step=1.03)      # no noise estimate: within 5%
    assert "within the noise" in step_alone_text(one)
    for r in (noisy, odd, one):
        assert "%" not in step_alone_text(r).split("),")[-1]          # no share above 100% anywhere


def test_the_repeats_advice_turns_to_a_quieter_machine_past_a_sane_count():
    from trainfast.report.format import repeats_advice

    assert repeats_advice(5) == "--repeats 5 would do"
    assert "quieter machine" in repeats_advice(1000) and "1000" not in repeats_advice(1000)
