"""The chunked_loss switch: the next-token loss over chunks of rows is the model's own loss, with the same
gradients, keeps less for backward, and the built-in language-model run trains the same with it."""
import pytest
import torch
from conftest import saved_bytes
from torch import nn

from trainfast import Recipe, train
from trainfast import techniques
from trainfast.tasks import build_task
from trainfast.techniques import chunked_loss
from trainfast.techniques.chunked_loss import chunked_causal_lm_loss, final_hidden_states
from trainfast.text.batching import IGNORE, PackCollate, PadCollate, TextSplit, TokenDocs
from trainfast.text.models import build_lm

pytest.importorskip("transformers")
VOCAB, PAD, EOS, MAX = 96, 0, 1, 48
# Stated tolerances (fp32): the loss within a relative 1e-5 of the model's own, every parameter's gradient within
# rtol 1e-4 / atol 1e-6 (the chunks sum the same terms in another order).
LOSS_RTOL, GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-4, 1e-6


def random_docs(count: int, seed: int, vocab: int = VOCAB, low: int = 3, high: int = MAX) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=g).tolist()
    return [torch.randint(2, vocab, (n,), generator=g) for n in lengths]


def tiny_lm(name: str, vocab: int = VOCAB):
    torch.manual_seed(0)
    return build_lm(name, vocab, MAX, PAD, EOS).eval()      # eval: no dropout, so both losses see one network


def gradients(model: nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def batch(kind: str):
    docs = random_docs(6, seed=4)
    return (PadCollate(PAD) if kind == "padded" else PackCollate(PAD))(docs)


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_the_chunked_loss_and_its_gradients_are_the_models_own(name, kind):
    model = tiny_lm(name)
    inputs, labels = batch(kind)
    if kind == "packed":
        assert "position_ids" in inputs and (labels == IGNORE).any()
    own = model(**inputs, labels=labels).loss
    expected = gradients(model, own)
    head = model.get_output_embeddings()
    # 7 rows a chunk: many chunks, the last one short
    chunked = chunked_causal_lm_loss(final_hidden_states(model, inputs), head.weight, labels, chunk_tokens=7,
                                     head_bias=head.bias)
    got = gradients(model, chunked)
    assert chunked.item() == pytest.approx(own.item(), rel=LOSS_RTOL)
    assert set(got) == set(expected) and len(got) == len(list(model.parameters()))
    for key, grad in expected.items():
        assert torch.allclose(got[key], grad, rtol=GRAD_RTOL, atol=GRAD_ATOL), (name, kind, key)
    # the task's step with the switch on computes the same loss (one chunk at this size)
    _, step_loss = build_task("lm", recipe=Recipe(chunked_loss=True)).forward(model, inputs, labels)
    assert step_loss.item() == pytest.approx(own.item(), rel=LOSS_RTOL)


def test_the_normalisation_is_transformers_own():
    g = torch.Generator().manual_seed(2)
    hidden, weight, bias = (torch.randn(3, 10, 8, generator=g), torch.randn(20, 8, generator=g),
                            torch.randn(20, generator=g))
    labels = torch.randint(0, 20, (3, 10), generator=g)
    labels[0, 4:] = IGNORE
    logits = (hidden @ weight.T + bias)[:, :-1].flatten(0, 1)
    targets = labels[:, 1:].flatten()
    full = nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
    got = chunked_causal_lm_loss(hidden, weight, labels, chunk_tokens=4, head_bias=bias)
    assert got.item() == pytest.approx(full.item() / (targets != IGNORE).sum().item(), rel=LOSS_RTOL)
    per_items = chunked_causal_lm_loss(hidden, weight, labels, chunk_tokens=4, head_bias=bias, num_items_in_batch=50)
    assert per_items.item() == pytest.approx(full.item() / 50, rel=LOSS_RTOL)
    with torch.inference_mode():               # evaluation: no graph, the same number
        assert chunked_causal_lm_loss(hidden, weight, labels, 4, head_bias=bias).item() == pytest.approx(got.item())


def test_the_chunked_loss_keeps_less_for_backward():
    vocab = 16384           # 128 wide, 4 layers: the logits outweigh the activations, as in a small real LM
    model = tiny_lm("llama-tiny", vocab)
    inputs, labels = PadCollate(PAD)(random_docs(8, seed=6, vocab=vocab, low=MAX, high=MAX))
    head = model.get_output_embeddings()
    full = saved_bytes(model, lambda: model(**inputs, labels=labels).loss)
    chunked = saved_bytes(model, lambda: chunked_causal_lm_loss(final_hidden_states(model, inputs), head.weight,
                                                                labels, chunk_tokens=64))
    logits = labels.numel() * vocab * 4
    print(f"saved for backward: full {full} B, chunked {chunked} B, ratio {chunked / full:.3f}")
    # the whole batch's fp32 logits are no longer kept (less the loss's running sum, a scalar), the rest is as it was
    assert full - chunked >= logits - 4 * 16
    assert chunked < 0.5 * full


def test_the_switch_is_declared_for_language_models_only():
    assert techniques.rung_table("lm")["chunked_loss"] == {"chunked_loss": True}
    assert "chunked_loss" not in techniques.rung_table("classification")
    assert "chunked_loss" not in techniques.default_ladder("lm")          # a memory switch: named with --switches
    lm_rungs = list(techniques.rung_table("lm"))
    assert lm_rungs.index("chunked_loss") > lm_rungs.index("flash")
    switch = techniques.owner("chunked_loss")
    assert all("inside its model's forward" in switch.reason_unreachable(a) for a in techniques.ADAPTERS)
    assert not switch.model_effect(nn.Linear(2, 2)).acts and switch.model_effect(tiny_lm("gpt2-tiny")).acts


def test_the_lm_task_takes_its_loss_from_the_loss_switch_declaration(monkeypatch):
    """The task's loss is the declared LossSwitch's where the recipe turns it on; two loss switches at once, or one
    with a switch it excludes, are refused (a task has one loss)."""
    from dataclasses import replace

    from trainfast.recipe import RecipeError
    from trainfast.techniques.switch import LossSwitch, Switch

    switch = techniques.owner("chunked_loss")
    assert build_task("lm", recipe=Recipe(chunked_loss=True)).loss is switch.loss.loss
    assert build_task("lm", recipe=Recipe()).loss is not switch.loss.loss
    assert techniques.task_loss(Recipe(chunked_loss=True), "classification") is None
    assert "computes its loss" in techniques.unreached_losses(Recipe(chunked_loss=True))["chunked_loss"]
    other = Switch(("compile",), loss=LossSwitch("lm", switch.loss.loss, switch.loss.loss_sum, "its own"))
    monkeypatch.setattr(techniques, "loss_switches", lambda: (("chunked_loss", switch), ("compile", other)))
    with pytest.raises(RecipeError, match="chunked_loss and compile each replace the task's loss"):
        build_task("lm", recipe=Recipe(chunked_loss=True, compile=True))
    excluding = replace(switch, loss=replace(switch.loss, excludes={"compile": "it traces the full logits"}))
    monkeypatch.setattr(techniques, "loss_switches", lambda: (("chunked_loss", excluding),))
    with pytest.raises(RecipeError, match="chunked_loss cannot be combined with compile: it traces the full logits"):
        build_task("lm", recipe=Recipe(chunked_loss=True, compile=True))
    assert build_task("lm", recipe=Recipe(chunked_loss=True)).loss is switch.loss.loss


def test_the_builtin_run_trains_the_same_with_the_loss_in_chunks(monkeypatch):
    """Per-step training losses and the validation loss within 1e-4 of the full loss's, over an epoch of AdamW,
    with a chunk size that cuts every batch into several chunks."""
    monkeypatch.setattr(chunked_loss, "CHUNK_TOKENS", 50)
    docs = random_docs(64, seed=0)
    split = TextSplit(TokenDocs(docs[:48], MAX), TokenDocs(docs[48:], MAX), VOCAB, PAD, EOS, "random documents", MAX)
    recipe = Recipe(epochs=1, batch_size=8, lr=1e-3, log_every=2)
    full = train("llama-tiny", split, recipe=recipe, device="cpu", task="lm")
    chunked = train("llama-tiny", split, recipe=recipe.replace(chunked_loss=True), device="cpu", task="lm")
    a = [x for r in full.history for x in r["train_losses"]]
    b = [x for r in chunked.history for x in r["train_losses"]]
    assert len(a) == len(b) == 6 and max(abs(x - y) for x, y in zip(a, b)) < 1e-4
    assert chunked.history[-1]["val_loss"] == pytest.approx(full.history[-1]["val_loss"], abs=1e-4)


def test_under_bf16_autocast_the_loss_is_the_models_own():
    """The chunk's product runs in bf16 as the model's own output layer does, its softmax in fp32: the same loss
    within bf16's rounding (2e-3 relative)."""
    model = tiny_lm("llama-tiny")
    inputs, labels = batch("packed")
    with torch.autocast("cpu", torch.bfloat16):
        own = model(**inputs, labels=labels).loss
        _, chunked = build_task("lm", recipe=Recipe(chunked_loss=True)).forward(model, inputs, labels)
    assert chunked.dtype == torch.float32 and chunked.item() == pytest.approx(own.item(), rel=2e-3)
