"""tune -- COMMAND on a script whose runs are timed whole (a token script's): the runs that measured the recipe ran
the script to its end and reported its metric, so they are its accuracy guard, against the script as it is, with
no extra run; a recipe outside the baseline's band on the wrong side is not recommended."""
from types import SimpleNamespace

from trainfast.recipe import Recipe
from trainfast.results import Rung, RungResult, Status
from trainfast.tune.combine import Decision
from trainfast.tune.search import guarded_by_its_runs

BASE = Recipe()
PACKED = Recipe(precision="bf16", padding_free=True)


def rung(name: str, recipe: Recipe, losses: list[float]) -> Rung:
    r = Rung(name, {}, recipe, status=Status.DONE)
    r.result = RungResult(repeats=len(losses), metric_values=losses)
    return r


def decide(losses: list[float], whole: bool = True):
    singles = [rung("baseline", BASE, [3.20, 3.22, 3.21])]
    on_level = SimpleNamespace(rungs=[rung("on-level", Recipe(precision="bf16"), [3.21, 3.21]),
                                      rung("padding_free", PACKED, losses)])
    found = SimpleNamespace(singles=singles, on_level=on_level,
                            first=SimpleNamespace(metric={"name": "eval_loss", "goal": "min"}))
    search = SimpleNamespace(work=SimpleNamespace(learned={"whole_run": True} if whole else {}), base=BASE)
    return guarded_by_its_runs(search, found, Decision(PACKED, "autocast-bf16 + padding_free"))


def test_a_recipe_inside_the_band_is_kept_with_its_guard_said():
    decision = decide([3.215, 3.205])
    assert decision.name == "autocast-bf16 + padding_free"
    assert any(n.startswith("the accuracy guard: inside the band: eval_loss") for n in decision.notes)


def test_a_recipe_whose_loss_rose_past_the_band_is_not_recommended():
    decision = decide([3.40, 3.42])
    assert decision.name == "baseline" and "loses accuracy" in decision.dropped["autocast-bf16 + padding_free"]


def test_a_lower_loss_is_no_loss_of_accuracy():
    assert decide([3.00, 3.01]).name == "autocast-bf16 + padding_free"


def test_runs_that_stopped_once_timed_leave_the_guard_to_its_own_runs():
    assert decide([3.215, 3.205], whole=False) is None


def test_of_two_singles_at_the_same_speed_the_one_that_kept_the_metric_is_chosen():
    from conftest import scored_rung

    from trainfast.ablation.scoring import score_rungs
    from trainfast.tune.search import tied_best

    base = scored_rung("baseline", [100, 98, 101], 0.5)
    packed = scored_rung("padding_free", [157, 155, 158], 0.5, padding_free=True)
    grouped = scored_rung("group_by_length", [158, 156, 158], 0.5, group_by_length=True)
    slow = scored_rung("reuse_memory", [120, 118, 121], 0.5, reuse_memory=True)
    score_rungs([base, packed, grouped, slow], {})
    grouped.result.metric_flag = True           # its metric moved past the band (on the better side)
    assert tied_best([packed, grouped, slow], [base, packed, grouped, slow], 0.05) is packed
    grouped.result.metric_flag = False
    faster = max(packed, grouped, key=lambda r: r.result.speedup)          # none moved it: the faster of the two
    assert tied_best([packed, grouped, slow], [base, packed, grouped, slow], 0.05) is faster
    # inside the band both, but grouping moved the metric and packing did not: packing, however the tie fell
    packed.result.metric_delta, grouped.result.metric_delta = 0.0, 0.018
    grouped.result.speedup = packed.result.speedup * 1.01
    assert tied_best([packed, grouped, slow], [base, packed, grouped, slow], 0.05) is packed
    # stage 2 measures the combination against that same single switch
    from trainfast.tune import combine_stage

    together = base.recipe.replace(padding_free=True, group_by_length=True)
    stage = combine_stage(base.recipe, [base, packed, grouped, slow], together, ["padding_free", "group_by_length"])
    assert stage[1].name == "single-padding_free"
