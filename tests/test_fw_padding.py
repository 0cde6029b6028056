"""The padding switches through Lightning and Accelerate (frameworks/packing.py): the training DataLoader the fit
loop iterates, or the one handed to accelerator.prepare(), gets its collate_fn wrapped to pack the script's padded
batches (padding_free) and its shuffling sampler length-grouped (group_by_length), each proven from what the loader
ended up with; off leaves the script's own loader; a model that takes no position_ids, batches with no padding and
a loader that keeps an order of its own are not applicable, said why."""
from __future__ import annotations

import functools
import os
import sys
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler

L = pytest.importorskip("lightning")
pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

import fwkit  # noqa: E402

from trainfast.ablation.proof import lacks_a_switch, not_applied  # noqa: E402
from trainfast.frameworks.board import Board  # noqa: E402
from trainfast.frameworks.packing import GROUPED, PACKS, uses_length_groups  # noqa: E402
from trainfast.text.batching import LengthGroupedSampler  # noqa: E402
from trainfast.text.packing import document_lengths  # noqa: E402

VOCAB, BATCH = 64, 4
BOTH = {"padding_free": True, "group_by_length": True}
OFF = {"padding_free": False, "group_by_length": False}


class Documents(torch.utils.data.Dataset):
    """A tokenized dataset as a user's is: a dict with input_ids per document, documents of different lengths."""

    def __init__(self, count: int = 32, full: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        lengths = [12] * count if full else torch.randint(3, 24, (count,), generator=g).tolist()
        self.docs = [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in lengths]

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.docs[index]}


def collator():
    """DataCollatorForLanguageModeling(mlm=False): padded to the batch's longest, labels -100 on the padding."""
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(VOCAB)}
    words = Tokenizer(models.WordLevel(vocab, unk_token="t1"))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="t0", eos_token="t1")
    return transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False)


def train_loader(full: bool = False, **kwargs: Any) -> DataLoader:
    kwargs.setdefault("shuffle", True)
    return DataLoader(Documents(full=full), batch_size=BATCH, collate_fn=collator(), **kwargs)


def llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, max_position_embeddings=32, use_cache=False,
                                      pad_token_id=0, eos_token_id=1)
    return transformers.LlamaForCausalLM(config)


class NoPositions(nn.Module):
    """A causal language model of the script's own whose forward takes no position_ids."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.embed(input_ids))
        return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def read_backs(board: Board, framework: str) -> dict[str, Any]:
    return {k: (s["read_back"], s["applied"]) for k, s in board.to_dict()[framework]["switches"].items()}


# --- Lightning: the training loader the fit loop iterates -----------------------------------------------------------

class CausalLM(L.LightningModule):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.seen = model, []

    def training_step(self, batch, index):
        self.seen.append(sorted(batch))
        out = self.model(**batch)
        return out.loss if hasattr(out, "loss") else out

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(monkeypatch, fields: dict[str, Any], model: nn.Module | None = None, loader: DataLoader | None = None):
    board = Board({**fields, "seed": 0})
    Trainer = fwkit.patched_lightning_trainer(monkeypatch, board)
    trainer = Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    module = CausalLM(model if model is not None else llama())
    trainer.fit(module, train_dataloaders=loader if loader is not None else train_loader())
    return board, trainer, module


def test_lightning_packs_and_groups_the_loader_the_fit_iterates_and_proves_both(monkeypatch):
    board, trainer, module = fit(monkeypatch, BOTH)
    assert module.seen[0] == ["input_ids", "labels", "position_ids"]          # packed after the script's collator
    assert uses_length_groups(trainer.train_dataloader)
    assert torch.isfinite(trainer.callback_metrics.get("train_loss", torch.tensor(0.0)))
    assert read_backs(board, "lightning") == {PACKS: (True, True), GROUPED: (True, True)}
    sections = {"lightning": board.to_dict()["lightning"]}
    assert not_applied(BOTH, sections) is None and lacks_a_switch(BOTH, sections) is None


class DropsPositions(CausalLM):
    """A step that hands the model two of the batch's fields by name: a packed batch's position_ids never reach it."""

    def training_step(self, batch, index):
        return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss


def test_a_step_that_leaves_the_position_ids_out_makes_packing_not_applied(monkeypatch):
    board = Board({**BOTH, "seed": 0})
    Trainer = fwkit.patched_lightning_trainer(monkeypatch, board)
    trainer = Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(DropsPositions(llama()), train_dataloaders=train_loader())
    read_back, applied = read_backs(board, "lightning")[PACKS]
    assert not applied and "got no position_ids" in read_back
    assert "got no position_ids" in not_applied(BOTH, board.to_dict())


def test_lightning_off_leaves_the_scripts_loader_and_proves_it(monkeypatch):
    board, trainer, module = fit(monkeypatch, OFF)
    assert module.seen[0] == ["attention_mask", "input_ids", "labels"]
    assert isinstance(trainer.train_dataloader.sampler, RandomSampler)
    assert read_backs(board, "lightning") == {PACKS: (False, True), GROUPED: (False, True)}
    assert any("padding" in note for note in board.to_dict()["lightning"]["notes"])


def test_lightning_model_without_position_ids_is_not_applicable_with_why(monkeypatch):
    board, _, module = fit(monkeypatch, BOTH, model=NoPositions())
    assert module.seen[0] == ["attention_mask", "input_ids", "labels"]      # not packed: the model would mix documents
    why = board.to_dict()["lightning"]["unsupported"]
    assert "CausalLM.forward takes no position_ids" in why["padding_free"]       # the module, and all inside it
    assert "group_by_length" not in why                                      # grouping needs no positions
    assert "takes no position_ids" in lacks_a_switch({"padding_free": True}, board.to_dict())


def test_lightning_batches_without_padding_leave_both_switches_nothing_to_do(monkeypatch):
    board, _, _ = fit(monkeypatch, OFF, loader=train_loader(full=True))
    why = board.to_dict()["lightning"]["unsupported"]
    assert "hold no padding" in why["padding_free"] and "hold no padding" in why["group_by_length"]


# --- Accelerate: the training loader handed to prepare() ------------------------------------------------------------

@pytest.fixture
def accelerator_class(monkeypatch):
    with fwkit.fresh_accelerate_state(monkeypatch):
        yield functools.partial(fwkit.patched_accelerator)


def accelerate_steps(Acc, fields: dict[str, Any], model: nn.Module | None = None, loader: DataLoader | None = None,
                     steps: int = 3):
    board = Board({**fields, "seed": 0})
    model = model if model is not None else llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accelerator = Acc(board)(cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader if loader is not None else train_loader())
    seen, losses = [], []
    for _, batch in zip(range(steps), loader):
        seen.append(sorted(batch))
        out = model(**batch)
        loss = out.loss if hasattr(out, "loss") else out
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return board, loader, seen, losses


def test_accelerate_packs_and_groups_the_prepared_loader_and_proves_both(accelerator_class):
    board, loader, seen, losses = accelerate_steps(accelerator_class, BOTH)
    assert seen[0] == ["input_ids", "labels", "position_ids"] and all(map(torch.isfinite, torch.tensor(losses)))
    assert uses_length_groups(loader)                       # through Accelerate's wrapper of the loader
    assert read_backs(board, "accelerate") == {PACKS: (True, True), GROUPED: (True, True)}
    assert not_applied(BOTH, board.to_dict()) is None and lacks_a_switch(BOTH, board.to_dict()) is None


def test_accelerate_off_leaves_the_scripts_loader_and_proves_it(accelerator_class):
    board, loader, seen, _ = accelerate_steps(accelerator_class, OFF)
    assert seen[0] == ["attention_mask", "input_ids", "labels"] and not uses_length_groups(loader)
    assert read_backs(board, "accelerate") == {PACKS: (False, True), GROUPED: (False, True)}


def test_accelerate_model_without_position_ids_is_not_applicable_with_why(accelerator_class):
    board, _, seen, _ = accelerate_steps(accelerator_class, BOTH, model=NoPositions())
    assert seen[0] == ["attention_mask", "input_ids", "labels"]
    why = board.to_dict()["accelerate"]["unsupported"]
    assert "takes no position_ids" in why["padding_free"] and "group_by_length" not in why


def test_a_loader_that_keeps_its_own_order_is_not_grouped_and_says_why(accelerator_class):
    board, loader, _, _ = accelerate_steps(accelerator_class, BOTH, loader=train_loader(shuffle=False))
    assert not uses_length_groups(loader)
    assert "SequentialSampler" in board.to_dict()["accelerate"]["unsupported"]["group_by_length"]


# --- the length-grouped sampler and the lengths it reads ------------------------------------------------------------

def test_without_transformers_the_grouped_order_is_transformers_own():
    """text/'s LengthGroupedSampler (for a script without transformers) draws the very order transformers' does
    from the same generator."""
    from transformers.trainer_pt_utils import LengthGroupedSampler as Theirs

    lengths = torch.randint(1, 200, (500,), generator=torch.Generator().manual_seed(3)).tolist()
    ours = list(LengthGroupedSampler(8, lengths, torch.Generator().manual_seed(1)))
    theirs = list(Theirs(8, lengths=lengths, generator=torch.Generator().manual_seed(1)))
    assert ours == theirs and sorted(ours) == list(range(500))


def test_document_lengths_read_mappings_lists_and_tensors_of_token_ids():
    assert document_lengths([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}]) == [3, 1]
    assert document_lengths([[5, 6], [7, 8, 9]]) == [2, 3]
    assert document_lengths([torch.arange(4), torch.arange(2)]) == [4, 2]
    assert document_lengths([torch.randn(4), torch.randn(2)]) is None                  # features, not token ids
    assert document_lengths(torch.utils.data.TensorDataset(torch.zeros(3, 2))) is None


# --- the examples, end to end through `trainfast ablate` ------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("example, framework, rung, setting", [
    ("lightning_causal_lm.py", "lightning", "padding_free", PACKS),
    ("accelerate_causal_lm.py", "accelerate", "group_by_length", GROUPED)])
def test_the_examples_padding_rungs_are_applied_and_rated_in_tokens(tmp_path, example, framework, rung, setting):
    """examples/lightning_causal_lm.py and examples/accelerate_causal_lm.py (neither imports trainfast) under
    `trainfast ablate`: the rung runs as applied, its switch read back from the training loader, the rate in tokens
    (the script's batches are a language model's). One switch an example: each switch reaches both frameworks'
    loaders in this process (test_lightning_packs_and_groups_..., test_accelerate_packs_and_groups_...), so the
    end-to-end runs prove the examples and the ablation around them, each switch once."""
    from trainfast.ablation import ablate_command
    from trainfast.results import Status

    result = ablate_command([sys.executable, os.path.join(fwkit.ROOT, "examples", example), "--documents", "96",
                             "--max-length", "64"],         # still padded; each run half the CPU of 256
                            device="cpu", out=tmp_path / "ablation", rungs=[rung],
                            repeats=1, noise_seeds=1, show=False, settle_within_s=0, mode="each")
    rungs = {r.name: r for r in result.rungs}
    assert all(r.status == Status.DONE for r in rungs.values()), {n: (r.status, r.reason) for n, r in rungs.items()}
    switches = rungs[rung].repeats[0]["frameworks"][framework]["switches"]
    assert switches[setting]["applied"] and switches[setting]["read_back"] is True, switches
    assert all(r.repeats[0]["rate_unit"] == "tokens/s" for r in rungs.values())
    assert result.settings["script_task"]["name"] == "lm"
