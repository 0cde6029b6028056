"""Per-rank figures: the straggler judgement on hand-made per-rank steps, the phase clock, the report's section."""
import random
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainfast.measure.ranks import combine_runs, judge_ranks, rank_figures, straggler_line
from trainfast.probe.ranks import PhaseClock, ddp_figures
from trainfast.report.ranks import ranks_section
from trainfast.results import Status

STEPS = 60


def planted(rank: int, rng: random.Random, data=0.0, compute=0.0, noise=0.3, steps=STEPS, step=0.040):
    """One rank's steps as DDP evens them: every step ends at the shared all-reduce (`step` s), its own data wait
    and compute (plus any planted excess) drawn with `noise` relative scatter and a rare very slow step."""
    def draw(level: float) -> float:
        value = level * (1 + rng.uniform(-noise, noise))
        return value * 4 if rng.random() < 0.03 else value        # a preempted step now and then
    datas = [draw(0.002) + data for _ in range(steps)]
    forwards = [draw(0.006) + compute for _ in range(steps)]
    optims = [draw(0.002) for _ in range(steps)]
    return rank_figures(rank, [step] * steps, datas, forwards, optims, [32] * steps)


@pytest.mark.parametrize("seed", range(20))
def test_two_equal_ranks_with_noise_are_never_called_slow(seed):
    rng = random.Random(seed)
    judged = judge_ranks([planted(0, rng), planted(1, rng)])
    assert judged["straggler"] is None
    assert judged["spread"] is not None and judged["spread"] < 1.2
    assert straggler_line(judged).startswith("no rank is slow")


def test_a_few_ranks_of_uneven_noise_are_never_called_slow():
    rng = random.Random(7)
    ranks = [planted(r, rng, noise=0.6 if r == 2 else 0.2) for r in range(4)]
    assert judge_ranks(ranks)["straggler"] is None


def test_a_planted_data_wait_names_the_rank_and_data():
    rng = random.Random(1)
    judged = judge_ranks([planted(0, rng), planted(1, rng, data=0.030)])
    found = judged["straggler"]
    assert found["rank"] == 1 and found["phase"] == "data"
    assert 0.025 < found["excess_s"] < 0.035
    line = straggler_line(judged)
    assert "rank 1" in line and "slow in data" in line
    # the quick rank waited at the collective for it: its backward holds the straggler's excess
    assert judged["ranks"][0]["waited_s"] > judged["ranks"][1]["waited_s"] + 0.02


def test_a_planted_compute_excess_names_compute():
    rng = random.Random(2)
    judged = judge_ranks([planted(0, rng, compute=0.012), planted(1, rng), planted(2, rng)])
    assert judged["straggler"]["rank"] == 0 and judged["straggler"]["phase"] == "compute"


def test_an_excess_inside_the_share_of_a_step_is_not_called_slow():
    rng = random.Random(3)
    # 3 ms over a 40 ms step: clear of the noise, but under the share a straggler must cost
    assert judge_ranks([planted(0, rng, noise=0.01), planted(1, rng, data=0.003, noise=0.01)])["straggler"] is None


def test_a_noisy_excess_is_not_called_slow():
    # a big excess on average, but the steps scatter over the whole step: beyond no noise bar
    rng = random.Random(4)
    wild = rank_figures(1, [0.04] * 8, [rng.choice([0.0, 0.035]) for _ in range(8)], [0.006] * 8, [0.001] * 8,
                        [32] * 8)
    calm = rank_figures(0, [0.04] * 8, [0.0] * 8, [0.006] * 8, [0.001] * 8, [32] * 8)
    judged = judge_ranks([calm, wild])
    assert judged["threshold"]["seconds"] >= 0.2 * 0.04
    assert judged["straggler"] is None or judged["straggler"]["excess_s"] >= judged["threshold"]["seconds"]


def test_one_rank_or_none_is_not_judged():
    assert judge_ranks([planted(0, random.Random(0))])["spread"] is None
    assert straggler_line(None) == "per-rank figures: not measured"


def test_over_repeats_a_straggler_is_named_only_when_every_run_names_it():
    rng = random.Random(5)
    slow = judge_ranks([planted(0, rng), planted(1, rng, data=0.03)])
    calm = judge_ranks([planted(0, rng), planted(1, rng)])
    both = combine_runs([slow, judge_ranks([planted(0, rng), planted(1, rng, data=0.03)])])
    assert both["straggler"]["rank"] == 1 and "slow in data" in both["line"]
    mixed = combine_runs([slow, calm])
    assert mixed["straggler"] is None and "1 of 2 runs" in mixed["line"]
    assert combine_runs([calm])["line"].startswith("no rank is slow")
    assert [r["rank"] for r in both["ranks"]] == [0, 1]
    assert combine_runs([None]) is None


def test_the_phase_clock_times_training_forwards_and_optimizer_steps_only():
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    active = [True]
    clock = PhaseClock(model, lambda: active[0])
    try:
        def slow_forward(module, args):           # runs after the clock's own pre-hook: inside the forward
            time.sleep(0.01)
        slow = model.register_forward_pre_hook(slow_forward)
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        clock.close_step()
        with torch.no_grad():                       # evaluation: not a training forward
            model(torch.randn(3, 4))
        active[0] = False                           # steps on another clock: not counted
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        active[0] = True
        clock.close_step()
        slow.remove()
    finally:
        clock.remove()
    assert clock.forward_s[0] >= 0.009 and clock.optimizer_s[0] > 0
    assert clock.forward_s[1] == 0 and clock.optimizer_s[1] == 0
    assert len(clock.forward_s) == len(clock.optimizer_s) == 2


def test_the_doctor_finds_the_straggler_or_says_no_rank_is_slow():
    from trainfast.checks import Observations, run_checks
    from trainfast.checks.ranks import straggler
    from trainfast.envcheck import collect_environment

    rng = random.Random(8)
    obs = Observations("own loop", "cpu", collect_environment(), step_seconds=[0.04] * 10)
    assert straggler(obs) is None                                   # one process: nothing to compare
    obs.ranks = judge_ranks([planted(0, rng), planted(1, rng, data=0.03)])
    found = straggler(obs)
    assert found.status == "problem" and "rank 1 is the straggler, slow in data" in found.evidence
    assert 0.025 < found.cost_s < 0.035 and "loader" in found.fix
    assert any(f.name == "a slow rank" for f in run_checks(obs))
    obs.ranks = judge_ranks([planted(0, rng), planted(1, rng)])
    assert straggler(obs).status == "fine" and "no rank is slow" in straggler(obs).evidence


def test_without_a_session_the_phase_clock_times_the_loaders_wait_and_puts_it_back():
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original = _BaseDataLoaderIter.__next__

    def slow_collate(samples):
        time.sleep(0.01)
        return torch.utils.data.default_collate(samples)
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4, collate_fn=slow_collate)
    clock = PhaseClock(None, loader=True, closes=True)
    try:
        for (batch,) in loader:
            clock.close_step()
    finally:
        clock.remove()
    assert _BaseDataLoaderIter.__next__ is original
    assert len(clock.data_s) == 2 and min(clock.data_s) >= 0.009


def test_ddp_figures_are_none_without_ddp():
    assert ddp_figures(nn.Linear(2, 2)) is None
    fake = SimpleNamespace(_get_ddp_logging_data=lambda: {"avg_backward_comm_time": 3_000_000,
                                                            "avg_backward_compute_comm_overlap_time": 1_000_000,
                                                            "avg_forward_compute_time": 500_000})
    figures = ddp_figures(fake)
    assert figures["exposed_comm_s"] == pytest.approx(0.002) and figures["forward_compute_s"] == pytest.approx(5e-4)


def test_the_report_has_a_section_per_distributed_rung():
    rng = random.Random(6)
    judged = combine_runs([judge_ranks([planted(0, rng), planted(1, rng, data=0.03)])])
    rung = SimpleNamespace(status=Status.DONE, name="ddp", changes={}, script={}, result=SimpleNamespace(ranks=judged,
                                                                                       rate_unit="samples/s"))
    lines = ranks_section(SimpleNamespace(rungs=[rung], settings={"rate_unit": "samples/s"}))
    text = "\n".join(lines)
    assert "## Ranks" in text and "rank 1 is the straggler, slow in data" in text
    assert sum(line.startswith("| 0 |") or line.startswith("| 1 |") for line in lines) == 2
    alone = SimpleNamespace(status=Status.DONE, name="baseline", result=SimpleNamespace(ranks=None))
    assert ranks_section(SimpleNamespace(rungs=[alone], settings={})) == []


@pytest.fixture(scope="module")
def planted_ranks(tmp_path_factory):
    """The shared ablation of two gloo ranks of one thread (rank_ablation.py): its baseline with nothing planted, its
    straggler rung's runs with rank 1's loader sleeping 30 ms a batch (tests/scripts/rank_loop.py)."""
    import json

    from rank_ablation import planted_ablation

    out, proc = planted_ablation(tmp_path_factory)
    return out, {r["name"]: r for r in json.loads((out / "results.json").read_text())["rungs"]}


@pytest.mark.slow
@pytest.mark.alone
def test_ablate_nproc_2_names_a_planted_straggler_with_data_and_no_rank_without_it(planted_ranks):
    out, rungs = planted_ranks
    calm, planted_rung = rungs["baseline"]["runs"][0]["ranks"], rungs["straggler"]["runs"][0]["ranks"]
    assert [r["rank"] for r in calm["ranks"]] == [0, 1] and calm["straggler"] is None
    found = planted_rung["straggler"]
    assert found["rank"] == 1 and found["phase"] == "data" and found["excess_s"] > 0.02
    quick, slow = planted_rung["ranks"]
    assert quick["waited_s"] > 0.02 and slow["data_s"] > 0.025        # rank 0 waited for it at the all-reduce
    assert quick["ddp"]["backward_comm_s"] > 0                          # DDP's own figures, read on gloo
    report = (out / "report.md").read_text()
    assert "## Ranks" in report and "rank 1 is the straggler, slow in data" in report
    assert "no rank is slow" in report


@pytest.mark.slow
@pytest.mark.alone
def test_ablate_nproc_2_runs_every_rung_of_a_command_under_torchrun(planted_ranks):
    """Each run of the command is a torchrun job of two ranks, stopped once timed (the script would go on for 100
    epochs); the switches' rungs reaching a command's ranks: test_wrap_frameworks' accelerate ablation."""
    import json

    out, rungs = planted_ranks
    for name in ("baseline", "straggler"):
        run = rungs[name]["runs"][0]
        assert rungs[name]["status"] == "done" and run["world_size"] == 2 and run["stopped"] != "script ended", run
    argv = json.loads((out / "rungs" / "straggler-r0" / "command.json").read_text())["argv"]
    assert argv[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]


@pytest.mark.slow
@pytest.mark.alone
def test_the_doctor_with_nproc_2_names_the_planted_straggler(tmp_path):
    """`trainfast doctor --nproc 2 -- python rank_loop.py`, rank 1's loader sleeping 30 ms a batch."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "CUDA_VISIBLE_DEVICES": "", "PLANT_RANK": "1",
           "PLANT": "straggler"}
    env.pop("TRAINFAST_RECIPE", None)
    proc = subprocess.run([sys.executable, "-m", "trainfast", "doctor", "--nproc", "2", "--out",
                           str(tmp_path), "--eval-within", "0", "--", sys.executable,
                           str(root / "tests" / "scripts" / "rank_loop.py")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    findings = {f["name"]: f for f in json.loads((tmp_path / "doctor.json").read_text())["findings"]}
    found = findings["a slow rank"]
    assert found["status"] == "problem" and "rank 1 is the straggler, slow in data" in found["evidence"]
