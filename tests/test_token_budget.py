"""The batch_tokens switch (techniques/token_budget.py): batches sized by a token budget, declared with the
BatchSwitch hook only."""
import pytest
import torch

from trainfast import techniques
from trainfast.distributed import Dist
from trainfast.recipe import Recipe, RecipeError
from trainfast.techniques.token_budget import SCRIPT, TokenBudgetBatches
from trainfast.text.batching import PackCollate, PadCollate, TextSplit, TokenDocs

VOCAB, PAD, EOS, MAX = 96, 0, 1, 48
CPU = torch.device("cpu")


def lengths(count: int = 200, seed: int = 0) -> list[int]:
    return torch.randint(3, MAX + 1, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def split(count: int = 96) -> TextSplit:
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(2, VOCAB, (n,), generator=g) for n in lengths(count)]
    return TextSplit(TokenDocs(docs, MAX), TokenDocs(docs[:8], MAX), VOCAB, PAD, EOS, "random documents", MAX)


def padded(batches, sizes) -> tuple[int, int]:
    """(positions computed, real tokens) of padded batches."""
    return (sum(max(sizes[i] for i in b) * len(b) for b in batches), sum(sizes[i] for b in batches for i in b))


def test_every_batch_keeps_within_the_budget_and_every_document_comes_once():
    sizes = lengths()
    sampler = TokenBudgetBatches(sizes + [400], tokens=8 * MAX, seed=3)     # one document longer than the budget
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(sizes) + 1))
    assert all(len(b) == 1 or max((sizes + [400])[i] for i in b) * len(b) <= 8 * MAX for b in batches)
    assert batches[0] == [len(sizes)]              # the longest document's batch first: an OOM shows at once
    assert len(sampler) == len(batches)
    assert list(TokenBudgetBatches(sizes, 8 * MAX, seed=3)) == list(TokenBudgetBatches(sizes, 8 * MAX, seed=3))
    again = TokenBudgetBatches(sizes, 8 * MAX, seed=3)
    again.set_epoch(1)
    assert list(again) != list(TokenBudgetBatches(sizes, 8 * MAX, seed=3))     # re-drawn every epoch


def test_batches_by_tokens_pad_less_than_batches_of_documents():
    sizes = lengths()
    plain = [list(range(i, i + 8)) for i in range(0, len(sizes) - 7, 8)]      # batch_size 8 in a random order
    slots, tokens = padded(plain, sizes)
    budget_slots, budget_tokens = padded(list(TokenBudgetBatches(sizes, 8 * MAX)), sizes)
    assert budget_tokens == sum(sizes)
    assert 1 - budget_tokens / budget_slots < (1 - tokens / slots) / 3


def test_ranks_run_the_same_number_of_steps_and_share_the_documents():
    sizes = lengths(101)
    ranks = [list(TokenBudgetBatches(sizes, 6 * MAX, seed=1, num_replicas=2, rank=r)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    assert {i for r in ranks for b in r for i in b} == set(range(len(sizes)))


def test_the_built_in_run_draws_its_batches_within_the_budget():
    from trainfast.tasks.lm import LanguageModel

    data = split()
    recipe = Recipe(batch_size=8, batch_tokens=6 * MAX, num_workers=0)
    train, _ = LanguageModel().build_loaders(data, recipe, CPU, Dist(CPU))
    batches = [inputs for inputs, _ in train]
    assert sum(b.documents for b in batches) == len(data.train)           # every document, none dropped
    assert all(b.slots <= 6 * MAX or b.documents == 1 for b in batches)
    assert len({b.documents for b in batches}) > 1                         # batches of their own sizes
    off, _ = LanguageModel().build_loaders(data, Recipe(batch_size=8, num_workers=0), CPU, Dist(CPU))
    assert {inputs.documents for inputs, _ in off} == {8}                 # off: batch_size documents, as before


def test_a_scripts_loader_is_said_not_applicable_and_the_switch_is_declared_as_changing_the_math():
    assert techniques.batch_refusals(lambda batch: batch, {"batch_tokens": 4096}) == {"batch_tokens": SCRIPT}
    assert techniques.batch_refusals(PadCollate(PAD), {"batch_tokens": 4096}) == {}
    assert techniques.batch_refusals(PackCollate(PAD), {"batch_tokens": 4096}) == {}
    assert "batch_tokens" in techniques.math_fields()
    assert techniques.rung_table("lm")["token_budget"] == {"batch_tokens": 4096}
    assert "token_budget" not in techniques.default_ladder("lm") and "token_budget" not in techniques.rung_table()
    assert techniques.unreachable("transformers", {"batch_tokens": 4096})
    with pytest.raises(RecipeError, match="batch_tokens"):
        Recipe(batch_tokens=-1)
