"""The progress of a long job (report/progress.py): runs done of runs planned, the time left from the runs measured
so far (per-rung costs, passes added), the plain lines off a terminal, the bar on one, and the ladder's feed
(ablation/loop.py: Launches.plan)."""
import io
import time
from types import SimpleNamespace

import pytest

from trainfast.ablation.clock import RunClock
from trainfast.ablation.loop import Launches, run_kind
from trainfast.ablation.rung import TimingBudget
from trainfast.recipe import Recipe
from trainfast.report.live import Display
from trainfast.report.progress import SEEDS, RunPlan, seconds_text, time_line
from trainfast.results import Rung, Status

COSTS = {"baseline": 60.0, "amp": 20.0, "compile": 100.0}     # seconds a run of each rung takes (faked)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ladder_pass(repeats: int = 3) -> list[str]:
    return [name for _ in range(repeats) for name in COSTS]


def run_through(plan: RunPlan, clock: Clock, runs: int) -> None:
    for _ in range(runs):
        kind = plan.planned[0]
        clock.now += COSTS[kind.removesuffix(SEEDS)]
        plan.finished(kind, COSTS[kind.removesuffix(SEEDS)])


def test_estimate_after_the_first_pass_is_the_plans_own_sum():
    clock = Clock()
    plan = RunPlan(clock=clock)
    plan.plan(ladder_pass() + ["baseline" + SEEDS])
    assert plan.left_s() is None and plan.line() == "1 of 10 runs, time left after the first of them"
    run_through(plan, clock, 1)
    # one run priced: every other run costs what it cost (no rung has its own yet)
    assert plan.left_s() == pytest.approx(9 * 60)
    run_through(plan, clock, 2)
    # after the first pass: each rung's runs at their own cost, the baseline's seed run at the baseline's
    assert plan.left_s() == pytest.approx(2 * sum(COSTS.values()) + 60)
    actual = 3 * sum(COSTS.values()) + 60
    assert plan.planned_total_s == pytest.approx(actual)          # the planned time kept for the report
    assert plan.line() == f"4 of 10 runs, ~{seconds_text(2 * 180 + 60)} left"
    run_through(plan, clock, 7)
    assert plan.summary()["total_s"] == pytest.approx(actual) and plan.summary()["runs"] == 10


def test_a_pass_added_updates_the_plan_and_says_why():
    clock = Clock()
    plan = RunPlan(clock=clock)
    plan.plan(ladder_pass(3))
    run_through(plan, clock, 9)
    change = plan.plan(ladder_pass(1), "pass 4 added: amp still within the noise")
    assert change["runs"] == 3 and change["total"] == 12 and change["left_s"] == pytest.approx(180)
    assert plan.change_line(change) == ("plan: +3 run(s), pass 4 added: amp still within the noise: now 12 runs, "
                                        "~3 min left")
    assert plan.plan(ladder_pass(1)[1:], None) is not None            # any change in number is one, said
    assert plan.plan(plan.planned, "nothing changed") is None         # the same runs: nothing said
    text = time_line({"time": plan.summary()})
    assert text.startswith("The ablation took 9 min for 9 runs (planned after the first pass: 9 min)")
    assert "+3 run(s) after run 9: pass 4 added" in text


def rungs() -> list[Rung]:
    return [Rung(name, {}, Recipe()) for name in COSTS]


def display(terminal: bool) -> tuple[Display, io.StringIO]:
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=160)
    env = {"device_name": "test cpu", "device": "cpu"}
    return Display(rungs(), {"fp32": 1e11}, env, settings={}, console=console), out


def test_plain_lines_off_a_terminal_carry_n_of_m_and_the_time_left():
    shown, out = display(terminal=False)
    base, amp = shown.rungs[0], shown.rungs[1]
    with shown:
        shown.plan(["baseline", "amp", "compile"] * 2)
        shown.start_rung(base, 0, 1, 2)
        shown.finished("baseline", 60.0)
        shown.plan(["amp", "compile", "baseline", "amp", "compile"])
        shown.start_rung(amp, 0, 1, 2)
        shown.finished("amp", 20.0)
        shown.plan(["compile", "baseline", "amp", "compile", "amp"], "pass 3 added: amp within the noise")
    text = out.getvalue()
    assert "\x1b[" not in text                       # plain: no colour, no redraws
    assert "seed 0, run 1 of 2 … (1 of 6 runs, time left after the first of them)" in text
    assert "(2 of 6 runs, ~5 min left)" in text     # five runs at the first run's 60 s
    assert "plan: +1 run(s), pass 3 added: amp within the noise: now 7 runs, ~3 min left" in text


def test_the_bar_on_a_terminal_shows_runs_done_and_the_time_left():
    shown, out = display(terminal=True)
    with shown:
        assert shown.live is not None                 # a terminal: the live table and its bars
        shown.plan(["baseline", "amp", "compile"])
        shown.start_rung(shown.rungs[0], 0, 1, 1)
        shown.finished("baseline", 60.0)
        shown.plan(["amp", "compile"])
    text = out.getvalue()
    assert "1/3" in text and "~2 min left" in text
    assert "running baseline" not in text            # no plain lines under the live display


def fake_ladder(**kw):
    base = Rung("baseline", {}, Recipe())
    amp = Rung("amp", {}, Recipe())
    budget = TimingBudget()
    queue = [(r, i, budget) for i in range(2) for r in (base, amp)] + [(base, 2, None)]
    opts = SimpleNamespace(settle_within_s=600.0, time_budget_s=None, min_effect=0.05, mode="each")
    kw.setdefault("spending", SimpleNamespace(clock=RunClock(), held_s=lambda: 0.0))   # no time budget: unbounded
    return SimpleNamespace(added=[], cut=None, measured=[base, amp], aim=None, opts=opts, queue=queue, repeats=2,
                           started=time.monotonic(), **kw)


class Recorder:
    def __init__(self) -> None:
        self.plans = []
        self.runs = RunPlan()

    def plan(self, kinds, why=None):
        self.plans.append((kinds, why))


def test_the_ladder_feeds_its_queue_and_says_why_a_pass_was_added(tmp_path):
    launches = Launches(SimpleNamespace(), None, tmp_path)
    ladder, shown = fake_ladder(), Recorder()
    launches.plan(ladder, shown)
    assert shown.plans[-1] == (["baseline", "amp", "baseline", "amp", "baseline" + SEEDS], None)
    assert run_kind(ladder.queue[-1][0], None) == "baseline" + SEEDS
    ladder.added.append({"repeat": 3, "unsettled": ["amp"], "pass_s": 40.0})
    ladder.queue = [(r, 3, TimingBudget()) for r in ladder.measured]
    launches.plan(ladder, shown)
    assert shown.plans[-1][1] == "pass 3 added: amp still within the noise or unresolved (settling, within 600 s)"
    assert shown.runs.settle[1] == ["baseline", "amp"] and 590 < shown.runs.settle[0] <= 600
    ladder.cut, ladder.opts.time_budget_s = SimpleNamespace(trimmed=True, restored=None), 300.0
    launches.plan(ladder, shown)
    assert shown.plans[-1][1] == "cut to fit the time budget (300 s)"
    assert shown.runs.settle is None            # a trimmed plan gets no settling pass
    ladder.cut.restored = ["fused"]
    launches.plan(ladder, shown)
    assert shown.plans[-1][1] == "fused put back: the first pass ran cheaper than the cut priced it"


def test_the_time_left_says_how_long_settling_passes_may_take():
    clock = Clock()
    plan = RunPlan(clock=clock, settle=(600.0, list(COSTS)))
    plan.plan(ladder_pass(3))
    run_through(plan, clock, 3)
    # 6 runs left (360 s); settling may add passes until 600 s from the start, the last ending one pass (180 s) later
    assert plan.left_s() == pytest.approx(360) and plan.up_to_s() == pytest.approx(600 + 180 - 180)
    assert plan.line() == "4 of 9 runs, ~6 min left, up to ~10 min if passes are added to settle verdicts"
    assert plan.summary()["planned_up_to_s"] == pytest.approx(780)
    assert "up to 13 min with settling passes" in time_line({"time": plan.summary()})


def test_the_selfcheck_table_carries_the_checks_left():
    from rich.console import Console

    from trainfast.selfcheck.runner import Result, build_table

    plan = RunPlan(noun="checks")
    plan.plan(["amp", "ddp"])
    plan.finished("amp", 4.0)
    out = io.StringIO()
    Console(file=out, width=120).print(build_table([Result("amp", "pass", seconds=4.0)], "selfcheck", plan.line()))
    assert "2 of 2 checks, ~4 s left" in out.getvalue()


def test_the_time_left_and_the_time_budget_price_a_run_by_one_record():
    """RunPlan (the time left) and RunClock (the budget) keep their costs in one RunCosts and price alike: the same
    sort and subject, else the same sort, else the same subject, else every run."""
    from trainfast.ablation.clock import RunClock, recipe_key, run_kind
    from trainfast.report.progress import RunCosts

    plan, clock = RunPlan(), RunClock()
    assert isinstance(plan.costs, RunCosts) and isinstance(clock.costs, RunCosts)
    plan.finished("baseline", 60.0), plan.finished("amp", 20.0)
    clock.spend(run_kind("speed"), Recipe(), 60.0), clock.spend(run_kind("speed"), Recipe(channels_last=True), 20.0)
    assert plan.cost("compile") == clock.price(run_kind("speed"), Recipe(compile=True)) == 40.0   # the same sort
    assert plan.cost("baseline" + SEEDS) == clock.price(run_kind("speed", timed=False), Recipe()) == 60.0
    assert clock.costs.has(run_kind("speed"), recipe_key(Recipe(seed=3)))           # the seed is no other recipe


def test_the_time_left_is_never_said_past_the_time_budgets_end(tmp_path):
    """A plan cut to its floor (a baseline and one rung, 3 repeats) may still price past the budget: the runs past
    it will not start (each is checked before it does), so the time left says the budget's end, and why."""
    clock = Clock()
    plan, budget = RunPlan(clock=clock), RunClock(total_s=100.0, now=clock)
    plan.plan(ladder_pass(1))
    run_through(plan, clock, 1)
    plan.budget_left = budget.left
    assert plan.left_s() == pytest.approx(100.0 - 60.0)
    assert plan.line() == "2 of 3 runs, ~40 s left, where the time budget stops it"
    change = plan.plan(["amp", "compile", "amp", "compile"], "cut to fit the time budget (100 s)")
    assert plan.change_line(change).endswith("now 5 runs, ~40 s left (the time budget stops it then)")
    plan.budget_left = RunClock(total_s=10_000.0, now=clock).left          # a budget the plan fits in: its own sum
    assert plan.left_s() == pytest.approx(240.0) and "budget" not in plan.line()
    # the ladder hands its clock to the display where a budget bounds it
    launches = Launches(SimpleNamespace(), None, tmp_path)
    ladder, shown = fake_ladder(spending=SimpleNamespace(clock=RunClock(total_s=300.0), held_s=lambda: 0.0)), Recorder()
    launches.plan(ladder, shown)
    assert 290 < shown.runs.budget_left() <= 300
    unbounded, shown = fake_ladder(), Recorder()
    launches.plan(unbounded, shown)
    assert shown.runs.budget_left is None


def test_the_time_planned_after_the_first_pass_counts_the_close_and_the_settling_passes_it_expects():
    # Three passes of 180 s planned, a settle window of 800 s: one more pass ends within it (at 720 s), a second would
    # not (900 s); the close (peak, reference workload, report) takes 30 s. Without them the estimate was 540 s of
    # the 750 the ablation takes: 28% short.
    clock = Clock()
    plan = RunPlan(clock=clock, settle=(800.0, list(COSTS)), settle_passes=5, close_s=30.0)
    plan.plan(ladder_pass(3))
    run_through(plan, clock, 3)
    assert plan.planned_total_s == pytest.approx(540 + 180 + 30)
    assert plan.line().startswith(f"4 of 9 runs, ~{seconds_text(360 + 180 + 30)} left,")   # runs, pass, close
    run_through(plan, clock, 6)
    plan.plan(ladder_pass(1), "pass 4 added: amp still within the noise")
    run_through(plan, clock, 3)
    clock.now += 30.0                                    # the close
    assert plan.summary()["total_s"] == pytest.approx(plan.planned_total_s)
    # verdicts that settled by the first pass (no pass expected): the planned runs and the close only
    settled = RunPlan(clock=clock, settle=(800.0, list(COSTS)), settle_passes=0, close_s=30.0)
    settled.plan(ladder_pass(3))
    run_through(settled, clock, 3)
    assert settled.planned_total_s == pytest.approx(540 + 30)


def test_the_ladder_tells_the_plan_its_close_and_the_passes_its_unsettled_verdicts_may_add(tmp_path):
    from trainfast.defaults import MAX_REPEATS

    launches = Launches(SimpleNamespace(), None, tmp_path)
    ladder, shown = fake_ladder(spending=SimpleNamespace(clock=RunClock(), held_s=lambda: 12.0)), Recorder()
    base, amp = ladder.measured
    base.status = amp.status = Status.PARTIAL
    base.repeats, amp.repeats = [{}], [{}]           # after the first pass: one run each, no noise of their own yet
    amp.result.speedup = 1.04                        # within what two runs at the prior noise can tell from 5%
    launches.plan(ladder, shown)
    assert shown.runs.close_s == 12.0 and shown.runs.settle_passes == MAX_REPEATS - ladder.repeats
    amp.result.speedup = 2.0                         # a gain no noise hides: no pass expected
    launches.plan(ladder, shown)
    assert shown.runs.settle_passes == 0


def test_every_time_left_stops_at_the_budgets_end():
    # A settle window of 600 s in a stage that has 300 s of its budget left: neither the time left nor the bound on
    # what settling adds says more than the 300 s (a pass that does not fit the budget is not added).
    clock = Clock()
    plan = RunPlan(clock=clock, settle=(600.0, list(COSTS)), settle_passes=3, close_s=10.0)
    plan.plan(ladder_pass(2))
    run_through(plan, clock, 3)
    budget = RunClock(total_s=180.0 + 300.0, now=clock)
    budget.started = plan.started
    plan.budget_left = budget.left
    assert plan.up_to_s() == pytest.approx(300.0) and plan.left_s() <= 300.0
    assert "up to" not in plan.line() and "~5 min left" in plan.line()
    plan.budget_left = None                            # no budget: the bound is the settle window's
    assert plan.up_to_s() == pytest.approx(600 + 180 - 180 + 10)


def test_a_compiled_rungs_first_run_prices_its_repeats_without_its_compile():
    # The default ablation's compile rung on 2 cores: its first run took 21 s, 15 of them compiling (its epoch took
    # 17.4 s for 49 steps of 0.058 s), its repeats 6.3 s, reading the shared cache; priced at 21 s, the plan after the
    # first pass said 30 s more than the ablation took.
    from trainfast.ablation.spending import repeat_cost

    first = {"compile": {"graphs": 1}, "epoch_time_s": 17.39, "steps_run": 49,
             "timing": {"timed_steps": 35, "timed_seconds": 2.017}}
    assert repeat_cost(first, 21.17) == pytest.approx(21.17 - (17.39 - 49 * 2.017 / 35), abs=0.01)   # ~6.6 s
    assert repeat_cost({**first, "compile": {"graphs": 0}}, 21.17) == 21.17        # not compiled: as it took
    warm = {**first, "epoch_time_s": 4.7}      # read from a warm cache: ~2 s of 7.7 its repeats pay too
    assert repeat_cost(warm, 7.7) == 7.7
    plan = RunPlan()
    plan.plan(["compile", "compile"])
    plan.finished("compile", 21.17, repeat_cost(first, 21.17))
    assert plan.cost("compile") == pytest.approx(6.6, abs=0.1)


def test_a_cumulative_ladders_steps_between_rungs_count_as_verdicts_to_settle():
    # The default ablation after its first pass: every rung 1.6x the baseline, but each on top of the one above it
    # gains ~3%, the step a cumulative ladder judges: settling will add passes for those.
    from trainfast.ablation.scoring import likely_unsettled

    plan = [Rung(name, {}, Recipe()) for name in ("baseline", "amp", "prefetch")]
    for rung, speedup in zip(plan, (1.0, 1.6, 1.65)):
        rung.status, rung.repeats, rung.result.speedup = Status.PARTIAL, [{}], speedup
    assert not likely_unsettled(plan, 3, 0.05) and likely_unsettled(plan, 3, 0.05, cumulative=True)
