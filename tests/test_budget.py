"""A budget kept: every stage of a search, and an ablation's passes, priced by the runs measured so far and checked
before each stage and each run, on a fake clock that only the faked runs move (each costs a known number of
seconds): the search ends within its budget plus one run, and tune.md says what was cut and why."""
from __future__ import annotations

import math

import pytest
from conftest import scored_rung

from trainfast import Recipe
from trainfast.ablation.clock import RunClock, run_kind
from trainfast.results import Rung, Status


@pytest.fixture(autouse=True)
def unmeasured_machine(monkeypatch):
    """No matmul ceiling nor reference workload timed around each ladder: the runs are faked, their roofs are not
    what these tests judge, and timing them is most of a faked ladder's cost."""
    import trainfast.ablation.loop as loop_module

    monkeypatch.setattr(loop_module, "ceiling", lambda work, precision: 1e12)
    monkeypatch.setattr(loop_module, "reference_check", lambda device=None: {})


class Clock:
    """Time as the faked runs spend it: nothing else moves it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Failed(float):
    """A run's cost where the run fails after taking it (a compile that ran out of memory after three minutes)."""


class FakeRuns:
    """The work run_ladder is given around the search's own (its device, settings, what a target tells it), its
    runs made here: each costs `cost(rung, recipe, timed)` seconds of the fake clock and runs at `rate(recipe)`."""

    def __init__(self, work, clock: Clock, cost, rate, record=None, stage: str = "") -> None:
        self.work, self.clock, self.cost, self.rate, self.record, self.stage = work, clock, cost, rate, record, stage
        self.dev, self.flops_per_sample = work.dev, work.flops_per_sample
        self.settings, self.learned = dict(work.settings), work.learned
        self.launched: list[tuple[str, str, float]] = []

    def launcher(self, measure):
        return self.launch

    def launch(self, rung, recipe, budget, run_dir, display, limit):
        seconds = self.cost(rung, recipe, budget is not None)
        self.clock.t += seconds
        self.launched.append((self.stage, rung.name, seconds))
        if isinstance(seconds, Failed):
            return {"error": "the run failed", "log_tail": "", "wall_time_s": float(seconds)}
        rate = self.rate(recipe) * (1 + 0.01 * (recipe.seed % 3 - 1))
        run = {**scored_rung("x", [rate], 0.95).repeats[0], "seed": recipe.seed, "wall_time_s": seconds}
        return {**run, **(self.record(recipe) if self.record else {})}

    def metric(self, measure):
        return self.work.metric(measure)

    def after_run(self, plan):
        return self.work.after_run(plan)

    def mark_effects(self, plan):
        return self.work.mark_effects(plan)

    def aim(self, target, cap_seen):
        return None

    def curve_metric(self):
        return self.work.curve_metric()


def fixed_costs(monkeypatch, clock: Clock, fixed: dict[str, float]) -> None:
    """Each ladder's fixed costs on the fake clock, as a real ladder pays them: each precision's matmul peak and the
    reference workload timed before its first run and again after its last (`ceiling`, `reference`), its report
    written (`report`: its cost, the report itself left out)."""
    import trainfast.ablation.loop as loop_module
    import trainfast.report as report_module

    def ceiling(work, precision):
        clock.t += fixed.get("ceiling", 0.0)
        return 1e12

    def reference(device=None):
        clock.t += fixed.get("reference", 0.0)
        return {}

    def report(result):             # its cost only: the charts take a real second or more each, and tell nothing here
        clock.t += fixed.get("report", 0.0)

    monkeypatch.setattr(loop_module, "ceiling", ceiling)
    monkeypatch.setattr(loop_module, "reference_check", reference)
    monkeypatch.setattr(report_module, "write_report", report)


def faked_search(monkeypatch, out, cost, rate, budget_s, record=None, fixed=None, **options):
    """tune() on the built-in digits, its runs faked (FakeRuns) on one fake clock, with each ladder's `fixed` costs
    (fixed_costs) where given; the decision, tune.md, the clock and every run launched (stage, rung, seconds)."""
    import trainfast.tune.search as search_module
    from trainfast.ablation import run_ladder
    from trainfast.tune import tune
    from trainfast.tune.budget import SearchBudget

    clock = Clock()
    launched: list[tuple[str, str, float]] = []
    if fixed:
        fixed_costs(monkeypatch, clock, fixed)

    def faked(rungs, work, settings, out_dir, opts, measure="speed"):
        runs = FakeRuns(work, clock, cost, rate, record, settings["stage"])
        try:
            return run_ladder(rungs, runs, settings, out_dir, opts, measure)
        finally:
            launched.extend(runs.launched)

    monkeypatch.setattr(search_module, "run_ladder", faked)
    monkeypatch.setattr(search_module, "SearchBudget", lambda total: SearchBudget(total, now=clock))
    decision = tune("resnet9", data="digits", image_size=16, out=out, show=False, device="cpu", amp_dtype="bf16",
                    budget_s=budget_s, **options)
    return decision, (out / "tune.md").read_text(), clock, launched


def within_one_run(clock: Clock, budget_s: float, launched) -> None:
    dearest = max(seconds for _, _, seconds in launched)
    assert clock.t <= budget_s + dearest, (clock.t, budget_s, dearest)


def test_the_clock_prices_a_run_by_its_own_recipe_then_its_kind_and_a_part_never_outlasts_its_parent():
    clock = Clock()
    search = RunClock(1000.0, now=clock)
    assert search.price(run_kind("speed"), Recipe()) is None and search.fits(None)     # unpriced: any time left
    search.spend(run_kind("speed"), Recipe(), 100.0)
    search.spend(run_kind("speed"), Recipe(channels_last=True), 300.0)
    assert search.price(run_kind("speed"), Recipe(seed=4)) == 100.0                   # the seed is no other recipe
    assert search.price(run_kind("speed"), Recipe(optimizer_impl="fused")) == 200.0   # any recipe of its kind
    assert search.price(run_kind("full"), Recipe(channels_last=True)) == 300.0        # its recipe, another kind
    assert search.price_runs([(run_kind("speed"), Recipe()), (run_kind("speed"), Recipe(channels_last=True))]) == 400
    clock.t = 700.0
    stage = search.part(500.0)
    assert stage.left() == 300.0 and not stage.fits(301.0) and stage.fits(300.0)
    clock.t = 1000.0
    assert not stage.fits(None) and stage.price(run_kind("speed")) == 200.0          # the same record of costs


def test_the_speed_stages_stop_before_a_run_their_budget_cannot_pay_for(tmp_path, monkeypatch):
    # bf16 gains 1.5x, fused 1.3x on top; channels_last gains nothing and its runs cost 250 s against the others'
    # 100 s: priced by the baseline's first run, the plan fits; each run priced by its own rung's stops the stage.
    def cost(rung, recipe, timed):
        return 250.0 if recipe.channels_last else 100.0

    def rate(recipe):
        return 500.0 * (1.5 if recipe.precision == "bf16" else 1.0) * (1.3 if recipe.optimizer_impl == "fused" else 1)

    decision, md, clock, launched = faked_search(monkeypatch, tmp_path / "tune", cost, rate, 1500.0,
                                                 switches=["autocast-bf16", "fused", "channels_last"])
    within_one_run(clock, 1500.0, launched)
    assert "to fit the budget" in md and "stopped before channels_last" in md and "its ~250 s would not fit" in md
    assert decision.recipe.precision == "bf16"


def test_the_memory_stage_keeps_to_its_share_when_smaller_batches_cost_more(tmp_path, monkeypatch):
    # Each halving of the batch takes 40 s more a run (more steps for the same samples) than the baseline's 60 s,
    # which prices the stage's plan: each run is priced by its own rung once one ran, and the stage stops.
    from trainfast.tune.memory import MEMORY_SHARE

    base = Recipe().batch_size

    def cost(rung, recipe, timed):
        return 60.0 + 40.0 * round(math.log2(base / recipe.batch_size))

    decision, md, clock, launched = faked_search(monkeypatch, tmp_path / "tune", cost, lambda r: 500.0, 900.0,
                                                 switches=["fused"], memory_limit="1GiB")
    memory = [seconds for stage, _, seconds in launched if stage == "memory"]
    assert sum(memory) <= MEMORY_SHARE * 900.0 + max(memory)          # its share, plus the one run that outran it
    within_one_run(clock, 900.0, launched)
    assert "memory: ran" in md and "to fit the budget" in md and "stopped before batch-" in md


def test_the_input_stage_stops_where_its_dearer_runs_no_longer_fit(tmp_path, monkeypatch):
    # A step of 500 samples/s in fp32, 1,000 in bf16; the loader feeds 600 with no workers, 1,300 with four: the bf16
    # recipe is held by its input, so stage 3 tries the workers, whose runs cost 150 s against 100 s.
    import trainfast.tune.inputs as inputs_module

    monkeypatch.setattr(inputs_module, "usable_cpus", lambda: 4)
    feed = {0: 600.0, 2: 900.0, 4: 1300.0}

    def rate(recipe):
        return min(500.0 * (2.0 if recipe.precision == "bf16" else 1.0), feed[recipe.num_workers])

    def record(recipe):
        step = 500.0 * (2.0 if recipe.precision == "bf16" else 1.0)
        return {"data_wait_fraction": 1 - rate(recipe) / step}

    def cost(rung, recipe, timed):
        return 150.0 if recipe.num_workers else 100.0

    decision, md, clock, launched = faked_search(monkeypatch, tmp_path / "tune", cost, rate, 1300.0, record=record,
                                                 switches=["autocast-bf16", "workers", "device_decode"])
    within_one_run(clock, 1300.0, launched)
    assert "input: stopped before workers-4, run 2: its ~150 s would not fit the 50 s left" in md


def test_stage_1_gone_on_with_stage_1bs_share_judges_the_switches_it_had_cut(tmp_path, monkeypatch):
    # Runs of 100 s, an 800 s budget: stage 1 may spend half (400 s: the baseline and O1), O1 gains nothing, so
    # stage 1 goes on with the rest. Its four runs so far are read back at no cost: the plan counts them as done,
    # and the 400 s left pay for fused and channels_last twice each (fused gains 1.5x and is recommended).
    def rate(recipe):
        return 500.0 * (1.5 if recipe.optimizer_impl == "fused" else 1.0)

    decision, md, clock, launched = faked_search(monkeypatch, tmp_path / "tune", lambda *a: 100.0, rate, 800.0,
                                                 switches=["autocast-bf16", "fused", "channels_last"])
    within_one_run(clock, 800.0, launched)
    singles = [name for stage, name, _ in launched if stage == "singles"]
    assert singles.count("fused") == 2 and singles.count("channels_last") == 2, singles
    assert decision.name == "fused" and "stage 1 went on with the budget kept for stage 1b" in md


def curve_of(recipe: Recipe, base_batch: int) -> dict:
    """A run's curve: accuracy over samples, slower per sample at a larger batch (a batch rung changes the math)."""
    per = 100.0 * recipe.batch_size / base_batch
    points = []
    for i in range(1, 11):
        seen = 100 * i
        acc = 1 - math.exp(-seen / (200.0 * per / 100.0)) - 0.002 * (recipe.seed % 3)
        points.append({"step": i, "seen": seen, "train_s": seen / 500.0, "metrics": {"accuracy": acc}})
    return {"curve": points, "curve_planned_step": 10, "curve_stopped": "end"}


def test_the_to_target_stage_counts_the_seeds_its_candidates_add(tmp_path, monkeypatch):
    # The candidates that change the math (the batch sizes) each get up to five seeds: the stage's plan counts them,
    # and each seed is priced before it starts, with every ladder's fixed costs (its peak, reference workload and
    # report) and the process's start counted; the search ends within its budget plus one run.
    base_batch = Recipe().batch_size

    def cost(rung, recipe, timed):
        return 100.0

    def rate(recipe):
        return 500.0 * (1.5 if recipe.precision == "bf16" else 1.0)

    decision, md, clock, launched = faked_search(monkeypatch, tmp_path / "tune", cost, rate, 2400.0,
                                                 record=lambda r: curve_of(r, base_batch),
                                                 switches=["autocast-bf16"], target="accuracy>=0.9",
                                                 fixed={"ceiling": 3.0, "reference": 2.0, "report": 3.0},
                                                 started=-10.0)
    clock.t += 10.0                       # the process's start, counted by the budget
    within_one_run(clock, 2400.0, launched)
    # the plan left room for the seeds (batch_half, which changes the math, got its five runs): nothing was stopped
    assert "to-target: ran 2 repeats instead of 3 and without batch_2x" in md and "stopped" not in md
    assert [name for stage, name, _ in launched if stage == "to-target"].count("batch_half") == 5


def test_the_to_target_stage_is_skipped_and_said_where_its_seeds_cannot_fit(tmp_path, monkeypatch):
    decision, md, clock, launched = faked_search(monkeypatch, tmp_path / "tune", lambda *a: 100.0,
                                                 lambda r: 500.0 * (1.5 if r.precision == "bf16" else 1.0), 800.0,
                                                 record=lambda r: curve_of(r, Recipe().batch_size),
                                                 switches=["autocast-bf16"], target="accuracy>=0.9")
    within_one_run(clock, 800.0, launched)
    assert "the to-target stage was skipped" in md and not (tmp_path / "tune" / "to-target").exists()


def test_the_to_target_stage_takes_three_seeds_where_five_would_not_fit(tmp_path, monkeypatch):
    # Runs of 100 s, 1,000 s: the rate search spends 400 s of its half; the 600 s left pay for the baseline's three
    # seeds and the rate pick's two runs, not for five seeds: the stage runs on three, and says so.
    decision, md, clock, launched = faked_search(monkeypatch, tmp_path / "tune", lambda *a: 100.0,
                                                 lambda r: 500.0 * (1.5 if r.precision == "bf16" else 1.0), 1000.0,
                                                 record=lambda r: curve_of(r, Recipe().batch_size),
                                                 switches=["autocast-bf16"], target="accuracy>=0.9")
    within_one_run(clock, 1000.0, launched)
    assert "measured over 3 seeds, not 5, to fit the budget" in md, md
    assert [name for stage, name, _ in launched if stage == "to-target"].count("baseline") == 3
    assert "over up to 3 seeds" in md             # the report says the seeds it measured over


class LadderWork:
    """A built-in ladder's work with its runs faked by `launch(rung, recipe, budget, run_dir, display, limit)`."""
    settings, learned, flops_per_sample = {}, {}, None

    def __init__(self, launch) -> None:
        import torch

        self.dev, self.launch = torch.device("cpu"), launch

    def launcher(self, measure):
        return self.launch

    def metric(self, measure):
        return ("accuracy", "max")

    def after_run(self, plan):
        return None


def test_an_ablations_passes_start_only_where_their_priced_cost_fits(tmp_path):
    # A ladder on a fake clock: the baseline's runs cost 10 s, fused's 40 s. Settling prices a pass by each rung's
    # own runs (50 s), not by the first run; a time budget stops the ladder before a run it cannot pay for.
    import dataclasses

    from trainfast.ablation import LadderOptions, TimingBudget, run_ladder

    clock = Clock()
    launched = []

    def launch(rung, recipe, budget, run_dir, display, limit):
        seconds = 40.0 if recipe.optimizer_impl == "fused" else 10.0
        clock.t += seconds
        launched.append(rung.name)
        noisy = 1 + 0.2 * ((recipe.seed * 7) % 5 - 2) / 2      # noisy enough that verdicts stay unsettled
        rate = (110.0 if recipe.optimizer_impl == "fused" else 100.0) * noisy
        return {**scored_rung("x", [rate], 0.95).repeats[0], "seed": recipe.seed, "wall_time_s": seconds}

    def ladder(name, **options):
        plan = [Rung("baseline", {}, Recipe()),
                Rung("fused", {"optimizer_impl": "fused"}, Recipe(optimizer_impl="fused"))]
        settings = {"repeats": 3, "budget": dataclasses.asdict(TimingBudget()), "min_effect": 0.05}
        clock.t, launched[:] = 0.0, []
        opts = LadderOptions(repeats=3, noise_seeds=3, min_effect=0.05, show=False, budget=TimingBudget(),
                             clock=RunClock(now=clock), **options)
        return run_ladder(plan, LadderWork(launch), settings, tmp_path / name, opts)

    # Settling within 200 s: 3 passes take 150 s; a fourth (50 s) would end at 200 s, a fifth past it.
    result = ladder("settle", settle_within_s=200.0)
    passes = result.settings.get("settle", {}).get("passes", [])
    assert clock.t <= 200.0 and len(passes) <= 1 and all(p["pass_s"] == 50.0 for p in passes)
    # A time budget of 120 s: priced by the first run (10 s) the plan fits 2 rungs x 3; fused's first run shows its
    # 40 s, and the ladder stops before the run that would end past the budget.
    result = ladder("budget", settle_within_s=None, time_budget_s=120.0)
    cut = result.settings["budget_cut"]
    assert clock.t <= 120.0 and cut["stopped"]["at"].startswith("fused") and launched.count("fused") == 2
    assert [r.status for r in result.rungs] == [Status.DONE, Status.DONE]


def dear_baseline_ladder(out, plan: list[Rung], repeats: int, budget_s: float):
    """`plan` run as a ladder on a fake clock within `budget_s`: the baseline's runs cost 100 s, every other rung's
    20 s and runs 1.5x faster. The result, the rungs in the order they ran, and the clock."""
    import dataclasses

    from trainfast.ablation import LadderOptions, TimingBudget, run_ladder

    clock = Clock()
    launched = []

    def launch(rung, recipe, budget, run_dir, display, limit):
        seconds = 100.0 if rung.name == "baseline" else 20.0
        clock.t += seconds
        launched.append(rung.name)
        rate = 100.0 * (1.5 if rung.name != "baseline" else 1.0) * (1 + 0.01 * (recipe.seed % 3 - 1))
        return {**scored_rung("x", [rate], 0.95).repeats[0], "seed": recipe.seed, "wall_time_s": seconds}

    settings = {"repeats": repeats, "budget": dataclasses.asdict(TimingBudget()), "min_effect": 0.05}
    opts = LadderOptions(repeats=repeats, noise_seeds=repeats, min_effect=0.05, show=False, budget=TimingBudget(),
                         settle_within_s=None, time_budget_s=budget_s, clock=RunClock(now=clock))
    return run_ladder(plan, LadderWork(launch), settings, out, opts), launched, clock


def test_rungs_the_cut_left_out_are_put_back_where_the_first_pass_ran_cheaper(tmp_path):
    # The baseline's runs cost 100 s, every other rung's 20 s; 500 s allowed. Priced by the first run (100 s), the
    # plan keeps the baseline and fused twice; after the first pass (120 s) the rungs cut are priced at the measured
    # runs' mean (60 s): two of the three fit beside the runs still queued and are put back, interleaved with the
    # baseline's second pass; the third stays out, and the ladder ends within its budget.
    changes = {"fused": {"optimizer_impl": "fused"}, "channels_last": {"channels_last": True},
               "lr": {"lr": 0.2}, "epochs": {"epochs": 3}}
    plan = [Rung("baseline", {}, Recipe()), *(Rung(n, c, Recipe(**c)) for n, c in changes.items())]
    result, launched, clock = dear_baseline_ladder(tmp_path / "refit", plan, 2, 500.0)
    cut = result.settings["budget_cut"]
    assert cut["restored"] == ["channels_last", "lr"] and cut["skipped"] == ["epochs"], cut
    assert launched == ["baseline", "fused", "channels_last", "lr", "baseline", "channels_last", "lr", "fused"]
    assert [r.status for r in result.rungs] == [Status.DONE] * 4 + [Status.SKIPPED] and clock.t <= 500.0


def test_a_ladder_goes_on_with_the_cheaper_runs_queued_after_one_that_does_not_fit(tmp_path):
    # The baseline's runs cost 100 s, fused's 20 s; 270 s allowed, 3 repeats. The baseline's third run (100 s) does
    # not fit the 30 s left after 240 s, but fused's third (20 s) does: the ladder goes on with it and says so.
    plan = [Rung("baseline", {}, Recipe()), Rung("fused", {"optimizer_impl": "fused"}, Recipe(optimizer_impl="fused"))]
    result, launched, clock = dear_baseline_ladder(tmp_path / "on", plan, 3, 270.0)
    stopped = result.settings["budget_cut"]["stopped"]
    assert launched == ["baseline", "fused", "baseline", "fused", "fused"] and clock.t == 260.0
    assert stopped["at"] == "baseline, run 3" and stopped["went_on"] == ["fused"] and stopped["runs_left"] == 1
    assert [len(r.repeats) for r in result.rungs] == [2, 3] and result.rungs[1].status == Status.DONE


def test_a_ladder_with_no_time_left_starts_nothing(tmp_path):
    import dataclasses

    from trainfast.ablation import LadderOptions, TimingBudget, run_ladder

    clock = Clock()
    launched = []

    work = LadderWork(lambda *a: launched.append(a) or {})
    plan = [Rung("baseline", {}, Recipe()), Rung("fused", {"optimizer_impl": "fused"}, Recipe(optimizer_impl="fused"))]
    settings = {"repeats": 3, "budget": dataclasses.asdict(TimingBudget()), "min_effect": 0.05}
    opts = LadderOptions(repeats=3, noise_seeds=3, show=False, settle_within_s=None, time_budget_s=0.0,
                         clock=RunClock(now=clock))
    result = run_ladder(plan, work, settings, tmp_path / "none", opts)
    assert not launched and all(r.status == Status.SKIPPED for r in result.rungs)
    assert result.settings["budget_cut"]["stopped"]["runs_left"] == 6


def test_a_memory_stage_whose_time_ran_out_says_which_rungs_it_never_measured(tmp_path, monkeypatch):
    # Nothing fits a 1 MiB limit; the smaller batches cost more than the stage's share leaves: the note says the
    # baseline's peak and how many rungs went unmeasured, not an empty list.
    base = Recipe().batch_size

    def cost(rung, recipe, timed):
        return 60.0 + 400.0 * round(math.log2(base / recipe.batch_size))

    decision, md, clock, launched = faked_search(monkeypatch, tmp_path / "tune", cost, lambda r: 500.0, 900.0,
                                                 switches=["fused"], memory_limit="1MiB")
    note = next(line for line in md.splitlines() if "nothing measured fits it" in line)
    assert "; )" not in note and "rung(s) not measured, the stage's time spent" in note, note


def test_the_last_stage_stops_in_time_beside_its_fixed_costs_and_a_run_that_failed_late(tmp_path, monkeypatch):
    # `tune --memory-limit ... --budget 15m` as it ran on a language model: the memory stage, then the singles, the
    # last stage. Every ladder pays 13 s beside its runs (the matmul peak and the reference workload timed before its
    # first run and after its last, its report), and the process ran 10 s before the search began (its imports).
    # channels_last's first run fails after 300 s (a compile the OOM killer ended): its cost counts against the
    # budget like any run's, and the rung runs no more. Started again and priced by the other runs (40 s), its next
    # run of 290 s ended the search 96 s past its budget.
    from trainfast.tune.memory import MEMORY_SHARE

    def cost(rung, recipe, timed):
        if recipe.channels_last:
            return Failed(300.0) if recipe.seed == Recipe().seed else 290.0
        return 40.0

    budget_s = 900.0
    decision, md, clock, launched = faked_search(
        monkeypatch, tmp_path / "tune", cost, lambda r: 500.0, budget_s, switches=["fused", "channels_last"],
        memory_limit="1GiB", fixed={"ceiling": 3.0, "reference": 2.0, "report": 3.0}, started=-10.0)
    assert 10.0 + clock.t <= budget_s + 40.0, launched
    memory = [seconds for stage, _, seconds in launched if stage == "memory"]
    assert sum(memory) <= MEMORY_SHARE * budget_s + max(memory)
    # the failed rung runs no more (its error stands), and the report says it failed
    assert [name for stage, name, _ in launched if stage == "singles"].count("channels_last") == 1
    assert "- **channels_last**: failed" in md, md


def test_a_rung_whose_run_failed_stays_failed_and_runs_no_more(tmp_path):
    # fused's first run is killed (the OOM killer, say); its next pass would have worked. The rung stays failed
    # with that run's error, its later runs are not started, and the baseline's three still run.
    import dataclasses

    from trainfast.ablation import LadderOptions, TimingBudget, run_ladder

    clock, launched = Clock(), []

    def launch(rung, recipe, budget, run_dir, display, limit):
        clock.t += 10.0
        launched.append(rung.name)
        if rung.name == "fused" and launched.count("fused") == 1:
            return {"error": "the run was killed by signal 9 (SIGKILL)", "log_tail": "Killed"}
        return {**scored_rung("x", [100.0], 0.95).repeats[0], "seed": recipe.seed, "wall_time_s": 10.0}

    plan = [Rung("baseline", {}, Recipe()), Rung("fused", {"optimizer_impl": "fused"}, Recipe(optimizer_impl="fused"))]
    settings = {"repeats": 3, "budget": dataclasses.asdict(TimingBudget()), "min_effect": 0.05}
    opts = LadderOptions(repeats=3, noise_seeds=3, show=False, settle_within_s=None, clock=RunClock(now=clock))
    result = run_ladder(plan, LadderWork(launch), settings, tmp_path / "failed", opts)
    base, fused = result.rungs
    assert launched.count("fused") == 1 and launched.count("baseline") == 3
    assert fused.status == Status.FAILED and "signal 9" in fused.result.error
    assert base.status == Status.DONE
