"""Train a small Llama-style causal language model with PyTorch Lightning, the way Lightning's docs show it: a
LightningModule around a transformers model built from a config (random weights, nothing downloaded), its
training_step, validation_step and configure_optimizers, DataLoaders of documents tokenized one by one and padded
per batch by DataCollatorForLanguageModeling, a Trainer and trainer.fit(). The documents are the Python standard
library's own functions and classes (every install has them), the tokenizer a byte-level BPE trained on them
first (a few seconds). It does not import trainfast:

    trainfast ablate --measure full --switches padding_free,group_by_length -- python examples/lightning_causal_lm.py

switches it from the inside (the Trainer's precision; the training DataLoader's collate_fn wrapped to pack the
padded batches, its sampler length-grouped; the model's attention backend) and proves each switch by reading it
back; each rung is judged on the val_loss that validation_step logs. With `--val-every N` it validates every N
batches, and `trainfast ablate --target auto -- python examples/lightning_causal_lm.py --val-every 4` reads each
rung's time to that loss off those validations."""
import argparse
import ast
import os
import sysconfig

import lightning as L
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from torch.utils.data import DataLoader
from transformers import DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def stdlib_functions(limit: int) -> list[str]:
    """Source of the standard library's top-level functions and classes, in a fixed order."""
    root = sysconfig.get_paths()["stdlib"]
    texts = []
    for name in sorted(os.listdir(root)):
        if not name.endswith(".py"):
            continue
        source = open(os.path.join(root, name), encoding="utf-8").read()
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        texts += [ast.get_source_segment(source, node) for node in tree.body
                  if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
        if len(texts) >= limit:
            break
    return [t for t in texts if t][:limit]


def tokenizer_for(texts: list[str]) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=2048, special_tokens=["<pad>", "<eos>"],
                                                       show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>")


class Documents(torch.utils.data.Dataset):
    def __init__(self, texts: list[str], tokenizer, max_length: int) -> None:
        self.items = [tokenizer(t + tokenizer.eos_token, truncation=True, max_length=max_length) for t in texts]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.items[index]["input_ids"], "attention_mask": self.items[index]["attention_mask"]}


class CausalLM(L.LightningModule):
    def __init__(self, config: LlamaConfig, lr: float, warmup: int) -> None:
        super().__init__()
        self.model = LlamaForCausalLM(config)
        self.lr, self.warmup = lr, warmup

    def training_step(self, batch: dict, index: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("train_loss", loss, batch_size=len(batch["input_ids"]))
        return loss

    def validation_step(self, batch: dict, index: int) -> None:
        self.log("val_loss", self.model(**batch).loss, batch_size=len(batch["input_ids"]))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / self.warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=640)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--val-every", type=int, default=None,
                        help="validate every N training batches (Lightning's val_check_interval); default: each epoch")
    cli = parser.parse_args()

    texts = stdlib_functions(cli.documents + cli.documents // 5)
    tokenizer = tokenizer_for(texts)
    train, evaluation = texts[: cli.documents], texts[cli.documents:]
    L.seed_everything(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                         num_attention_heads=4, max_position_embeddings=cli.max_length, use_cache=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    train_loader = DataLoader(Documents(train, tokenizer, cli.max_length), batch_size=cli.batch_size, shuffle=True,
                              collate_fn=collator)
    eval_loader = DataLoader(Documents(evaluation, tokenizer, cli.max_length), batch_size=cli.batch_size,
                             collate_fn=collator)
    trainer = L.Trainer(max_epochs=cli.epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=10,
                        val_check_interval=cli.val_every)
    trainer.fit(CausalLM(config, lr=1e-3, warmup=10), train_loader, eval_loader)
    print({name: round(float(value), 4) for name, value in trainer.callback_metrics.items()})


if __name__ == "__main__":
    main()
