"""The language-model task: documents, batches (padded, packed, length-grouped), the built-in run against a plain
transformers loop, and what the switches say before any time is spent."""
import json
import random

import numpy as np
import pytest
import torch

from trainfast import Recipe, train
from trainfast.ablation.ladders import plan_rungs
from trainfast.ablation.work import mark_effects
from trainfast.data.datasets import DataError
from trainfast.measure.clock import batch_samples
from trainfast.recipe import RecipeError
from trainfast.results import Status
from trainfast.tasks import build_task, infer_task
from trainfast.tasks.effects import data_effect
from trainfast.techniques.switch import RunContext
from trainfast.techniques.transfer import map_tensors
from trainfast.text.batching import (IGNORE, PackCollate, PadCollate, TextSplit, TokenDocs, length_sampler,
                                     pack_rows, parse_text_spec)
from trainfast.text.corpus import folder_corpus, top_level_blocks
from trainfast.text.models import build_lm

pytest.importorskip("transformers")
VOCAB, PAD, EOS, MAX = 96, 0, 1, 48
CPU = torch.device("cpu")


def random_docs(count: int, seed: int = 0, low: int = 3, high: int = MAX) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=g).tolist()
    return [torch.randint(2, VOCAB, (n,), generator=g, dtype=torch.int32) for n in lengths]


def text_split(train_docs: int = 96, val_docs: int = 24) -> TextSplit:
    return TextSplit(TokenDocs(random_docs(train_docs), MAX), TokenDocs(random_docs(val_docs, seed=1), MAX), VOCAB,
                     PAD, EOS, "random documents", MAX)


def tiny_lm(name: str = "llama-tiny", attention: str | None = None):
    torch.manual_seed(0)
    model = build_lm(name, VOCAB, MAX, PAD, EOS).eval()
    if attention:
        model.set_attn_implementation(attention)
    return model


# --- padding-free is correct --------------------------------------------------------------------------------------
# Stated tolerance: a document's logits in a packed row equal its logits alone to 1e-4 (fp32; the sums run in
# another order), and the packed batch's loss equals the padded batch's to 1e-5.
LOGIT_TOL, LOSS_TOL = 1e-4, 1e-5


# flex compiles its kernel (about 15 s on 2 cores): slow. GPT-2 has no flex attention in transformers.
BACKENDS = [("llama-tiny", "eager"), ("llama-tiny", "sdpa"), ("gpt2-tiny", "eager"), ("gpt2-tiny", "sdpa"),
            pytest.param("llama-tiny", "flex_attention", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name,attention", BACKENDS)
@pytest.mark.parametrize("one_row", [False, True], ids=["bounded-rows", "one-row"])
def test_a_packed_document_computes_what_it_computes_alone(name, attention, one_row):
    model = tiny_lm(name, attention)
    docs = [d.long() for d in random_docs(7, seed=3, low=2, high=20)]
    inputs, labels = PackCollate(PAD, one_row=one_row)(docs)
    assert inputs.rate_count == sum(len(d) for d in docs) and inputs.documents == 7
    with torch.no_grad():
        packed = model(**inputs).logits
        ids, positions = inputs["input_ids"], inputs["position_ids"]
        for doc in docs:
            alone = model(input_ids=doc[None]).logits[0]
            row, start = locate(ids, positions, doc)
            assert torch.allclose(packed[row, start: start + len(doc)], alone, atol=LOGIT_TOL), (name, attention)
        # No attention across documents: changing every other document leaves the first one's logits as they were.
        first_row, first_start = locate(ids, positions, docs[0])
        changed = ids.clone()
        keep = torch.zeros_like(ids, dtype=torch.bool)
        keep[first_row, first_start: first_start + len(docs[0])] = True
        changed[~keep] = (changed[~keep] + 1) % VOCAB
        again = model(input_ids=changed, position_ids=positions).logits
        span = slice(first_start, first_start + len(docs[0]))
        assert torch.allclose(again[first_row, span], packed[first_row, span], atol=LOGIT_TOL)


def locate(ids: torch.Tensor, positions: torch.Tensor, doc: torch.Tensor) -> tuple[int, int]:
    """Where `doc` starts in the packed rows (a row position where positions restart and the ids match)."""
    for row in range(ids.shape[0]):
        for start in (positions[row] == 0).nonzero().flatten().tolist():
            if start + len(doc) <= ids.shape[1] and torch.equal(ids[row, start: start + len(doc)], doc):
                return row, start
    raise AssertionError("document not found in the packed rows")


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_the_packed_loss_is_the_padded_loss(attention):
    model = tiny_lm(attention=attention)
    docs = [d.long() for d in random_docs(16, seed=5)]
    padded, packed = PadCollate(PAD)(docs), PackCollate(PAD)(docs)
    with torch.no_grad():
        loss_padded = model(**padded[0], labels=padded[1]).loss
        loss_packed = model(**packed[0], labels=packed[1]).loss
    assert abs(loss_padded.item() - loss_packed.item()) < LOSS_TOL
    # the same predicted tokens: every document's first token is never a target
    assert (padded[1][:, 1:] != IGNORE).sum() == (packed[1][:, 1:] != IGNORE).sum()
    # packing bounded by the longest document computes fewer positions than padding did, never more
    assert packed[0].slots <= padded[0].slots and packed[0]["input_ids"].shape[1] == padded[0]["input_ids"].shape[1]


def test_rows_are_filled_first_fit_longest_first():
    assert pack_rows([5, 3, 7, 2], 7) == [[2], [0, 3], [1]]
    assert pack_rows([9, 2], 7) == [[0], [1]]                  # longer than the limit: a row of its own


# --- the built-in run ---------------------------------------------------------------------------------------------
def plain_transformers_loop(split: TextSplit, recipe: Recipe) -> tuple[torch.nn.Module, list[float]]:
    """What a user writes: seed, build the model from its config, AdamW, a shuffled DataLoader with a padding
    collator, model(**batch, labels=...).loss, backward, step."""
    random.seed(recipe.seed)
    np.random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    model = build_lm("llama-tiny", VOCAB, MAX, PAD, EOS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    loader = torch.utils.data.DataLoader(split.train, batch_size=recipe.batch_size, shuffle=True, drop_last=True,
                                         collate_fn=PadCollate(PAD),
                                         generator=torch.Generator().manual_seed(recipe.seed))
    losses = []
    model.train()
    for _ in range(recipe.epochs):
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = model(**inputs, labels=labels).loss
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return model, losses


def test_every_switch_off_is_bit_identical_to_a_plain_transformers_loop():
    split = text_split()
    recipe = Recipe(epochs=2, batch_size=8, lr=1e-3, weight_decay=0.01, log_every=4)
    reference, losses = plain_transformers_loop(split, recipe)
    result = train("llama-tiny", split, recipe=recipe, device="cpu", task="lm")
    ours = result.model.state_dict()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, ours[name]), f"{name} differs from the plain loop"
    assert [loss for r in result.history for loss in r["train_losses"]] == losses
    record = result.history[-1]
    assert record["val_loss"] > 0 and record["val_perplexity"] == pytest.approx(np.exp(record["val_loss"]))


def test_padding_free_trains_the_same_model_within_tolerance():
    """Packed batches hold the same documents per step: the loss curve is the padded one's up to summation order
    (per-step losses within 1e-4 over two epochs of AdamW)."""
    split = text_split()
    recipe = Recipe(epochs=2, batch_size=8, lr=1e-3, log_every=4)
    padded = train("llama-tiny", split, recipe=recipe, device="cpu", task="lm")
    packed = train("llama-tiny", split, recipe=recipe.replace(padding_free=True), device="cpu", task="lm")
    a = [x for r in padded.history for x in r["train_losses"]]
    b = [x for r in packed.history for x in r["train_losses"]]
    assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < 1e-4
    assert packed.history[-1]["train_tokens"] == padded.history[-1]["train_tokens"]   # real tokens, not padding


def test_the_rate_counts_real_tokens_and_model_outputs_keep_their_type():
    inputs, labels = PadCollate(PAD)([torch.arange(2, 7), torch.arange(2, 4)])
    assert batch_samples((inputs, labels)) == 7 and inputs.slots == 10 and inputs.padding_share == pytest.approx(0.3)
    moved = map_tensors(lambda t: t + 0, inputs)
    assert type(moved) is type(inputs) and moved.rate_count == 7
    output = tiny_lm()(input_ids=torch.arange(2, 7)[None])
    cast = map_tensors(lambda t: t.double(), output)
    assert type(cast) is type(output) and cast.logits.dtype == torch.float64


def test_length_grouping_draws_batches_of_similar_length():
    split = text_split(train_docs=400)
    recipe = Recipe(batch_size=8)
    sampler = length_sampler(split.train.lengths, recipe.batch_size, recipe.seed,
                             torch.Generator().manual_seed(0), None)
    order = list(sampler)
    assert sorted(order) == list(range(400))
    lengths = split.train.lengths

    def padding(indices):
        batches = [indices[i: i + 8] for i in range(0, len(indices) - 7, 8)]
        tokens = sum(sum(lengths[j] for j in b) for b in batches)
        return 1 - tokens / sum(8 * max(lengths[j] for j in b) for b in batches)
    assert padding(order) < 0.5 * padding(list(torch.randperm(400, generator=torch.Generator().manual_seed(0))))


# --- what the switches say before any time is spent --------------------------------------------------------------
def test_what_cannot_act_is_said_before_a_run_and_not_passed_down_the_ladder():
    split = text_split()
    model = build_lm("llama-tiny", VOCAB, MAX, PAD, EOS)
    plan = plan_rungs(Recipe(), ["padding_free", "sdpa", "flash", "fused"], device=CPU, task="lm")
    mark_effects(plan, RunContext(CPU, model, split))
    by_name = {r.name: r for r in plan}
    assert "already on" in by_name["sdpa"].reason and by_name["sdpa"].status == Status.NO_EFFECT
    assert "CUDA" in by_name["flash"].reason and by_name["flash"].status == Status.NO_EFFECT
    assert by_name["padding_free"].status != Status.NO_EFFECT
    # the rung below a ruled-out backend does not inherit it (it would fail on a backend that cannot run)
    assert by_name["fused"].recipe.attention == "model" and by_name["fused"].recipe.padding_free
    gpt2 = build_lm("gpt2-tiny", VOCAB, MAX, PAD, EOS)
    assert "no flex attention" in data_effect("attention", CPU, gpt2, split, "flex").reason
    image_like = type("Split", (), {"train": object()})()
    effect = data_effect("padding_free", CPU, None, image_like)
    assert not effect.acts and "documents of different lengths" in effect.reason
    even = TextSplit(TokenDocs([torch.arange(2, 10)] * 4, MAX), TokenDocs([torch.arange(2, 10)], MAX), VOCAB, PAD,
                     EOS, "even", MAX)
    assert "nothing to remove" in data_effect("group_by_length", CPU, None, even).reason


def test_the_task_refuses_what_cannot_work_and_is_inferred():
    task = build_task("lm")
    with pytest.raises(RecipeError, match="prefetch"):
        task.validate(Recipe(prefetch=True))
    assert "conv" in data_effect("channels_last", CPU, build_lm("llama-tiny", VOCAB, MAX, PAD, EOS), None).reason
    with pytest.raises(RecipeError, match="images"):
        task.load_data("stdlib", 32)
    assert infer_task(None, "gpt2-small") == "lm" and infer_task(None, None, text_split()) == "lm"
    with pytest.raises(ValueError, match="llama-tiny"):
        task.check_model("llama-tin")


def test_the_task_says_which_packages_are_missing(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tokenizers" else real(name, *a))
    with pytest.raises(RecipeError, match=r"pip install 'trainfast\[hf\]'.*tokenizers"):
        build_task("lm").check_model("llama-tiny")


# --- documents ----------------------------------------------------------------------------------------------------
def test_source_is_cut_before_each_definition_with_its_decorators():
    source = '"""doc"""\nimport os\n\n# about f\n@cache\ndef f():\n    return 1\n\nclass A:\n    x = 1\n\n' \
             '    @property\n    def y(self):\n        return 2\n'
    blocks = top_level_blocks(source)
    assert blocks[0].startswith('"""doc"""') and blocks[1].startswith("# about f\n@cache\ndef f")
    assert blocks[2].startswith("class A:") and blocks[3].lstrip().startswith("@property")


def test_a_text_folder_is_read_and_its_bad_lines_named(tmp_path):
    for i in range(12):
        (tmp_path / f"doc{i}.txt").write_text(f"document number {i} " * (i + 1))
    (tmp_path / "more.jsonl").write_text("\n".join(json.dumps({"text": f"line {i}"}) for i in range(20)))
    corpus = folder_corpus(f"text:{tmp_path}", str(tmp_path))
    assert len(corpus.train) + len(corpus.val) == 32 and corpus.val
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        folder_corpus(f"text:{tmp_path}", str(tmp_path))
    with pytest.raises(DataError, match="stdlib:N"):
        parse_text_spec("stdlib:many")


def test_the_tokenizer_is_trained_once_and_cached(tmp_path, monkeypatch):
    from trainfast.text import tokenizer as tok
    from trainfast.text.corpus import Corpus

    monkeypatch.setenv("TRAINFAST_CACHE", str(tmp_path))
    corpus = Corpus("tiny", [f"def f{i}(x):\n    return x + {i}\n" for i in range(200)], ["def g(y): return y\n"], 1)
    first = tok.encoded_corpus(corpus, vocab_size=300)
    assert first.vocab_size <= 300 and all(int(d[-1]) == first.eos_id for d in first.train)
    monkeypatch.setattr(tok, "train_tokenizer", lambda *a: pytest.fail("trained again instead of read from the cache"))
    again = tok.encoded_corpus(corpus, vocab_size=300)
    assert all(torch.equal(a, b) for a, b in zip(first.train, again.train))
    assert not list(tmp_path.rglob("*.partial"))


def test_the_standard_library_is_a_corpus_of_documents_of_many_lengths(tmp_path, monkeypatch):
    from trainfast.text.batching import load_text

    monkeypatch.setenv("TRAINFAST_CACHE", str(tmp_path))
    split = load_text("stdlib:256", max_length=128)
    assert len(split.train) == 256 and len(split.val) == 64 and "256 of" in split.name
    lengths = split.train.lengths
    assert min(lengths) < 20 and max(lengths) == 128            # one-line aliases and long classes, cut at 128
    assert 0.3 < split.padding_share(16) < 0.9


# --- the doctor on a language model ---------------------------------------------------------------------------
def test_the_doctor_names_the_padding_of_a_padded_run_and_nothing_on_a_packed_one():
    from trainfast.checks import run_checks
    from trainfast.doctor import observe_builtin

    split = text_split(train_docs=160)

    def findings(recipe):
        obs = observe_builtin(lambda: build_lm("llama-tiny", VOCAB, MAX, PAD, EOS), split, recipe=recipe,
                              device="cpu", steps=6, flops=False)
        return {f.name: f for f in run_checks(obs)}, obs

    padded, obs = findings(Recipe(batch_size=16, log_every=4))
    share = obs.text["padding"]["share"]
    assert 0.2 < share < 0.8, share                       # documents of 3 to 48 tokens, padded to the longest
    found = padded["padding in the batches"]
    assert found.status in ("problem", "measured") and f"{round(share * 100)}%" in found.evidence
    assert obs.text["padding"]["packed_s"] > 0 and obs.text["padding"]["padded_s"] > 0
    assert padded["attention backend"].evidence.startswith("sdpa in use")
    assert {"sdpa", "eager"} <= set(obs.text["attention_backend"]["seconds"])
    packed, obs = findings(Recipe(batch_size=16, log_every=4, padding_free=True))
    assert "padding in the batches" not in packed and obs.text["padding"]["packed"]


# --- a Trainer script's batches -----------------------------------------------------------------------------------
def test_a_scripts_padded_batches_are_packed_after_its_own_collator():
    """The packing collator takes what DataCollatorForLanguageModeling made (pads at the right, labels IGNORE
    there) and gives the model the same tokens packed: the same loss, and no packing where there is no padding."""
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    from trainfast.frameworks.board import FrameworkRecord
    from trainfast.frameworks.packing import PackingCollator, prove_batches

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t1")),
                                        pad_token="t0", eos_token="t1")
    script = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    features = [{"input_ids": d.tolist()} for d in random_docs(8, seed=9)]
    collator = PackingCollator(script, pack=True)
    padded, packed = script(features), collator(features)
    model = tiny_lm(attention="sdpa")
    with torch.no_grad():
        assert abs(model(**padded).loss.item() - model(**packed).loss.item()) < LOSS_TOL
    assert "attention_mask" not in packed and collator.packed == 1 and 0 < collator.padding_share < 1
    record = FrameworkRecord("transformers", "test")
    record.set("padding_free", "data_collator packs", True)
    prove_batches(record, collator, None, {"padding_free": True, "group_by_length": False}, "data_collator")
    assert record.switches["data_collator packs"].applied and not record.unsupported
    # a classifier's batch (a label per sequence) is left as it is, and why is said
    classify = PackingCollator(lambda f: {**script(f), "labels": torch.zeros(len(f), dtype=torch.long)}, pack=True)
    assert "attention_mask" in classify(features) and "one per token" in classify.refused
    # every batch full (a chunked dataset, as run_clm.py's): nothing to remove, said for both switches
    full = PackingCollator(script, pack=False)
    full([{"input_ids": list(range(2, 18))} for _ in range(4)])
    record = FrameworkRecord("transformers", "test")
    prove_batches(record, full, None, {"padding_free": False, "group_by_length": False}, "data_collator")
    assert "hold no padding" in record.unsupported["padding_free"] and "group_by_length" in record.unsupported


@pytest.mark.slow
def test_an_unmodified_trainer_script_takes_the_language_model_switches(tmp_path):
    """examples/hf_causal_lm.py (a Trainer script that never imports trainfast): the attention backend is set
    through the Trainer and read back in the run. (Packing and length grouping, read back through the Trainer from
    the same script: test_script_task's ablation of its language-model ladder, whose attention rungs leave this
    model's own backend as it is.)"""
    import os
    import sys

    from trainfast.ablation import ablate_command

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = ablate_command([sys.executable, os.path.join(root, "examples", "hf_causal_lm.py"), "--documents", "96",
                             "--max-length", "64", "--out", str(tmp_path / "trainer")], device="cpu",
                            out=tmp_path / "ablation", rungs=["eager"], repeats=1, noise_seeds=1, show=False,
                            settle_within_s=0, mode="each")
    rungs = {r.name: r for r in result.rungs}
    assert all(r.status == Status.DONE for r in rungs.values()), {n: (r.status, r.reason) for n, r in rungs.items()}
    switches = rungs["eager"].repeats[0]["frameworks"]["transformers"]["switches"]
    assert switches["attention backend"]["applied"] and switches["attention backend"]["read_back"] == "eager", switches


def test_activation_checkpointing_reaches_the_model_through_its_own_switch():
    """transformers' gradient_checkpointing_enable, through the same switch as timm's: the recomputed step gives the
    same losses (recomputation is the same arithmetic) and the model says it checkpoints."""
    split = text_split(train_docs=48)
    recipe = Recipe(epochs=1, batch_size=8, lr=1e-3, log_every=2)
    plain = train("llama-tiny", split, recipe=recipe, device="cpu", task="lm")
    recomputed = train("llama-tiny", split, recipe=recipe.replace(activation_checkpointing=True), device="cpu",
                       task="lm")
    assert recomputed.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    a = [x for r in plain.history for x in r["train_losses"]]
    b = [x for r in recomputed.history for x in r["train_losses"]]
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5


def test_the_report_gives_documents_per_second_beside_tokens():
    from trainfast.report.markdown import documents_line

    rung = type("R", (), {"name": "baseline", "recipe": Recipe(), "repeats": [], "changes": {},
                          "result": type("X", (), {"throughput": 5000.0})()})()
    result = type("Result", (), {"settings": {"tokens_per_sample": 100.0}, "rungs": [rung]})()
    line = documents_line(result)
    assert "averages 100.0 tokens" in line and " 50.0" in line
    result.settings = {}
    assert documents_line(result) is None


# --- a Session loop around a transformers model ------------------------------------------------------------------
class TokenizedDocs(torch.utils.data.Dataset):
    """What a user's tokenized dataset hands out: a dict with input_ids per document."""

    def __init__(self, docs):
        self.docs = docs

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, index):
        return {"input_ids": self.docs[index].tolist()}


def lm_collator():
    from tokenizers import Tokenizer, models
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t1")),
                                        pad_token="t0", eos_token="t1")
    return DataCollatorForLanguageModeling(tokenizer, mlm=False)


def test_a_session_packs_and_groups_its_scripts_own_loader():
    from trainfast import Session

    loader = torch.utils.data.DataLoader(TokenizedDocs(random_docs(64, seed=4)), batch_size=8, shuffle=True,
                                         collate_fn=lm_collator(), generator=torch.Generator().manual_seed(0))
    tf = Session(Recipe(padding_free=True, group_by_length=True), device="cpu", env=False)
    model = tiny_lm().train()
    model, optimizer, adopted = tf.setup(model, torch.optim.AdamW(model.parameters()), loader)
    first = next(iter(adopted))
    assert "position_ids" in first and "attention_mask" not in first        # packed after the script's collator
    assert "LengthGroupedSampler" in type(adopted.loader.sampler).__name__
    assert tf.unsupported() == {}
    # a loader with no padding and no token ids to group: both said, the ablation rules the rungs out
    images = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4), torch.zeros(16)),
                                         batch_size=4)
    tf = Session(Recipe(padding_free=True, group_by_length=True), device="cpu", env=False)
    _, _, adopted = tf.setup(torch.nn.Linear(4, 2), None, images)
    list(adopted)
    why = tf.unsupported()
    assert "not token ids" in why["padding_free"] and "input_ids" in why["group_by_length"]


def test_a_session_loop_with_packing_trains_as_the_padded_one():
    """The same documents per step, padded or packed: the losses of a Session loop agree to 1e-4."""
    from trainfast import Session

    def losses(padding_free):
        torch.manual_seed(0)
        model = build_lm("llama-tiny", VOCAB, MAX, PAD, EOS)
        loader = torch.utils.data.DataLoader(TokenizedDocs(random_docs(48, seed=6)), batch_size=8, shuffle=True,
                                             collate_fn=lm_collator(), generator=torch.Generator().manual_seed(0))
        tf = Session(Recipe(padding_free=padding_free), device="cpu", env=False)
        model, optimizer, loader = tf.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3), loader)
        out = []
        for batch in loader:
            optimizer.zero_grad()
            loss = model(**batch).loss
            tf.backward(loss)
            optimizer.step()
            out.append(loss.item())
        return out
    padded, packed = losses(False), losses(True)
    assert len(padded) == len(packed) == 6 and max(abs(a - b) for a, b in zip(padded, packed)) < 1e-4
