"""trainfast.Session: a user's own loop adopted in three lines trains like the plain loop (bit for bit in fp32)
and like the built-in `trainfast.train` with the same recipe; what it refuses, records and saves. CPU, tiny
models, the real digits at 16 px."""
from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
from conftest import tiny_resnet
from test_parity import plain_loop
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from trainfast import Recipe, RecipeError, Session, train
from trainfast.checkpoint import read_checkpoint
from trainfast.data.datasets import HostNormalized, Split, TensorImages
from trainfast.recipe import RECIPE_ENV
from trainfast.session import BackwardOutsideSession, SessionModule
from trainfast.techniques import compile as compile_

CPU = torch.device("cpu")


def test_fp32_session_loop_is_bit_identical_to_the_plain_loop(digits16):
    recipe = Recipe(epochs=1, batch_size=64)
    reference, reference_losses = plain_loop(digits16, recipe)
    model, losses = plain_loop(digits16, recipe, adopt=True)
    assert len(losses) == len(digits16.train) // 64
    assert losses == reference_losses
    ours = model.state_dict()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, ours[name]), f"{name} differs from the plain loop"


@pytest.fixture(scope="module")
def digits_few(digits16) -> Split:
    """The first 256 training digits (4 steps of 64) and 128 to validate on: identity of two loops shows on any
    number of steps, and fp16 computes slowly on a CPU."""
    train_set, val_set = digits16.train, digits16.val
    return dataclasses.replace(digits16, train=TensorImages(train_set.images[:256], train_set.labels[:256]),
                               val=TensorImages(val_set.images[:128], val_set.labels[:128]))


@pytest.fixture(scope="module")
def fp32_losses(digits_few) -> list[float]:
    return plain_loop(digits_few, Recipe(epochs=1, batch_size=64))[1]


@pytest.mark.parametrize("precision,level", [("bf16", "autocast"), ("bf16", "master"), ("fp16", "autocast"),
                                             ("fp16", "master")])
def test_mixed_precision_session_loop_trains_like_the_builtin_loop(digits_few, fp32_losses, precision, level):
    """The same code path as trainfast.train (the built-in loop is a Session loop), the same data order and
    initial weights, so the per-step losses are identical, not merely close: the user's loss is computed
    outside autocast on the fp32 outputs the Session hands it, which is what autocast's fp32 cross-entropy
    computes inside it. (The user's loop normalizes in its dataset; trainfast.train in its loader.)"""
    recipe = Recipe(epochs=1, batch_size=64, log_every=4, precision=precision, precision_level=level)
    builtin = train(tiny_resnet, digits_few, recipe=recipe, device="cpu")
    builtin_losses = [x for record in builtin.history for x in record["train_losses"]]
    assert len(builtin_losses) == 256 // 64
    model, losses = plain_loop(digits_few, recipe, adopt=True)
    assert losses == builtin_losses
    assert model.train_state.precision.metrics() == builtin.state.precision.metrics()
    for name, tensor in builtin.model.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    assert not all(math.isclose(a, b) for a, b in zip(losses, fp32_losses)), \
        "no difference from fp32: the precision was not applied"


def tiny_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))


def tiny_data(n: int = 40, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g))


def xy(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 8), torch.randint(0, 4, (n,))


@pytest.mark.parametrize("level", ["autocast", "master"])
def test_loss_backward_under_fp16_is_refused_with_the_message(level):
    tf = Session(Recipe(precision="fp16", precision_level=level, optimizer="sgd"), device="cpu")
    model = tiny_mlp()
    model, optimizer = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    x, y = xy()
    with pytest.raises(BackwardOutsideSession, match=r"fp16 loss scaling.*Call tf\.backward\(loss\) instead"):
        nn.functional.cross_entropy(model(x), y).backward()
    assert all(p.grad is None for p in model.parameters())          # refused before any gradient landed
    with pytest.raises(BackwardOutsideSession, match="tf.backward"):   # and the step would not take it either
        optimizer.step()
    tf.backward(nn.functional.cross_entropy(model(x), y))            # the Session's way trains
    optimizer.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_plain_backward_is_refused_where_accumulation_needs_tf_backward_and_allowed_in_fp32():
    tf = Session(Recipe(grad_accum_steps=2), device="cpu")
    model = tiny_mlp()
    model, optimizer = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    nn.functional.cross_entropy(model(*xy()[:1]), xy()[1]).backward()
    with pytest.raises(BackwardOutsideSession, match="grad_accum_steps=2"):
        optimizer.step()
    tf = Session(Recipe(), device="cpu")                              # fp32: loss.backward() stays a choice
    model = tiny_mlp()
    model, optimizer = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    nn.functional.cross_entropy(model(xy()[0]), xy()[1]).backward()
    optimizer.step()
    assert tf.state.step == 1 and any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_original_optimizer_is_refused_where_it_would_not_train():
    """O2: the optimizer now steps fp32 masters fed by the Session; stepping the user's old reference directly
    would update nothing (or wrongly), so it says which object to step."""
    tf = Session(Recipe(precision="bf16", precision_level="master"), device="cpu")
    model = tiny_mlp()
    original = torch.optim.SGD(model.parameters(), lr=0.1)
    _, optimizer = tf.setup(model, original)
    assert all(p.dtype == torch.float32 for p in original.param_groups[0]["params"])   # remapped onto the masters
    assert [id(p) for p in original.param_groups[0]["params"]] == [id(m) for _, m in tf.state.precision.pairs]
    with pytest.raises(BackwardOutsideSession, match="step the optimizer that setup"):
        original.step()


def test_env_recipe_wins_over_the_script_and_is_recorded(monkeypatch, tmp_path):
    monkeypatch.setenv(RECIPE_ENV, '{"precision": "bf16", "set_to_none": true, "lr": 0.1}')
    tf = Session(Recipe(lr=0.1, seed=3), device="cpu")
    assert (tf.recipe.precision, tf.recipe.set_to_none, tf.recipe.lr, tf.recipe.seed) == ("bf16", True, 0.1, 3)
    assert tf.overridden == {"precision": ("fp32", "bf16"), "set_to_none": (False, True)}   # lr: same value
    assert tf.precision.name == "bf16"
    path = tmp_path / "rung.yaml"
    path.write_text("precision: bf16\nprecision_level: master\n")
    monkeypatch.setenv(RECIPE_ENV, str(path))
    tf = Session(Recipe(precision="fp16"), device="cpu")
    assert tf.overridden == {"precision": ("fp16", "bf16"), "precision_level": ("autocast", "master")}
    assert tf.precision.level == "O2"
    # The built-in loop reads it too: it is a Session.
    from dist_common import make_model, make_split

    result = train(make_model(), make_split(n=64), recipe=Recipe(batch_size=16), device="cpu")
    assert result.state.recipe.precision == "bf16" and result.state.precision.level == "O2"


@pytest.mark.parametrize("value,message", [
    ('{"precision": "bf16",', "inline value is not valid JSON"),
    ('{"precison": "bf16"}', r"unknown key\(s\) precison"),
    ('{"precision": "fp8"}', "precision='fp8' is not one of"),
    ("/no/such/recipe.yaml", "does not exist"),
    ("[1, 2]", "expected a mapping"),
])
def test_bad_env_recipe_is_a_recipe_error_naming_the_variable(monkeypatch, tmp_path, value, message):
    # raised by Session() itself, so a script's first trainfast line (examples/adopted_loop.py's) ends with it
    if value.startswith("["):
        (tmp_path / "list.yaml").write_text(value)
        value = str(tmp_path / "list.yaml")
    monkeypatch.setenv(RECIPE_ENV, value)
    with pytest.raises(RecipeError, match=f"^{RECIPE_ENV}: .*{message}"):
        Session(device="cpu")


def test_a_loss_dict_trains_and_logs_each_term():
    recipe = Recipe(log_every=4)
    data = tiny_data(64)

    def run(session: bool):
        tf = Session(recipe, device="cpu") if session else None
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = DataLoader(data, batch_size=8)
        if session:
            model, optimizer, loader = tf.setup(model, optimizer, loader)
        terms = []
        for x, y in loader:
            optimizer.zero_grad()
            losses = {"ce": nn.functional.cross_entropy(model(x), y),
                      "l2": 1e-2 * sum(p.pow(2).sum() for p in model.parameters())}
            if session:
                tf.backward(losses)
            else:
                (losses["ce"] + losses["l2"]).backward()
            optimizer.step()
            terms.append({k: v.item() for k, v in losses.items()})
        return model, terms, tf

    reference, _, _ = run(session=False)
    model, terms, tf = run(session=True)
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))
    assert len(tf.logged) == 1                     # 8 steps, log_every=4: the 5th value of a key reads the first 4
    tf.flush_logs()                                # the last window, read on request
    assert [r["step"] for r in tf.logged] == [4, 8]
    for window, record in zip((terms[:4], terms[4:]), tf.logged):
        for name in ("ce", "l2"):
            assert record[name] == pytest.approx(sum(t[name] for t in window) / 4, rel=1e-6)
        assert record["loss"] == pytest.approx(record["ce"] + record["l2"], rel=1e-6)
    tf.report(val_accuracy=torch.tensor(0.75), note="tiny")
    assert tf.reported == {"val_accuracy": 0.75, "note": "tiny"}
    with pytest.raises(ValueError, match="term named 'loss'"):
        tf.backward({"loss": torch.ones((), requires_grad=True)})


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_scheduler_stays_bound_after_the_optimizer_is_rebuilt(impl):
    data = tiny_data(48)

    def run(session: bool):
        tf = Session(Recipe(optimizer_impl=impl), device="cpu") if session else None
        torch.manual_seed(0)
        model = tiny_mlp().eval()              # no dropout: compare the update rule alone
        flags = {} if session else {impl: True}
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, **flags)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        loader = DataLoader(data, batch_size=8)
        if session:
            original = optimizer
            model, optimizer, loader, scheduler = tf.setup(model, optimizer, loader, scheduler=scheduler)
            assert optimizer.optimizer is not original and optimizer.param_groups[0][impl] is True
            assert scheduler.scheduler.optimizer is optimizer.optimizer     # rebound to the rebuilt one
        lrs = []
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            tf.backward(loss) if session else loss.backward()
            optimizer.step()
            scheduler.step()
            lrs.append(optimizer.param_groups[0]["lr"])
        return model, lrs

    reference, reference_lrs = run(session=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)      # no "optimizer.step() has been overridden" warning
        model, lrs = run(session=True)
    assert lrs == reference_lrs == [0.01, 0.005, 0.005, 0.0025, 0.0025, 0.00125]
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.body(x))


def test_the_wrapper_leaves_the_users_module_alone():
    tf = Session(device="cpu")
    net = SmallConvNet()
    model, _ = tf.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert isinstance(model, SessionModule) and model.module is net and type(net) is SmallConvNet
    assert "forward" not in vars(net) and net.forward.__func__ is SmallConvNet.forward
    assert not net._forward_hooks and not net._forward_pre_hooks
    assert model.head is net.head                                  # attributes come from the user's module
    assert list(model.state_dict()) == list(net.state_dict())      # and its own keys, no "module." prefix
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(model(x), net(x))


def test_channels_last_and_compile_on_a_conv_net(tmp_path):
    if not compile_.effect(CPU).acts:
        pytest.skip(compile_.effect(CPU).reason)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 3, 8, 8, generator=g), torch.randint(0, 4, (64,), generator=g))

    def run(recipe: Recipe | None):
        tf = Session(recipe, device="cpu") if recipe else None
        torch.manual_seed(0)
        net = SmallConvNet()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        model, loader = net, DataLoader(data, batch_size=16)
        if recipe:
            model, optimizer, loader = tf.setup(net, optimizer, loader)
        losses = []
        for _ in range(2):
            for x, y in loader:
                if recipe:
                    assert x.is_contiguous(memory_format=torch.channels_last)   # the batch arrives NHWC
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                tf.backward(loss) if recipe else loss.backward()
                optimizer.step()
                losses.append(loss.item())
        return net, losses, tf

    _, eager, _ = run(None)
    net, compiled, tf = run(Recipe(channels_last=True, compile=True))
    assert net.body[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert type(tf.state.forward.trained).__name__ == "OptimizedModule"
    assert max(abs(a - b) for a, b in zip(eager, compiled)) < 1e-4, (eager, compiled)   # fused kernels round apart
    tf.save(tmp_path / "ckpt")
    keys = set(read_checkpoint(tmp_path / "ckpt")["model"])
    assert keys == set(net.state_dict()) and not any(k.startswith(("_orig_mod.", "module.")) for k in keys)


def test_save_and_load_round_trip_continues_bit_exactly(tmp_path):
    """fp16 O2 (masters and a loss scaler in the state), a scheduler, dropout (RNG state): a Session restored
    from tf.save continues exactly like the one that kept going."""
    recipe = Recipe(precision="fp16", precision_level="master", optimizer="sgd")
    data = tiny_data(96)

    def start():
        tf = Session(recipe, device="cpu")
        model = tiny_mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        loader = DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
        return tf, *tf.setup(model, optimizer, loader, scheduler=scheduler)

    def steps(parts, n):
        tf, model, optimizer, loader, scheduler = parts
        for i, (x, y) in enumerate(loader):
            if i == n:
                break
            optimizer.zero_grad()
            tf.backward(nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            scheduler.step()

    first = start()
    steps(first, 4)
    first[0].save(tmp_path / "session.ckpt")
    payload = read_checkpoint(tmp_path / "session.ckpt")           # weights_only=True inside
    assert set(payload["model"]) == set(first[1].module.state_dict())
    assert payload["step"] == 4 and len(payload["precision"]["masters"]) == 4
    steps(first, 5)

    second = start()
    second[0].load(tmp_path / "session.ckpt")
    assert second[0].state.step == 4 and second[4].last_epoch == 4
    steps(second, 5)
    for a, b in zip(first[1].module.parameters(), second[1].module.parameters()):
        assert torch.equal(a, b)
    assert first[0].state.precision.state_dict()["scaler"] == second[0].state.precision.state_dict()["scaler"]
    assert first[2].state_dict()["state"].keys() == second[2].state_dict()["state"].keys()


def test_gradient_accumulation_in_a_users_loop_matches_the_big_batch_and_ends_with_the_epoch():
    """5 micro-batches of 8 per epoch, accumulation 2: updates after batches 2, 4 and a short one after 5 (its
    gradient still divided by 2); the scheduler steps per update. Checked against a plain loop doing that."""
    data = tiny_data(40)

    def run(session: bool):
        tf = Session(Recipe(grad_accum_steps=2), device="cpu") if session else None
        torch.manual_seed(0)
        model = tiny_mlp().eval()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        loader = DataLoader(data, batch_size=8)
        if session:
            model, optimizer, loader, scheduler = tf.setup(model, optimizer, loader, scheduler=scheduler)
        for _ in range(2):
            for i, (x, y) in enumerate(loader, start=1):
                loss = nn.functional.cross_entropy(model(x), y)
                if session:                    # the user's loop: step and zero every batch
                    optimizer.zero_grad()
                    tf.backward(loss)
                    optimizer.step()
                    scheduler.step()
                else:                          # what that must amount to
                    (loss / 2).backward()
                    if i % 2 == 0 or i == len(loader):
                        optimizer.step()
                        scheduler.step()
                        optimizer.zero_grad()
        return model, scheduler, tf

    reference, reference_scheduler, _ = run(session=False)
    model, scheduler, tf = run(session=True)
    assert tf.state.step == 6 and scheduler.last_epoch == reference_scheduler.last_epoch == 6
    for a, b in zip(reference.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


class Detection(Dataset):
    """uint8 images with dict targets, as detection datasets give them."""

    def __init__(self, n: int = 12) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, 8, 8), generator=g, dtype=torch.uint8)
        self.labels = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], {"label": self.labels[i], "box": torch.tensor([0.0, 0.0, 1.0, 1.0])}


@pytest.mark.parametrize("prefetch", [False, True])
def test_any_batch_structure_arrives_prepared(prefetch):
    """(uint8 images, dict of targets) with mean/std: host normalization without prefetch, uint8 transport and
    normalization on the device with it; the same numbers either way, and channels_last inputs."""
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    tf = Session(Recipe(prefetch=prefetch, set_to_none=True, channels_last=True), device="cpu")
    net = SmallConvNet()
    _, optimizer, loader = tf.setup(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                    DataLoader(Detection(), batch_size=4), mean=mean, std=std)
    batches = list(loader)
    assert len(batches) == 3 and len(loader) == 3
    reference = HostNormalized(Detection(), mean, std)
    for k, (images, targets) in enumerate(batches):
        assert images.dtype == torch.float32 and images.is_contiguous(memory_format=torch.channels_last)
        expected = torch.stack([reference[4 * k + i][0] for i in range(4)])
        torch.testing.assert_close(images, expected, atol=1e-6, rtol=0)
        assert set(targets) == {"label", "box"} and targets["box"].shape == (4, 4)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    optimizer.zero_grad(set_to_none=False)          # recipe.set_to_none=True wins over the caller's False
    assert all(p.grad is None for p in net.parameters())


def test_a_users_loader_is_kept_unless_the_run_needs_a_change():
    from trainfast.data.adopt import loader_changes
    from trainfast.distributed import Dist

    loader = DataLoader(tiny_data(), batch_size=8, shuffle=True)
    one_process = Dist(CPU)
    assert loader_changes(loader, Recipe(), CPU, one_process, None, None) == {}     # the same object: same order
    assert loader_changes(loader, Recipe(prefetch=True), CPU, one_process, None, None) == {}
    cuda = torch.device("cuda")                      # a device object: no GPU needed to decide
    changes = loader_changes(loader, Recipe(prefetch=True), cuda, one_process, None, None)
    assert changes["pin_memory"] is True and set(changes) == {"pin_memory", "worker_init_fn"}
    # num_workers="auto": measured once, on the first loader, written into the recipe, used by every loader
    tf = Session(Recipe(num_workers="auto"), device="cpu")
    model = tiny_mlp()
    _, _, train_loader, val_loader = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), loader,
                                              DataLoader(tiny_data(16), batch_size=8))
    workers = tf.recipe.num_workers
    assert isinstance(workers, int) and train_loader.num_workers == val_loader.num_workers == workers
    assert [len(x) for x, _ in train_loader] == [8] * 5 and len(list(val_loader)) == 2
