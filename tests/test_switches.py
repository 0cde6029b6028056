"""Every switch declared once (techniques/switch.py), and the tables derived from the declarations.

The derived tables are pinned to what they were when each was still written by hand, so a declaration that moves
a rung, or drops a field from the paired or resumable sets, fails here and is changed on purpose."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from trainfast import techniques
from trainfast.ablation.ladders import DETECTION_LADDER, LADDER, LADDERS, RUNGS
from trainfast.frameworks import accel, hf, lightning
from trainfast.frameworks.board import FrameworkRecord
from trainfast.frameworks.common import mark_shared_switches, switch_models
from trainfast.recipe import Recipe
from trainfast.tasks import TASKS
from trainfast.tasks.effects import DATA_JUDGES, data_effect
from trainfast.techniques import ADAPTERS, EVERY_ADAPTER, ON_MODEL
from trainfast.techniques.switch import RungSpec, Switch, WrapSwitch

CPU = torch.device("cpu")


def test_every_recipe_field_has_exactly_one_owner():
    fields = [f.name for f in dataclasses.fields(Recipe)]
    declared = [name for switch in techniques.switches() for name in switch.fields]
    twice = sorted({n for n in declared if declared.count(n) > 1})
    assert not twice, f"declared by two switches: {twice}"
    assert sorted(set(fields) - set(declared)) == [], "Recipe fields with no declaration (techniques/*.py SWITCHES)"
    assert sorted(set(declared) - set(fields)) == [], "declarations of fields the Recipe does not have"


def test_the_owner_check_names_a_field_declared_twice(monkeypatch):
    declared = (*techniques.switches(), Switch(("compile",)))
    monkeypatch.setattr(techniques, "switches", lambda: declared)
    techniques.owners.cache_clear()
    try:
        with pytest.raises(LookupError, match="'compile' is declared by two switches"):
            techniques.owners()
    finally:
        monkeypatch.undo()
        techniques.owners.cache_clear()


def test_rung_names_are_unique_and_change_only_recipe_fields():
    rungs = [r for s in techniques.switches() for r in s.rungs]
    names = [r.name for r in rungs]
    assert len(names) == len(set(names)) and "baseline" not in names
    fields = {f.name for f in dataclasses.fields(Recipe)}
    for rung in rungs:
        assert set(rung.changes) <= fields, rung.name
        assert all(t in TASKS for t in (*rung.default_in, *(rung.tasks or ()), *rung.places)), rung.name


def test_the_derived_ladders_are_the_ones_written_by_hand_before():
    assert LADDER == {"baseline": {}, "amp": {"precision": "{amp}"}, "set_to_none": {"set_to_none": True},
                      "non_blocking": {"non_blocking": True, "pin_memory": True}, "prefetch": {"prefetch": True},
                      "channels_last": {"channels_last": True}, "compile": {"compile": True},
                      "fused": {"optimizer_impl": "fused"}}
    assert list(RUNGS) == ["baseline", "amp", "autocast-bf16", "master-bf16", "pure-bf16", "autocast-fp16",
                           "master-fp16", "pure-fp16", "set_to_none", "non_blocking", "prefetch", "decode_cache",
                           "device_decode", "workers", "passive_threads", "reuse_memory", "fast_fp32_matmul",
                           "channels_last", "compile",
                           "fused", "checkpointing", "compile_optimizer", "async_checkpoint", "optimizer_state",
                           "optimizer_state_4bit",
                           "ddp_buckets", "gradient_as_bucket_view", "static_graph",
                           "bf16_compress_hook", "fp16_compress_hook", "powersgd", "fsdp",
                           "no_reshard_after_forward",
                           "batch_2x", "batch_4x", "accum_4x"]
    assert RUNGS["master-bf16"] == {"precision": "bf16", "precision_level": "master"}
    assert RUNGS["workers"] == {"num_workers": 2} and RUNGS["checkpointing"] == {"activation_checkpointing": True}
    assert list(DETECTION_LADDER) == ["baseline", "amp", "set_to_none", "group_aspect_ratio", "workers",
                                      "channels_last", "compile"]
    # detection names every classification rung (so --switches refuses the ones it cannot run with the reason)
    # and its own; compile is its last
    detection_rungs = LADDERS["detection"][1]
    assert set(detection_rungs) == set(RUNGS) | {"group_aspect_ratio"} and list(detection_rungs)[-1] == "compile"
    assert "group_aspect_ratio" not in RUNGS


def test_the_derived_sets_are_the_ones_written_by_hand_before():
    from trainfast.ablation.paired import OWN_PROCESS_FIELDS
    from trainfast.checkpoint import RESUMABLE_CHANGES
    from trainfast.tune.inputs import INPUT_SWITCHES
    from trainfast.tune.switches import PRIORITY

    assert set(OWN_PROCESS_FIELDS) == {"passive_threads", "reuse_memory", "fast_fp32_matmul", "cudnn_benchmark",
                                   "deterministic",
                                   "num_workers", "persistent_workers", "prefetch_factor", "async_checkpoint",
                                   "save_every", "strategy"}
    assert RESUMABLE_CHANGES == {"epochs", "log_every", "save_every", "keep_checkpoints", "max_consecutive_skips",
                                 "nonfinite", "num_workers", "prefetch_factor", "async_checkpoint", "passive_threads",
                                 "reuse_memory", "fast_fp32_matmul", "ddp_bucket_mb",
                                 "gradient_as_bucket_view", "static_graph", "bf16_compress_hook",
                                 "fp16_compress_hook", "reshard_after_forward"}
    assert techniques.tune_priority("classification") == ("channels_last", "decode_cache", "reuse_memory",
                                                          "set_to_none", "fused", "prefetch", "passive_threads",
                                                          "fast_fp32_matmul", "compile")
    assert PRIORITY == ("padding_free", "group_by_length", *techniques.tune_priority("classification"))
    assert INPUT_SWITCHES == ("device_decode", "decode_cache", "workers")
    declared = tuple(f for s in techniques.switches() if s.process_wide for f in s.fields)
    # PROCESS_WIDE_MODULES names every module that declares one
    assert set(declared) == set(techniques.process_wide_fields())
    assert set(declared) >= {"passive_threads", "reuse_memory"}


def test_every_switch_with_a_rung_says_how_each_framework_sets_it_or_why_it_cannot():
    missing = [f"{field} ({adapter})" for switch in techniques.switches() if switch.rungs for field in switch.fields
               for adapter in ADAPTERS
               if not switch.frameworks.get(adapter) and not switch.reason_unreachable(adapter)]
    assert not missing, f"switches with no framework setting and no reason: {missing}"
    for switch in techniques.switches():
        assert set(switch.frameworks) <= set(ADAPTERS), switch.name
        assert set(switch.unreachable) <= {*ADAPTERS, EVERY_ADAPTER}, switch.name
        if any(how == ON_MODEL for how in switch.frameworks.values()):
            assert switch.model is not None, f"{switch.name} is set on the model but declares no ModelSwitch"
        assert not switch.data or switch.data in DATA_JUDGES, switch.name


def test_the_adapters_record_the_declared_reasons_before_a_run():
    fields = {"prefetch": True, "set_to_none": True, "non_blocking": True, "precision_level": "master",
              "async_checkpoint": True}
    for adapter in ADAPTERS:
        record = FrameworkRecord(adapter, "x")
        mark_shared_switches(record, fields)
        assert "trainfast's device-side prefetcher" in record.unsupported["prefetch"]
        assert "autocast (O1)" in record.unsupported["precision_level"]
    hf_record = FrameworkRecord(hf.NAME, "x")
    mark_shared_switches(hf_record, fields)
    assert "zero_grad() frees" in hf_record.unsupported["set_to_none"]
    assert "writes its own checkpoints" in hf_record.unsupported["async_checkpoint"]
    light = FrameworkRecord(lightning.NAME, "x")
    mark_shared_switches(light, fields)
    assert "async_checkpoint" not in light.unsupported            # Lightning's AsyncCheckpointIO serves it
    acc = FrameworkRecord(accel.NAME, "x")
    mark_shared_switches(acc, {"set_to_none": True, "non_blocking": True, "precision_level": "autocast"})
    assert acc.unsupported == {}      # set on the prepared objects; O1 is what every framework's precision is


def test_a_model_switch_is_set_and_read_back_the_same_way_by_every_adapter():
    for adapter in ADAPTERS:
        record = FrameworkRecord(adapter, "x")
        model = switch_models(record, nn.Sequential(nn.Conv2d(3, 4, 3)), {"channels_last": True}, adapter)
        assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
        assert record.to_dict()["switches"]["memory format"]["applied"] is True
        record = FrameworkRecord(adapter, "x")
        switch_models(record, nn.Linear(2, 2), {"channels_last": True}, adapter)
        assert "no convolutions" in record.unsupported["channels_last"]


def test_effects_are_judged_by_device_model_then_data():
    assert not data_effect("cudnn_benchmark", CPU, None).acts
    assert data_effect("channels_last", CPU, None).acts                   # a script's model: not known yet
    why = data_effect("channels_last", CPU, nn.Linear(2, 2))
    assert not why.acts and "no convolutions" in why.reason
    assert data_effect("decode_cache", CPU, None, split=None).acts         # data not known yet
    in_memory = type("Split", (), {"train": [], "val": []})()
    assert "image folders only" in data_effect("decode_cache", CPU, None, in_memory).reason
    # device first: on a CPU device decoding says so before the data is asked
    assert "only acts on CUDA" in data_effect("device_decode", CPU, None, in_memory).reason
    assert not data_effect("group_aspect_ratio", CPU, None, in_memory).applies
    assert data_effect("epochs", CPU, None).acts


def test_the_data_read_before_torch_is_the_data_declared(tmp_path):
    """The command line reads each switch's data kind from the modules' source (techniques/static.py), before torch
    loads: exactly what the imported declarations say, and a declaration it cannot read is refused by name."""
    from trainfast.techniques.static import declared_data, read_module_data

    assert declared_data() == {name: switch.data for name, switch in techniques.owners().items() if switch.data}
    (tmp_path / "named.py").write_text('KIND = "documents"\nSWITCHES = (Switch(("a", "b"), data=KIND),)\n')
    assert read_module_data(tmp_path / "named.py") == {"a": "documents", "b": "documents"}
    (tmp_path / "computed.py").write_text('SWITCHES = (Switch(fields(), data="images"),)\n')
    with pytest.raises(LookupError, match="computed.py:1"):
        read_module_data(tmp_path / "computed.py")


def test_a_rung_declared_for_one_task_is_named_only_there():
    rung = RungSpec("x", {"epochs": 2}, place=5, tasks=("detection",), default_in=("detection",),
                    places={"detection": 99})
    assert rung.named_in("detection") and not rung.named_in("classification")
    assert rung.place_in("detection") == 99 and rung.place_in("classification") == 5


def test_the_docs_table_is_the_one_the_declarations_make():
    from pathlib import Path

    from trainfast.report.switches import docs_block

    doc = Path(__file__).resolve().parents[1] / "docs" / "techniques.md"
    assert docs_block() in doc.read_text(), (
        "docs/techniques.md's switch table is out of date: run\n  python -c 'from trainfast.report.switches "
        "import update_docs; update_docs()'")


def test_the_readmes_recipe_list_and_the_framework_table_are_the_ones_the_declarations_make():
    from pathlib import Path

    from trainfast.report.switches import framework_block, recipe_block

    root = Path(__file__).resolve().parents[1]
    for block, doc in ((recipe_block(), "README.md"), (framework_block(), "docs/frameworks.md")):
        assert block in (root / doc).read_text(), (
            f"{doc}'s generated block is out of date: run\n  python -c 'from trainfast.report.switches "
            "import update_docs; update_docs()'")


def test_every_model_switch_has_its_place_in_the_written_order():
    """The order the model switches are applied in is chosen and written (techniques.MODEL_ORDER), never an
    accident of module names: each declared model switch is placed, and a new one that is not fails."""
    from trainfast.techniques import MODEL_ORDER, model_switches, ordered_model_switches
    from trainfast.techniques.switch import ModelSwitch

    declared = {s.fields[0] for s in techniques.switches() if s.model is not None}
    assert declared == {name for name, _ in MODEL_ORDER}
    assert [name for name, _ in model_switches()] == [name for name, _ in MODEL_ORDER]
    assert all(len(why) > 40 for _, why in MODEL_ORDER)          # each place says why
    stray = Switch(("fused_kernels",), model=ModelSwitch("fused kernels", lambda m, v: m, lambda m: False))
    with pytest.raises(LookupError, match="fused_kernels not placed in techniques.MODEL_ORDER"):
        ordered_model_switches([*model_switches(), ("fused_kernels", stray)])


def test_every_optimizer_switch_has_its_place_in_the_written_order(monkeypatch):
    """The optimizer switches are built, rebuilt and read back in an order written with why (techniques.
    OPTIMIZER_ORDER): each declared one is placed, a new one that is not fails, and one of them builds the
    built-in run's optimizer whatever the recipe (torch's own class, where none chooses another)."""
    from trainfast.techniques import OPTIMIZER_ORDER, build_run_optimizer, optimizer_switches
    from trainfast.techniques.switch import OptimizerSwitch

    declared = {s.fields[0] for s in techniques.switches() if s.optimizer is not None}
    assert declared == {name for name, _ in OPTIMIZER_ORDER}
    assert [name for name, _ in optimizer_switches()] == [name for name, _ in OPTIMIZER_ORDER]
    assert all(len(why) > 40 for _, why in OPTIMIZER_ORDER)
    params = [torch.nn.Parameter(torch.zeros(2))]
    built_by, optimizer = build_run_optimizer(params, Recipe())
    assert built_by in declared and type(optimizer) is torch.optim.AdamW
    stray = Switch(("fused_kernels",), optimizer=OptimizerSwitch("fused kernels", lambda o: False))
    declared_all = (*techniques.switches(), stray)
    monkeypatch.setattr(techniques, "switches", lambda: declared_all)
    with pytest.raises(LookupError, match="fused_kernels not placed in techniques.OPTIMIZER_ORDER"):
        optimizer_switches()


def test_the_tunes_input_stage_tries_every_declared_input_switch(monkeypatch):
    """The input stage is built from the declarations: a new switch with `tune_inputs` is tried with the changes
    it declares (its own by default, or its `tune_changes`), never listed and left out."""
    from trainfast.tune import inputs

    declared = techniques.input_rung_specs()
    new = RungSpec("pinned", {"pin_memory": True}, place=1, tune_inputs=9)
    monkeypatch.setattr(inputs, "input_rung_specs", lambda: (*declared, new))
    names = [*techniques.input_switches(), "pinned"]
    held = inputs.input_rungs(Recipe(num_workers=2, epochs=2), names, 4)
    assert [r.name for r in held] == ["recommended", "device_decode", "decode_cache", "workers-4", "pinned"]
    assert held[-1].recipe == Recipe(num_workers=2, epochs=2, pin_memory=True)
    assert held[3].changes == {"num_workers": 4, "persistent_workers": True}
    # a switch the recipe already has is not tried again
    assert "pinned" not in [r.name for r in inputs.input_rungs(Recipe(pin_memory=True), names, 4)]


def test_every_wrap_switch_has_its_place_in_the_written_order(monkeypatch):
    """The order the wrap switches act on the DDP / FSDP2 wrapper is written (techniques.WRAP_ORDER), each place
    with why; a declared wrap switch with no place fails."""
    from trainfast.techniques import WRAP_ORDER, wrap_switches

    declared = {s.fields[0] for s in techniques.switches() if s.wrap is not None}
    assert declared == {name for name, _ in WRAP_ORDER}
    assert [name for name, _ in wrap_switches()] == [name for name, _ in WRAP_ORDER]
    assert all(len(why) > 40 for _, why in WRAP_ORDER)
    everything = techniques.switches()
    monkeypatch.setattr(techniques, "switches", lambda: (*everything, Switch(("fast_buckets",),
                                                                             wrap=WrapSwitch("bucket"))))
    with pytest.raises(LookupError, match="fast_buckets not placed in techniques.WRAP_ORDER"):
        wrap_switches()


def test_a_wrap_switch_builds_the_wrapper_acts_on_it_is_read_back_and_needs_ranks(monkeypatch, tmp_path):
    """The kind end to end on a declared switch: its options reach DDP's constructor, its apply runs on the built
    wrapper, the run's proof reads it back from the wrapper, and in one process it is not applicable."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from trainfast.distributed import Dist
    from trainfast.tasks.effects import in_context
    from trainfast.techniques.switch import RunContext

    applied = []
    fake = Switch(("bucket_test",), wrap=WrapSwitch("bucket_cap_mb", options=lambda mb: {"bucket_cap_mb": mb},
                                                    apply=lambda wrapped, mb: applied.append(mb),
                                                    state=lambda wrapped: wrapped.bucket_bytes_cap / 2 ** 20))
    monkeypatch.setattr(techniques, "switches", lambda: (fake,))      # alone: the declared ones have their tests
    monkeypatch.setattr(techniques, "owners", lambda: {"bucket_test": fake})
    monkeypatch.setattr(techniques, "WRAP_ORDER", (("bucket_test", "the only one"),))
    alone = in_context(data_effect, RunContext(CPU))("bucket_test", CPU, None)
    assert not alone.acts and not alone.applies and "--nproc 2" in alone.reason      # "not applicable", why said
    assert in_context(data_effect, RunContext(CPU, ranks=2))("bucket_test", CPU, None).acts
    other = in_context(data_effect, RunContext(CPU, ranks=2, strategy="fsdp"))("bucket_test", CPU, None)
    # declared for the DDP wrapper only
    assert not other.acts and not other.applies and "strategy=fsdp" in other.reason
    assert techniques.wrap_options(SimpleNamespace(bucket_test=50), "fsdp") == {}    # declared for DDP only
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        job = Dist(CPU, world_size=2)      # what wrap() sees in a job of two ranks (one process of it here)
        wrapped = job.wrap(nn.Linear(4, 2), SimpleNamespace(bucket_test=50, precision="fp32"))
        assert wrapped.bucket_bytes_cap == 50 * 2 ** 20 and applied == [50]
        assert job.wrap_state() == {"bucket_test": 50.0}
    finally:
        dist.destroy_process_group()
    assert Dist(CPU).wrap_state() == {}                 # one process: nothing wrapped, nothing to read back
