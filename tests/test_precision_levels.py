"""Precision levels O0-O3: loss-scaler dynamics, fp32 masters, clipping on unscaled gradients, state round
trip, recipe/ladder wiring, and the fp32 bit-parity with a plain loop. CPU, tiny models, seconds each."""
from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import nn

from trainfast.ablation.ladders import LADDER, plan_rungs
from trainfast.checkpoint import atomic_save, safe_load
from trainfast.engine import train_one_epoch
from trainfast.measure import Meter
from trainfast.recipe import Recipe, RecipeError
from trainfast.report import rung_label
from trainfast.session import build_state, seed_everything
from trainfast.techniques.precision import COLLAPSE_AFTER, MasterWeights, PureHalf, build_precision, level_note

CPU = torch.device("cpu")
FP16_LEVELS = ["autocast", "master", "pure"]


class PoisonGrad(torch.autograd.Function):
    """Identity forward; backward turns the gradient into inf (or NaN): a finite loss with non-finite grads."""

    @staticmethod
    def forward(ctx, x, value):
        ctx.value = value
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.value, None


class PoisonedLoss:
    """Cross-entropy whose backward is poisoned on the chosen (0-based) steps."""

    def __init__(self, bad_steps=(), value=math.inf) -> None:
        self.bad_steps, self.value, self.calls = set(bad_steps), value, 0

    def __call__(self, outputs, targets):
        if self.calls in self.bad_steps:
            outputs = PoisonGrad.apply(outputs, self.value)
        self.calls += 1
        return nn.functional.cross_entropy(outputs, targets)


def tiny_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4))


def tiny_batches(n: int, seed: int = 0, batch: int = 8):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 8, generator=g), torch.randint(0, 4, (batch,), generator=g)) for _ in range(n)]


def make_state(recipe: Recipe, model_fn=tiny_model, **scaler_args):
    seed_everything(recipe.seed)
    precision = build_precision(recipe.precision, CPU, recipe.precision_level, **scaler_args)
    return build_state(model_fn(), recipe, CPU, precision=precision)


def run(state, batches, loss_fn):
    return train_one_epoch(state, batches, loss_fn, Meter(CPU, log_every=len(batches)))


def snapshot(state):
    opt_state = {k: {n: t.clone() if torch.is_tensor(t) else t for n, t in v.items()}
                 for k, v in state.optimizer.state.items()}
    params = [p.detach().clone() for g in state.optimizer.param_groups for p in g["params"]]
    return [p.detach().clone() for p in state.model.parameters()], params, opt_state


def fp16(level: str, **kw) -> Recipe:
    # SGD: O3's AdamW in fp16 turns its eps=1e-8 into 0 and divides by an underflowed second moment (NaN) --
    # a real O3 hazard (see test_pure_fp16_adamw_is_the_known_hazard), not what these tests are about.
    return Recipe(precision="fp16", precision_level=level, optimizer="sgd", **kw)


# --- loss scaler dynamics ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [math.inf, math.nan])
@pytest.mark.parametrize("level", FP16_LEVELS)
def test_nonfinite_gradient_skips_step_and_backs_off(level, value):
    state = make_state(fp16(level), init_scale=2.0**10)
    run(state, tiny_batches(2), PoisonedLoss())                  # two good steps: optimizer state exists
    before = snapshot(state)
    scale_before = state.precision.metrics()["loss_scale"]
    run(state, tiny_batches(1, seed=1), PoisonedLoss({0}, value))
    after = snapshot(state)
    for a, b in zip(before[0] + before[1], after[0] + after[1]):
        assert torch.equal(a, b)                                   # model weights and optimizer params untouched
    for key in before[2]:
        for name, t in before[2][key].items():
            assert torch.equal(torch.as_tensor(t), torch.as_tensor(after[2][key][name])), name
    m = state.precision.metrics()
    assert m["loss_scale"] == scale_before * 0.5
    assert m["skipped_steps"] == 1
    assert state.step == 3                                         # the scheduler/step counter still advances


def expected_scale(n_steps: int, bad: set[int], init: float, interval: int) -> tuple[float, int]:
    """GradScaler's documented dynamics, written out: x0.5 on a bad step, x2 after `interval` good ones."""
    scale, good, skipped = init, 0, 0
    for i in range(n_steps):
        if i in bad:
            scale, good, skipped = scale * 0.5, 0, skipped + 1
        else:
            good += 1
            if good == interval:
                scale, good = scale * 2.0, 0
    return scale, skipped


@pytest.mark.parametrize("level", FP16_LEVELS)
def test_scale_grows_after_interval_and_skip_count_is_exact(level):
    bad = {1, 5, 6, 12}
    state = make_state(fp16(level), init_scale=2.0**8, growth_interval=3)
    run(state, tiny_batches(16), PoisonedLoss(bad))
    scale, skipped = expected_scale(16, bad, 2.0**8, 3)
    m = state.precision.metrics()
    assert (m["loss_scale"], m["skipped_steps"], m["longest_skip_run"]) == (scale, skipped, 2)


@pytest.mark.parametrize("level", FP16_LEVELS)
def test_collapsing_scale_warns_once(level):
    state = make_state(fp16(level))
    n = 2 * COLLAPSE_AFTER + 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(state, tiny_batches(n, batch=2), PoisonedLoss(range(n)))
    collapsed = [w for w in caught if "loss scale collapsed" in str(w.message)]
    assert len(collapsed) == 1
    assert state.precision.metrics()["skipped_steps"] == n


def test_healthy_fp16_run_does_not_warn():
    state = make_state(fp16("master"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        run(state, tiny_batches(2 * COLLAPSE_AFTER, batch=2), PoisonedLoss({0, 1}))
    assert state.precision.metrics()["skipped_steps"] == 2


# --- O2 master weights -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_master_weights_are_fp32_and_round_to_the_half_weights(dtype):
    state = make_state(Recipe(precision=dtype, precision_level="master"))
    run(state, tiny_batches(6), PoisonedLoss())
    half = torch.bfloat16 if dtype == "bf16" else torch.float16
    assert isinstance(state.precision, MasterWeights) and state.precision.pairs
    for p, master in state.precision.pairs:
        assert p.dtype == half and master.dtype == torch.float32
        assert torch.equal(p, master.to(half))                    # the half weight is the master, rounded
        spacing = torch.finfo(half).eps * master.abs().clamp_min(torch.finfo(half).tiny)
        assert ((p.float() - master).abs() <= spacing).all()
        assert p.grad is None                                      # half gradients are freed after the copy
    norm = state.model[1]
    assert norm.weight.dtype == torch.float32                      # LayerNorm kept fp32, its own master
    assert all(p.dtype == torch.float32 for g in state.optimizer.param_groups for p in g["params"])


class Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return (self.w * x).expand(x.shape[0], 2) * torch.tensor([1.0, -1.0], dtype=x.dtype)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_tiny_update_survives_in_master_and_is_lost_in_pure(dtype):
    half = torch.bfloat16 if dtype == "bf16" else torch.float16
    eps = torch.finfo(half).eps                                   # spacing of half numbers just above 1.0
    recipe = dict(precision=dtype, optimizer="adamw", lr=eps / 8, weight_decay=0.0)
    batches = [(torch.ones(4, 1), torch.zeros(4, dtype=torch.long))] * 40
    results = {}
    for level in ("master", "pure"):
        state = make_state(Recipe(precision_level=level, **recipe), model_fn=Scalar)
        run(state, batches, PoisonedLoss())
        results[level] = state
    # AdamW moves w by ~lr per step: 40 x eps/8 = 5 eps in total, each step below half the spacing at 1.0.
    master = results["master"].precision.pairs[0][1].detach()
    assert abs(1.0 - float(master)) == pytest.approx(5 * eps, rel=0.05)
    assert float(results["master"].model.w.detach()) != 1.0      # the accumulated update reaches the half weight
    pure = results["pure"].model.w.detach()
    assert pure.dtype == half and float(pure) == 1.0              # O3: every update rounded away
    assert isinstance(results["pure"].precision, PureHalf)


def test_pure_fp16_adamw_is_the_known_hazard():
    """Why O3 is flagged risky: fp16 AdamW state underflows (eps=1e-8 is 0 in fp16) and the run goes NaN,
    while O2 runs the same AdamW on fp32 masters and stays finite."""
    from trainfast.measure import NonFiniteLossError

    batches = tiny_batches(30)
    state = make_state(Recipe(precision="fp16", precision_level="master"))
    run(state, batches, PoisonedLoss())
    assert all(torch.isfinite(p).all() for p in state.model.parameters())
    state = make_state(Recipe(precision="fp16", precision_level="pure"))
    with pytest.raises(NonFiniteLossError):
        run(state, batches, PoisonedLoss())


# --- clipping sees unscaled gradients ----------------------------------------------------------------------

def optimizer_grad_norms(state):
    norms = []

    def record(opt, args, kwargs):
        grads = [p.grad.float() for g in opt.param_groups for p in g["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

    state.optimizer.register_step_pre_hook(record)
    return norms


@pytest.mark.parametrize("max_norm", [0.05, 1e6])
def test_clipping_sees_unscaled_gradients(max_norm):
    seen = {}
    for precision, level in [("fp32", "autocast"), ("fp16", "autocast"), ("fp16", "master"), ("fp16", "pure"),
                             ("bf16", "master")]:
        state = make_state(Recipe(precision=precision, precision_level=level, grad_clip=max_norm))
        norms = optimizer_grad_norms(state)
        run(state, tiny_batches(1), PoisonedLoss())
        seen[(precision, level)] = norms[0]
    reference = seen[("fp32", "autocast")]
    if max_norm < 1:
        assert reference == pytest.approx(max_norm, rel=1e-4)     # the clip was active
    for key, norm in seen.items():
        assert norm == pytest.approx(reference, rel=2e-2), key


# --- state round trip --------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", FP16_LEVELS)
def test_scaler_state_round_trips_through_a_checkpoint(level, tmp_path):
    state = make_state(fp16(level), init_scale=2.0**9, growth_interval=4)
    run(state, tiny_batches(7), PoisonedLoss({2}))
    atomic_save({"precision": state.precision.state_dict()}, tmp_path / "ckpt.pt")
    fresh = make_state(fp16(level))
    fresh.precision.load_state_dict(safe_load(tmp_path / "ckpt.pt")["precision"])
    assert fresh.precision.metrics() == state.precision.metrics()
    assert fresh.precision.state_dict()["scaler"] == state.precision.state_dict()["scaler"]
    if level == "master":
        for (_, a), (p, b) in zip(state.precision.pairs, fresh.precision.pairs):
            assert torch.equal(a, b) and torch.equal(p, b.to(p.dtype))
    # both continue identically: same scale trajectory and skip count
    for s in (state, fresh):
        run(s, tiny_batches(5, seed=3), PoisonedLoss({1}))
    assert fresh.precision.metrics() == state.precision.metrics()


# --- O0 stays the plain loop -------------------------------------------------------------------------------

def test_fp32_is_bit_identical_to_a_plain_loop():
    recipe = Recipe(grad_clip=1.0)
    batches = tiny_batches(5)
    state = make_state(recipe)
    run(state, batches, nn.functional.cross_entropy)

    seed_everything(recipe.seed)
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    for x, y in batches:
        opt.zero_grad(set_to_none=False)
        nn.functional.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    for a, b in zip(state.model.parameters(), model.parameters()):
        assert torch.equal(a, b)


# --- half models run forward in half, hand the loss fp32 ----------------------------------------------------

@pytest.mark.parametrize("level", ["master", "pure"])
def test_half_model_casts_inputs_in_and_outputs_out(level):
    state = make_state(Recipe(precision="bf16", precision_level=level))
    seen = []
    state.model[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    out = state.model(torch.randn(3, 8))
    assert seen == [torch.bfloat16] and out.dtype == torch.float32
    assert state.model[0].weight.dtype == torch.bfloat16
    assert state.model[1].weight.dtype == (torch.float32 if level == "master" else torch.bfloat16)
    clone = copy.deepcopy(state.model)                            # hooks survive the FLOP counter's deepcopy
    assert clone(torch.randn(2, 8)).dtype == torch.float32


# --- recipe and ladder wiring ------------------------------------------------------------------------------

def test_recipe_validates_precision_level():
    with pytest.raises(RecipeError, match="precision_level='master' needs precision=bf16 or fp16"):
        Recipe(precision_level="master")
    with pytest.raises(RecipeError, match="precision_level='O2' is not one of"):
        Recipe(precision="bf16", precision_level="O2")
    assert Recipe(precision="bf16", precision_level="pure").precision_level == "pure"


def test_level_rungs_plan_and_labels():
    rungs = plan_rungs(Recipe(), ["fp32", "autocast-bf16", "master-bf16", "pure-bf16"], device=CPU)
    assert [r.name for r in rungs] == ["baseline", "autocast-bf16", "master-bf16", "pure-bf16"]
    assert [(r.recipe.precision, r.recipe.precision_level) for r in rungs] == [
        ("fp32", "autocast"), ("bf16", "autocast"), ("bf16", "master"), ("bf16", "pure")]
    assert [rung_label(r) for r in rungs] == ["baseline (fp32)", "autocast-bf16 (O1)", "master-bf16 (O2)",
                                               "pure-bf16 (O3)"]
    assert level_note(rungs[3].recipe) and "risky" in level_note(rungs[3].recipe)
    assert level_note(rungs[2].recipe) is None
    # an ablation that starts from a bf16 recipe says so: its baseline is not fp32
    assert rung_label(plan_rungs(Recipe(precision="bf16"), ["channels_last"], device=CPU)[0]) == "baseline (bf16)"
    # fp16 O3 with AdamW names the concrete hazard (test_pure_fp16_adamw_is_the_known_hazard shows it happen)
    assert "divides by zero" in level_note(Recipe(precision="fp16", precision_level="pure"))
    assert "divides by zero" not in level_note(Recipe(precision="fp16", precision_level="pure", optimizer="sgd"))
    # a level rung followed by a ladder rung keeps the level (cumulative)
    mixed = plan_rungs(Recipe(), ["set_to_none", "master-fp16"], device=CPU)
    assert [r.name for r in mixed] == ["baseline", "master-fp16", "set_to_none"]
    assert mixed[-1].recipe.precision_level == "master" and mixed[-1].recipe.set_to_none


def test_default_ladder_is_unchanged():
    assert [r.name for r in plan_rungs(Recipe(), None, device=CPU)] == list(LADDER) == [
        "baseline", "amp", "set_to_none", "non_blocking", "prefetch", "channels_last", "compile", "fused"]
    with pytest.raises(RecipeError, match="unknown rung"):
        plan_rungs(Recipe(), ["master-fp8"], device=CPU)


# --- accuracy on the real data (fast guard; benchmarks/precision_parity.py is the multi-seed measurement) -----

@pytest.fixture(scope="module")
def fp32_digits(digits16):
    from conftest import tiny_resnet

    from trainfast import train

    return train(tiny_resnet, digits16, recipe=Recipe(epochs=2, batch_size=64, log_every=5), device="cpu")


@pytest.mark.parametrize("precision,level", [("bf16", "master"), ("bf16", "pure")])
def test_half_weight_levels_train_the_real_data_like_fp32(digits16, fp32_digits, precision, level):
    from conftest import tiny_resnet
    from test_parity import BF16_MEAN_ABS_GAP

    from trainfast import train
    from trainfast.ablation.scoring import metric_band

    recipe = Recipe(epochs=2, batch_size=64, log_every=5, precision=precision, precision_level=level)
    half = train(tiny_resnet, digits16, recipe=recipe, device="cpu")
    curves = [[x for r in run.history for x in r["train_losses"]] for run in (fp32_digits, half)]
    gap = sum(abs(a - b) for a, b in zip(*curves)) / len(curves[0])
    ref, got = fp32_digits.history[-1]["val_accuracy"], half.history[-1]["val_accuracy"]
    band = metric_band(ref, half.history[-1].get("val_samples", len(digits16.val)))
    assert gap < 2 * BF16_MEAN_ABS_GAP, f"mean |loss_{level} - loss_fp32| = {gap:.4f}"
    assert abs(got - ref) <= band, (got, ref, band)
    assert curves[0] != curves[1]


def compiled_and_eager_master_runs(model_fn, split, epochs: int):
    from trainfast import train

    recipe = Recipe(epochs=epochs, batch_size=64, log_every=5, precision="bf16", precision_level="master")
    return [train(model_fn, split, recipe=recipe.replace(compile=c), device="cpu") for c in (False, True)]


def test_compile_runs_on_the_master_weight_model_and_follows_eager_step_by_step(digits16):
    """torch.compile sees O2's half model with its fp32 batch norm and cast hooks: the compiled run trains
    (the last batch a smaller shape, the evaluation a graph of its own), and its loss curve stays with the
    eager O2 run's. The few-layer model keeps the compilation to seconds; the ResNet's trained accuracy is the
    slow test below."""
    import dataclasses

    from conftest import tiny_conv
    from test_parity import BF16_MEAN_ABS_GAP

    from trainfast.data.datasets import TensorImages

    # 6 steps of 64 and a partial evaluation batch: the compilation, not the data, is what this test costs
    train_set, val_set = digits16.train, digits16.val
    few = dataclasses.replace(digits16, train=TensorImages(train_set.images[:384], train_set.labels[:384]),
                              val=TensorImages(val_set.images[:100], val_set.labels[:100]))
    eager, compiled = compiled_and_eager_master_runs(tiny_conv, few, epochs=1)
    curves = [[x for r in run.history for x in r["train_losses"]] for run in (eager, compiled)]
    assert len(curves[0]) == len(curves[1]) == 6
    gap = sum(abs(a - b) for a, b in zip(*curves)) / len(curves[0])
    assert gap < 2 * BF16_MEAN_ABS_GAP, f"mean |loss_compiled - loss_eager| = {gap:.4f}"
    assert all(math.isfinite(x) for x in curves[1])


@pytest.mark.slow
def test_compile_runs_on_the_master_weight_model_and_matches_eager(digits16):
    """torch.compile sees O2's half model with its fp32 norms and cast hooks: the compiled run trains, and
    its loss curve stays with the eager O2 run's (kernels fuse differently, so not bit for bit)."""
    from conftest import tiny_resnet
    from test_parity import BF16_MEAN_ABS_GAP

    from trainfast.ablation.scoring import metric_band

    eager, compiled = compiled_and_eager_master_runs(tiny_resnet, digits16, epochs=2)
    curves = [[x for r in run.history for x in r["train_losses"]] for run in (eager, compiled)]
    gap = sum(abs(a - b) for a, b in zip(*curves)) / len(curves[0])
    assert gap < 2 * BF16_MEAN_ABS_GAP, f"mean |loss_compiled - loss_eager| = {gap:.4f}"
    ref, got = eager.history[-1]["val_accuracy"], compiled.history[-1]["val_accuracy"]
    assert abs(got - ref) <= metric_band(ref, len(digits16.val)), (got, ref)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_master_norms_run_in_one_dtype_as_cuda_kernels_need(dtype, monkeypatch):
    """CUDA's LayerNorm and GroupNorm kernels refuse a half input with fp32 weights (the CPU's accept it): O2
    keeps those norms fp32, so their input is cast up and their output back down. The CUDA rule is emulated on
    the CPU by refusing mixed dtypes in the functional norms."""
    half = torch.bfloat16 if dtype == "bf16" else torch.float16
    seen = []

    def one_dtype(real):
        def norm(x, *args, **kwargs):
            w = kwargs.get("weight", next((a for a in args if isinstance(a, torch.Tensor)), None))
            if w is not None and w.dtype != x.dtype:
                raise RuntimeError(f"expected scalar type {w.dtype} but found {x.dtype}")
            seen.append(x.dtype)
            return real(x, *args, **kwargs)
        return norm

    monkeypatch.setattr(nn.functional, "layer_norm", one_dtype(nn.functional.layer_norm))
    monkeypatch.setattr(nn.functional, "group_norm", one_dtype(nn.functional.group_norm))

    def model():
        return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Unflatten(1, (4, 4)), nn.GroupNorm(2, 4),
                             nn.Flatten(), nn.ReLU(), nn.Linear(16, 4))

    state = make_state(Recipe(precision=dtype, precision_level="master"), model_fn=model)
    outputs = []
    state.model[3].register_forward_hook(lambda _m, _args, out: outputs.append(out.dtype))
    losses = run(state, tiny_batches(4), PoisonedLoss()).losses
    assert seen and set(seen) == {torch.float32}                  # both norms ran in fp32
    assert outputs and set(outputs) == {half}                     # and handed half on to the next layer
    assert state.model[1].weight.dtype == state.model[3].weight.dtype == torch.float32
    assert state.model[0].weight.dtype == half
    assert all(math.isfinite(x) for x in losses)
