"""Reading a framework run's proof (ablation/proof.py) and the switchboard that writes it (frameworks/board.py),
and the post-import hook that installs an adapter (frameworks/hooks.py)."""
from __future__ import annotations

import subprocess
import sys

from trainfast.ablation.proof import not_applied, script_settings, unsupported
from trainfast.frameworks.board import UNSET, Board


def section(**switches) -> dict:
    board = Board({"precision": "bf16", "compile": True})
    record = board.framework("transformers", "5.0")
    for setting, (field, wanted, script, read) in switches.items():
        record.set(field, setting, wanted, script)
        if read is not UNSET:
            record.prove(setting, read)
    record.unsupported["channels_last"] = "the model has no convolutions"
    return board.to_dict()


def test_a_switch_read_back_as_asked_is_applied_and_one_read_back_otherwise_is_not():
    proof = section(bf16=("precision", True, False, True), torch_compile=("compile", True, False, False))
    assert not_applied({"precision": "bf16"}, proof) is None
    problem = not_applied({"compile": True}, proof)
    assert "torch_compile" in problem and "read back False" in problem


def test_a_switch_never_read_back_is_not_applied():
    proof = section(bf16=("precision", True, False, UNSET))
    assert "nothing read back" in not_applied({"precision": "bf16"}, proof)


def test_a_field_no_adapter_met_is_not_applied():
    proof = section(bf16=("precision", True, False, True))
    assert "no adapter met" in not_applied({"optimizer_impl": "fused"}, proof)


def test_unsupported_only_when_no_switch_serves_any_field_of_the_rung():
    proof = section(bf16=("precision", True, False, True))
    assert "no convolutions" in unsupported({"channels_last": True}, proof)
    assert unsupported({"channels_last": True, "precision": "bf16"}, proof) is None
    assert unsupported({"optimizer_impl": "fused"}, proof) is None       # unknown: left to the read-back


def test_script_settings_lists_only_what_the_script_had_and_the_run_replaced():
    board = Board({"precision": "fp32"})
    record = board.framework("transformers", "5.0")
    record.set("precision", "bf16", False, True)
    record.set("precision", "fp16", False, False)
    record.set("compile", "torch_compile", False)            # UNSET: the framework's default
    assert script_settings(board.to_dict()) == ["transformers bf16=True"]
    assert board.overridden() == {"transformers.bf16": [True, False]}


def test_the_first_value_met_is_the_scripts_even_when_set_again():
    board = Board({})
    record = board.framework("x", "1")
    record.set("precision", "bf16", True, False)
    record.set("precision", "bf16", True, True)               # set again by a later object: not the script's
    assert record.switches["bf16"].script is False


def test_a_failing_reader_leaves_the_switches_unproven_and_says_why():
    board = Board({})
    record = board.framework("x", "1")
    record.set("compile", "torch_compile", True)

    def broken(_):
        raise RuntimeError("no model")
    record.readers.append(broken)
    out = board.to_dict()["x"]
    assert out["switches"]["torch_compile"]["applied"] is None and "no model" in out["notes"][0]


def test_the_post_import_hook_runs_after_the_module_and_at_once_for_one_already_imported():
    code = (
        "import sys\n"
        "from trainfast.frameworks.hooks import when_imported\n"
        "seen = []\n"
        "when_imported('json.decoder', lambda m: seen.append(('late', hasattr(m, 'JSONDecoder'))))\n"
        "assert 'json.decoder' not in sys.modules and not seen\n"
        "import json\n"
        "when_imported('json', lambda m: seen.append(('now', m.__name__)))\n"
        "print(seen)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[('late', True), ('now', 'json')]"


def command_work():
    import torch

    from trainfast.ablation.rung import TimingBudget
    from trainfast.ablation.work import CommandWork
    from trainfast.recipe import Recipe

    return CommandWork(cmd=None, dev=torch.device("cpu"), base=Recipe(), switched=["precision", "compile"],
                       budget=TimingBudget(), settings={})


def framework_result(applied: bool) -> dict:
    board = Board({"precision": "bf16", "compile": True})
    record = board.framework("lightning", "2.6")
    record.set("precision", "precision", "bf16-mixed", "32-true")
    record.prove("precision", "bf16-mixed" if applied else "32-true")
    record.unsupported["set_to_none"] = "Lightning's zero_grad() frees the gradients already"
    return {"session": False, "frameworks": board.to_dict()}


def test_the_ablation_rules_rungs_out_from_a_framework_runs_proof():
    from trainfast.recipe import Recipe
    from trainfast.results import EffectLabel, Rung, Status

    plan = [Rung("baseline", {}, Recipe()), Rung("amp", {"precision": "bf16"}, Recipe()),
            Rung("set_to_none", {"set_to_none": True}, Recipe())]
    work = command_work()
    after = work.after_run(plan)
    after(plan[0], framework_result(True))
    assert plan[2].status == Status.NO_EFFECT and plan[2].effect == EffectLabel.NOT_APPLICABLE
    assert "frees the gradients" in plan[2].reason and plan[1].status == Status.PENDING
    assert work.learned["framework"] == "lightning 2.6" and "framework" not in work.settings
    assert work.learned["script_settings"] == ["lightning precision='32-true'"]
    after(plan[1], framework_result(False))            # the amp run read back 32-true: not applied
    assert plan[1].status == Status.NO_EFFECT and plan[1].effect == EffectLabel.NOT_APPLIED
    assert "read back '32-true'" in plan[1].reason


def test_a_script_with_neither_session_nor_framework_has_every_rung_ruled_out_and_is_told_which_would_reach_it():
    from trainfast.recipe import Recipe
    from trainfast.results import EffectLabel, Rung

    plan = [Rung("baseline", {}, Recipe()), Rung("amp", {"precision": "bf16"}, Recipe())]
    command_work().after_run(plan)(plan[0], {"session": False})
    assert plan[1].effect == EffectLabel.NO_SESSION
    assert "does not use trainfast.Session, nor a framework" in plan[1].reason
    assert "`--switches passive_threads,reuse_memory,fast_fp32_matmul`" in plan[1].reason


def no_session_plan():
    from trainfast.recipe import Recipe
    from trainfast.results import Rung

    base = Recipe()
    amp = base.replace(precision="bf16")                      # cumulative: the rungs below carry it
    return [Rung("baseline", {}, base), Rung("amp", {"precision": "bf16"}, amp),
            Rung("passive_threads", {"passive_threads": True}, amp.replace(passive_threads=True)),
            Rung("reuse_memory", {"reuse_memory": True}, amp.replace(passive_threads=True, reuse_memory=True))]


def test_without_a_session_the_process_wide_switches_are_still_timed_and_say_what_they_carried_in_vain():
    from trainfast.results import EffectLabel, Status

    plan = no_session_plan()
    after = command_work().after_run(plan)
    after(plan[0], {"session": False, "process_switches": {"passive_threads": False, "reuse_memory": False}})
    assert plan[1].effect == EffectLabel.NO_SESSION and "--switches" not in plan[1].reason   # the plan has them already
    for rung in plan[2:]:
        assert rung.status == Status.PENDING          # the environment reaches the script: they run
        assert "process-wide switches only: precision, carried" in rung.reason
    after(plan[2], {"session": False, "process_switches": {"passive_threads": True, "reuse_memory": False}})
    assert plan[2].status == Status.PENDING           # read back as asked: its numbers stand


def test_a_process_wide_switch_the_scripts_process_does_not_have_is_not_applied():
    from trainfast.results import EffectLabel, Status

    plan = no_session_plan()
    after = command_work().after_run(plan)
    after(plan[0], {"session": False, "process_switches": {"passive_threads": False, "reuse_memory": False}})
    # e.g. the script's environment preloads jemalloc: glibc's malloc settings cannot act in it
    after(plan[3], {"session": False, "process_switches": {"passive_threads": True, "reuse_memory": False}})
    assert plan[3].status == Status.NO_EFFECT and plan[3].effect == EffectLabel.NOT_APPLIED
    assert "reuse_memory: asked True, the script's process has False" in plan[3].reason
    after(plan[2], {"session": False})                # a result without the read-back proves nothing
    assert plan[2].effect == EffectLabel.NOT_APPLIED and "has None" in plan[2].reason


def test_a_carried_switch_not_applied_is_noted_on_the_rung_that_carried_it_not_ruled_out():
    from trainfast.recipe import Recipe
    from trainfast.results import Rung, Status

    board = Board({"precision": "bf16", "pin_memory": True, "compile": True})
    record = board.framework("transformers", "5")
    record.set("compile", "torch_compile", True, False)
    record.prove("torch_compile", True)
    record.set("pin_memory", "dataloader_pin_memory", True, True)
    record.prove("dataloader_pin_memory", False)          # forced off by the framework on a CPU
    plan = [Rung("baseline", {}, Recipe()), Rung("compile", {"compile": True}, Recipe(), status=Status.DONE)]
    after = command_work().after_run(plan)
    after(plan[1], {"session": False, "frameworks": board.to_dict()})
    assert plan[1].status == Status.DONE
    assert "carried from the rungs above" in plan[1].reason and "dataloader_pin_memory" in plan[1].reason


def test_the_report_says_data_wait_was_not_measured_for_a_script_without_a_session():
    from trainfast.recipe import Recipe
    from trainfast.report.markdown import data_wait_line
    from trainfast.results import Rung, RungResult, Status

    rungs = [Rung("baseline", {}, Recipe(), status=Status.DONE, result=RungResult(data_wait_fraction=None))]
    assert "not measured" in data_wait_line(rungs)
    rungs[0].result.data_wait_fraction = 0.5
    assert "50% (input-bound)" in data_wait_line(rungs)


def test_a_precision_level_the_framework_lacks_makes_the_rung_not_applicable_and_autocast_is_served():
    from trainfast.recipe import Recipe
    from trainfast.results import EffectLabel, Rung, Status

    def run(level: str) -> dict:
        board = Board({"precision": "bf16", "precision_level": level})
        record = board.framework("accelerate", "1")
        record.set("precision", "mixed_precision", "bf16", "no")
        record.prove("mixed_precision", "bf16")
        if level != "autocast":
            record.unsupported["precision_level"] = "mixed_precision is autocast (O1) only"
        return {"session": False, "frameworks": board.to_dict()}

    plan = [Rung("baseline", {}, Recipe()),
            Rung("autocast-bf16", {"precision": "bf16", "precision_level": "autocast"}, Recipe()),
            Rung("master-bf16", {"precision": "bf16", "precision_level": "master"}, Recipe())]
    after = command_work().after_run(plan)
    after(plan[1], run("autocast"))
    after(plan[2], run("master"))
    assert plan[1].status == Status.PENDING and not plan[1].reason            # O1 is what the framework does
    assert plan[2].status == Status.NO_EFFECT and plan[2].effect == EffectLabel.NOT_APPLICABLE
    assert "autocast (O1) only" in plan[2].reason


def test_a_script_without_a_session_is_told_how_to_keep_a_process_wide_recommendation(tmp_path):
    from trainfast.recipe import Recipe
    from trainfast.report.summary import keep_line
    from trainfast.techniques import memory_reuse

    best = Recipe(passive_threads=True, reuse_memory=True)
    settings = {"no_session": True, "command": ["python", "train.py", "--data", "my photos"]}
    line = keep_line(settings, best)
    assert "OMP_WAIT_POLICY=PASSIVE" in line and line.endswith("python train.py --data 'my photos'`")
    if memory_reuse.unavailable() is None:
        assert "MALLOC_MMAP_MAX_=0" in line
    # a Session's script keeps it in its recipe; a recommendation without a process-wide switch needs nothing
    assert keep_line({}, best) is None and keep_line(settings, None) is None
    assert keep_line(settings, Recipe()) is None


def test_the_baseline_of_a_script_without_a_session_is_labelled_as_its_own_settings():
    from trainfast.recipe import Recipe
    from trainfast.report.format import rung_label
    from trainfast.results import Rung

    base = Rung("baseline", {}, Recipe())
    assert rung_label(base) == "baseline (fp32)"                   # not run yet, or the built-in run
    base.repeats.append({"session": False, "frameworks": {}})
    assert rung_label(base) == "baseline (the script's own settings)"   # e.g. timm's train.py --amp: not fp32
    base.repeats[0]["frameworks"] = {"lightning": {"version": "2.6"}}    # an adapter turned its precision off
    assert rung_label(base) == "baseline (fp32)"


def grown_ladder(tmp_path, session: bool, mode: str = "cumulative", resume: bool = False):
    """The default ladder on a command (baseline, amp, channels_last) run with a fake launch whose script
    does (or does not) create a Session; the process-wide rungs are held back for a script without one."""
    import dataclasses

    from conftest import scored_rung

    from trainfast.ablation.ladders import plan_rungs
    from trainfast.ablation.loop import LadderOptions, run_ladder
    from trainfast.techniques import memory_reuse, process_wide_fields

    base = command_work().base
    plan = plan_rungs(base, ["amp", "channels_last"], mode, "bf16", command_work().dev)
    grown = plan_rungs(base, list(process_wide_fields()), mode, "bf16", command_work().dev)[1:]
    template = scored_rung("x", [500.0], 0.95).repeats[0]
    launched = []

    class Fake(type(command_work())):
        def launcher(self, measure):
            def launch(rung, recipe, budget, run_dir, display, limit):
                launched.append((rung.name, recipe.seed))
                env = memory_reuse.unavailable() is None
                switches = {"passive_threads": recipe.passive_threads, "reuse_memory": recipe.reuse_memory and env,
                            "fast_fp32_matmul": recipe.fast_fp32_matmul}
                return {**template, "seed": recipe.seed, "session": session, "process_switches": switches}
            return launch

    work = Fake(**{f.name: getattr(command_work(), f.name) for f in dataclasses.fields(command_work())})
    work.if_no_session = grown
    options = LadderOptions(mode=mode, repeats=2, noise_seeds=2, show=False, settle_within_s=0, resume=resume)
    settings = {"repeats": 2, "budget": dataclasses.asdict(work.budget), "min_effect": 0.05}
    result = run_ladder(plan, work, settings, tmp_path / f"{session}-{mode}", options)
    return result, launched


def test_the_default_ladder_gains_the_process_wide_rungs_once_the_baseline_shows_no_session(tmp_path):
    from trainfast.results import EffectLabel, Status
    import torch

    from trainfast.techniques import matmul_precision, memory_reuse

    result, launched = grown_ladder(tmp_path, session=False)
    by_name = {r.name: r for r in result.rungs}
    assert [r.name for r in result.rungs] == ["baseline", "amp", "channels_last", "passive_threads", "reuse_memory",
                                              "fast_fp32_matmul"]
    for name in ("amp", "channels_last"):
        assert by_name[name].effect == EffectLabel.NO_SESSION and "--switches" not in by_name[name].reason
    grown = ["passive_threads"] + (["reuse_memory"] if memory_reuse.unavailable() is None else []) \
        + (["fast_fp32_matmul"] if matmul_precision.effect(torch.device("cpu")).acts else [])
    # interleaved with the baseline, pass by pass, every added rung timed as often as it
    assert launched == [(name, seed) for seed in (0, 1) for name in ["baseline", *grown]]
    for name in grown:
        assert by_name[name].status == Status.DONE and len(by_name[name].repeats) == 2
        assert "added to the default ladder: the script has no trainfast.Session" in by_name[name].reason
    assert by_name["reuse_memory"].recipe.passive_threads           # cumulative: it builds on the rung above
    assert result.settings["added_rungs"] == ["passive_threads", "reuse_memory", "fast_fp32_matmul"]
    assert "added to the default ladder" in (result.out_dir / "report.md").read_text()
    # resumed: the baseline read back grows the plan the same way, and every run is read back, none launched
    again, launched = grown_ladder(tmp_path, session=False, resume=True)
    assert launched == [] and [r.name for r in again.rungs] == [r.name for r in result.rungs]
    assert [len(r.repeats) for r in again.rungs] == [len(r.repeats) for r in result.rungs]


def test_each_mode_adds_every_process_wide_rung_on_the_baseline_alone(tmp_path):
    result, _ = grown_ladder(tmp_path, session=False, mode="each")
    reuse = {r.name: r for r in result.rungs}["reuse_memory"]
    assert reuse.changes == {"reuse_memory": True} and not reuse.recipe.passive_threads


def test_a_script_with_a_session_keeps_the_ladder_it_was_given(tmp_path):
    result, launched = grown_ladder(tmp_path, session=True)
    assert [r.name for r in result.rungs] == ["baseline", "amp", "channels_last"]
    assert {name for name, _ in launched} == {"baseline", "amp", "channels_last"}
    assert "added_rungs" not in result.settings
