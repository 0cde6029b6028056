"""A hand-written causal-LM loop adopted with trainfast.Session whose dataset items are plain token sequences
(lists of ints, 1-D tensors) and whose own collate_fn pads them: length grouping reads them, and with packing on
the run's rate (the Session's step clock, the ablation's record) counts tokens, never the fewer packed rows."""
import pytest
import torch

from trainfast import Recipe, Session
from trainfast.text.packing import document_lengths, token_length

pytest.importorskip("transformers")
VOCAB, PAD, EOS, MAX = 96, 0, 1, 48


def token_lists(count: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, MAX + 1, (count,), generator=g).tolist()
    return [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in lengths]


def pad_collate(items) -> dict:
    """The loop's own collate_fn: its token sequences padded on the right, masked, labelled -100 there."""
    longest = max(len(i) for i in items)
    ids = torch.full((len(items), longest), PAD)
    mask = torch.zeros_like(ids)
    for row, item in enumerate(items):
        ids[row, :len(item)] = torch.as_tensor(item)
        mask[row, :len(item)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def pair_collate(items) -> tuple:
    """A collate_fn that returns (ids, labels): no mapping for packing to hand position_ids through."""
    batch = pad_collate(items)
    return batch["input_ids"], batch["labels"]


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, max_position_embeddings=MAX, use_cache=False,
                                        pad_token_id=PAD, eos_token_id=EOS, attn_implementation="eager"))


def test_the_length_reader_takes_any_form_of_token_sequence():
    docs = token_lists(5)
    lengths = [len(d) for d in docs]
    for form in (list, tuple, lambda d: torch.tensor(d), lambda d: {"input_ids": d}):
        assert document_lengths([form(d) for d in docs]) == lengths
    assert token_length(torch.randn(4)) is None and token_length(torch.zeros(2, 3, dtype=torch.long)) is None
    assert token_length((torch.randn(3, 8, 8), 1)) is None and token_length([True, False]) is None
    assert document_lengths([(torch.randn(2), 0)]) is None


def test_a_token_list_loop_is_grouped_by_length_and_a_tensor_pair_says_why_it_is_not_packed():
    docs = [torch.tensor(d) for d in token_lists(64, seed=4)]          # 1-D integer tensors
    loader = torch.utils.data.DataLoader(docs, batch_size=8, shuffle=True, collate_fn=pad_collate,
                                         generator=torch.Generator().manual_seed(0))
    tf = Session(Recipe(padding_free=True, group_by_length=True), device="cpu", env=False)
    model = tiny_llama()
    _, _, adopted = tf.setup(model, torch.optim.AdamW(model.parameters()), loader)
    first = next(iter(adopted))
    assert "LengthGroupedSampler" in type(adopted.loader.sampler).__name__
    assert "position_ids" in first and tf.unsupported() == {}

    pairs = torch.utils.data.DataLoader(docs, batch_size=8, collate_fn=pair_collate)
    tf = Session(Recipe(padding_free=True), device="cpu", env=False)
    _, _, adopted = tf.setup(torch.nn.Linear(4, 2), None, pairs)
    list(adopted)
    why = tf.unsupported()["padding_free"]
    assert "returns a tuple of tensors (token ids first), not a mapping with input_ids and labels" in why


def epoch(padding_free: bool):
    """One epoch of a Session loop on the same documents, measured as the ablation measures a run (its probe
    reading the Session's step clock, its batch-kind instrument counting the tokens of every step)."""
    from trainfast.instruments.batches import BatchKind
    from trainfast.probe import MeasureSpec, Probe

    loader = torch.utils.data.DataLoader(token_lists(48, seed=6), batch_size=8, collate_fn=pad_collate)
    tf = Session(Recipe(padding_free=padding_free), device="cpu", env=False)
    model = tiny_llama()
    model, optimizer, loader = tf.setup(model, torch.optim.SGD(model.parameters(), lr=1e-3), loader)
    probe = Probe(MeasureSpec(result="unused"))
    probe.batches = BatchKind()
    probe.watch(tf.state, 0)
    rows = 0
    try:
        for batch in loader:
            rows += len(batch["input_ids"])
            optimizer.zero_grad()
            tf.backward(model(**batch).loss)
            optimizer.step()
    finally:
        probe.batches.remove()
    tf.state.timer.read()
    steps = tf.state.timer.steps
    return [s.samples for s in steps], probe.batches.step_tokens(len(steps)), probe.timing(), rows


def test_packed_and_padded_count_the_same_tokens_not_rows():
    """48 documents, 6 steps of 8. The ablation's record (the probe's timing) counts each step's predicted tokens:
    the same padded and packed, step for step, whatever the packed row count. The Session's own clock counts the
    real tokens of a packed step."""
    _, padded_tokens, padded_timing, padded_rows = epoch(False)
    packed_clock, packed_tokens, packed_timing, packed_rows = epoch(True)
    docs = token_lists(48, seed=6)
    assert packed_rows < padded_rows == 48                      # packing makes fewer rows of the same documents
    # Counting begins once the first forward said the batches are token ids: from the second step (the first is
    # warm-up, never timed). A document's first token is not predicted.
    assert packed_tokens == padded_tokens and packed_tokens[0] == 0
    assert sum(packed_tokens) == sum(len(d) - 1 for d in docs[8:])
    for timing, per_step in ((padded_timing, padded_tokens), (packed_timing, packed_tokens)):
        assert timing.step_samples == per_step[len(per_step) - len(timing.step_samples):]
    assert packed_clock == [sum(len(d) for d in docs[i: i + 8]) for i in range(0, 48, 8)]
