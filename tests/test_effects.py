"""A technique that cannot act on the device (or model) is detected as such, from the device itself."""
import pytest
import torch
from conftest import tiny_resnet
from torch import nn

from trainfast.ablation.ladders import LADDER, plan_rungs
from trainfast.recipe import Recipe
from trainfast.tasks.effects import changes_effect, data_effect
from trainfast.techniques.precision import auto_amp_dtype, has_fast_bf16

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
MLP = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))


def test_transfer_switches_act_only_on_cuda():
    for name in ("non_blocking", "pin_memory", "cudnn_benchmark"):
        assert not data_effect(name, CPU, MLP).acts
        assert "only acts on CUDA" in data_effect(name, CPU, MLP).reason
        assert data_effect(name, CUDA, MLP).acts


def test_non_blocking_rung_is_no_effect_on_cpu_but_measured_on_cuda():
    changes = LADDER["non_blocking"]
    on_cpu = changes_effect(changes, CPU, tiny_resnet())
    assert on_cpu.label == "no-effect" and "cpu" in on_cpu.reason
    assert changes_effect(changes, CUDA, tiny_resnet()).label == "measured"


def test_channels_last_depends_on_the_model():
    assert data_effect("channels_last", CPU, tiny_resnet()).acts
    effect = data_effect("channels_last", CPU, MLP)
    assert not effect.acts and "no convolutions" in effect.reason


def test_precision_and_optimizer_switches_always_act():
    for name in ("precision", "set_to_none", "optimizer_impl", "compile", "prefetch"):
        assert data_effect(name, CPU, tiny_resnet()).acts


def test_amp_dtype_follows_the_hardware(monkeypatch):
    from trainfast.techniques import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512_bf16"})
    assert has_fast_bf16(CPU) and auto_amp_dtype(CPU) == "bf16"
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2"})
    assert not has_fast_bf16(CPU) and auto_amp_dtype(CPU) == "fp16"


def test_cumulative_and_each_modes():
    cumulative = plan_rungs(Recipe(), None, "cumulative", "bf16", CPU)
    assert [r.name for r in cumulative] == list(LADDER)
    last = cumulative[-1].recipe
    assert (last.precision, last.set_to_none, last.prefetch, last.channels_last, last.compile,
            last.optimizer_impl) == ("bf16", True, True, True, True, "fused")
    each = plan_rungs(Recipe(), ["compile", "amp"], "each", "bf16", CPU)
    assert [r.name for r in each] == ["baseline", "amp", "compile"]
    assert each[2].recipe == Recipe(compile=True)


def test_decode_cache_acts_on_image_folders_only(digits16, tmp_path):
    from test_data_pipeline import make_folder

    from trainfast.data.imagefolder import load_imagefolder

    make_folder(tmp_path / "photos", per_class=4)
    folder = load_imagefolder(str(tmp_path / "photos"), image_size=16)
    assert data_effect("decode_cache", CPU, MLP, folder).acts
    in_memory = changes_effect({"decode_cache": True}, CPU, MLP, digits16)
    assert in_memory.label == "no-effect" and "image folders only" in in_memory.reason


@pytest.fixture
def fake_speeds(monkeypatch):
    """fake_speeds(flags, fp32, half): a CPU with these flags whose 256^3 products run at these FLOP/s (no real
    measurement). slow_half_reason's cache is cleared before and after, so no other test sees the fake."""
    from trainfast import measure
    from trainfast.techniques import precision

    def fake(flags: set[str], fp32: float, half: float) -> None:
        monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
        monkeypatch.setattr(measure, "measure_ceiling",
                            lambda device, dtype, n=None, repeats=5: fp32 if dtype == torch.float32 else half)
        precision.slow_half_reason.cache_clear()

    yield fake
    precision.slow_half_reason.cache_clear()


def test_a_half_type_without_hardware_is_measured_slow_and_left_out(fake_speeds):
    from trainfast.techniques.precision import SLOW_HALF, slow_half_reason

    fake_speeds({"avx2", "fma"}, fp32=100e9, half=1e9)      # AMD Zen 3: ~1 GFLOP/s in bf16
    reason = slow_half_reason(CPU, "bf16")
    assert "1.0 GFLOP/s" in reason and "100 in fp32" in reason and "100x slower" in reason
    plan = plan_rungs(Recipe(), None, "cumulative", "auto", CPU)
    amp = plan[1]
    assert (amp.name, amp.status, amp.effect, amp.recipe.precision) == ("amp", "no-effect", SLOW_HALF, "fp16")
    # the ladder climbs on without it: every later rung stays in fp32 and keeps the rungs before it
    assert all(r.recipe.precision == "fp32" for r in plan[2:])
    assert plan[-1].recipe.channels_last and plan[-1].recipe.optimizer_impl == "fused"
    # asked for by dtype or by level rung, it is measured all the same
    assert all(r.status == "pending" for r in plan_rungs(Recipe(), None, "cumulative", "fp16", CPU))
    assert plan_rungs(Recipe(), ["autocast-bf16"], device=CPU)[1].status == "pending"


def test_a_half_type_within_twice_fp32_or_with_hardware_is_run(fake_speeds):
    from trainfast.techniques.precision import slow_half_reason

    fake_speeds({"avx2"}, fp32=100e9, half=60e9)     # slower, but worth measuring
    assert slow_half_reason(CPU, "fp16") is None
    fake_speeds({"avx2", "avx512_bf16"}, fp32=100e9, half=1e9)
    assert slow_half_reason(CPU, "bf16") is None                          # the flags say fast: no probe
    assert plan_rungs(Recipe(), None, "cumulative", "auto", CPU)[1].status == "pending"
    assert slow_half_reason(torch.device("cuda"), "fp16") is None          # never probed on a GPU
