"""A rung whose repeats disagree far more than the others' is judged on its own spread and kept out of the noise
pool behind every other rung's interval (stats.split_noise): one rung whose timed window depended on which batches
it held must not turn the others' firm verdicts into "within the noise"."""
from pathlib import Path

import numpy as np
from conftest import noisy_repeat, scored_rung

from trainfast.ablation.scoring import ladder_noises, pick_best, score_rungs
from trainfast.report.summary import repeatability_line
from trainfast.results import AblationResult
from trainfast.stats import FASTER, SAME, Noise, combined, pooled_noise, split_noise

# Five repeats of three rungs of a padded language-model script, in samples/s: the baseline and packing steady,
# length grouping's rate decided by which length groups fell in its timed window.
BASELINE = [100, 92, 90, 97, 96]
PACKED = [156, 137, 156, 148, 147]
GROUPED = [109, 215, 105, 111, 114]


def ladder():
    return [scored_rung("baseline", BASELINE, 0.5), scored_rung("padding_free", PACKED, 0.5, padding_free=True),
            scored_rung("group_by_length", GROUPED, 0.5, group_by_length=True)]


def test_the_wide_rung_is_set_apart_and_the_others_keep_their_own_noise():
    rungs = ladder()
    noises = ladder_noises(rungs)
    assert set(noises.wide) == {"group_by_length"}
    pooled_all = pooled_noise([[r for r in map(noisy_repeat, rates)] for rates in (BASELINE, PACKED, GROUPED)])
    assert noises.process.variance < pooled_all.variance / 10          # the pool without it is the steady rungs'
    assert noises.wide["group_by_length"].variance > 20 * noises.process.variance
    assert noises.wide["group_by_length"].df == len(GROUPED) - 1


def test_the_steady_rungs_verdict_is_firm_once_the_wide_one_no_longer_widens_it():
    rungs = ladder()
    score_rungs(rungs, {})
    base, packed, grouped = rungs
    assert packed.result.verdict == FASTER and packed.result.firm
    low, high = packed.result.speedup_interval
    assert 1.4 < low < packed.result.speedup < high < 1.8
    assert grouped.result.verdict == SAME                  # its own spread: 1.3x is inside it
    assert grouped.result.noise["own"] and not packed.result.noise.get("own")
    best, _, _ = pick_best(rungs)
    assert best is packed
    result = AblationResult(rungs, {}, Path("."), packed.recipe, packed.name, {}, settings={"repeats": 5})
    line = repeatability_line(result)
    assert "group_by_length" in line and "disagreed far more than the others'" in line


def test_pooled_over_every_rung_the_same_runs_left_packing_within_the_noise():
    # What the wide rung did to the others before it was set apart: the same figures, one pool.
    from trainfast.stats import Candidate, compare_candidates

    rows = {name: [noisy_repeat(x) for x in rates]
            for name, rates in (("baseline", BASELINE), ("padding_free", PACKED), ("group_by_length", GROUPED))}
    one_pool = pooled_noise(list(rows.values()))
    versus = compare_candidates(Candidate("padding_free", 1, rows["padding_free"]),
                                Candidate("baseline", 0, rows["baseline"]), noise=one_pool)
    assert not (versus.verdict == FASTER and versus.firm)


def test_ladders_whose_rungs_share_one_noise_rarely_set_one_apart():
    rng = np.random.default_rng(7)
    set_apart = 0
    trials = 300
    for _ in range(trials):
        table = {f"r{k}": [noisy_repeat(100 * (1 + 0.1 * k) * float(np.exp(0.05 * rng.standard_normal())),
                                        noise=0.0) for _ in range(3)] for k in range(6)}
        _, wide = split_noise(table)
        set_apart += bool(wide)
    assert set_apart / trials < 0.03


def test_a_comparison_with_a_wide_rung_uses_both_noises_with_welchs_degrees_of_freedom():
    pool, wide = Noise(0.001, 8), Noise(0.09, 4)
    both = combined(pool, wide)
    assert both.variance == (0.001 + 0.09) / 2 and 4 <= both.df <= 5
    assert combined(pool, pool) is pool
