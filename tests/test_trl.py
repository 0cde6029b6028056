"""TRL's SFTTrainer: its own packing settings (SFTConfig packing, padding_free) read back in every run; where the
script leaves them off, the padding_free switch packs the padded batches its collator makes, which gives the same
loss as TRL's own padding-free batches on the same documents."""
from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from trainfast.ablation.proof import lacks_a_switch  # noqa: E402
from trainfast.frameworks import hf  # noqa: E402
from trainfast.frameworks.board import Board  # noqa: E402
from trainfast.text.packing import PackingCollator  # noqa: E402

VOCAB = 64


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", eos_token="<eos>")


def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=64, use_cache=False,
                                      pad_token_id=0, eos_token_id=1)
    return transformers.LlamaForCausalLM(config).eval()


def documents(count: int = 8) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 20, (count,), generator=g).tolist()
    return [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in lengths]


def test_the_packing_collator_gives_the_loss_of_trls_padding_free_batches():
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    model, docs = llama(), documents()
    examples = [{"input_ids": d} for d in docs]
    flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples)
    padded = DataCollatorForLanguageModeling(pad_token_id=0)
    packed = PackingCollator(padded, pack=True)(examples)
    assert len(flat["input_ids"]) == 1 and len(packed["input_ids"]) > 1        # one row against several
    with torch.no_grad():
        theirs = model(input_ids=flat["input_ids"], labels=flat["labels"], position_ids=flat["position_ids"]).loss
        ours = model(**packed).loss
        mixed = model(input_ids=packed["input_ids"], labels=packed["labels"]).loss    # documents attending across
    assert (packed["labels"] != -100).sum() == (flat["labels"] != -100).sum()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert abs(mixed - theirs) > 1e-3               # the comparison can tell a wrong packing apart


def sft_trainer(board: Board, tmp_path, **config):
    class SFT(trl.SFTTrainer):
        pass
    hf.patch_trainer(SFT, board)
    text = [" ".join(f"w{t}" for t in d) for d in documents(16)]
    args = trl.SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, report_to=[],
                         save_strategy="no", use_cpu=True, max_length=None if config.get("padding_free") else 64,
                         logging_steps=1, dataset_num_proc=None, **config)
    trainer = SFT(model=llama().train(), args=args, train_dataset=datasets.Dataset.from_dict({"text": text}),
                  processing_class=tokenizer())
    trainer.train()
    return board.to_dict()["transformers"]


def test_an_sft_script_with_trls_packing_off_is_packed_by_the_switch_and_its_settings_read_back(tmp_path):
    record = sft_trainer(Board({"padding_free": True, "seed": 0}), tmp_path)
    packs = record["switches"]["data_collator packs"]
    assert packs["read_back"] is True and packs["applied"] is True
    assert "TRL SFTConfig as the script set it: packing=False, padding_free=False" in record["notes"]


@pytest.mark.parametrize("setting", ["packing", "padding_free"])
def test_an_sft_script_that_packs_itself_leaves_the_switch_not_applicable_with_why(tmp_path, setting):
    record = sft_trainer(Board({"padding_free": True, "seed": 0}), tmp_path, **{setting: True})
    assert f"SFTConfig has {setting}=True" in record["unsupported"]["padding_free"]
    assert f"{setting}=True" in lacks_a_switch({"padding_free": True}, {"transformers": record})
