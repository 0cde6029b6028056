"""Train a small Llama-style causal language model with Hugging Face Accelerate, the way Accelerate's docs show it
(their run_clm_no_trainer): a transformers model built from a config (random weights, nothing downloaded),
DataLoaders of documents tokenized one by one and padded per batch by DataCollatorForLanguageModeling, the model,
optimizer, loaders and LR scheduler through accelerator.prepare(), accelerator.backward(loss), then
optimizer.step(), scheduler.step(), optimizer.zero_grad(). The documents are the Python standard library's own
functions and classes (every install has them), the tokenizer a byte-level BPE trained on them first (a few
seconds). It does not import trainfast:

    trainfast ablate --measure full --switches padding_free,group_by_length -- python examples/accelerate_causal_lm.py

switches it from the inside (mixed_precision; the training DataLoader's collate_fn wrapped to pack the padded
batches, its sampler length-grouped, both before prepare() wraps it; the model's attention backend) and proves
each switch by reading it back; each epoch's validation loss goes to accelerator.log (eval_loss), which the rungs
are judged on."""
import argparse
import ast
import os
import sysconfig

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=640)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    cli = parser.parse_args()

    accelerator = Accelerator()
    texts = stdlib_functions(cli.documents + cli.documents // 5)
    tokenizer = tokenizer_for(texts)
    train, evaluation = texts[: cli.documents], texts[cli.documents:]
    set_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                         num_attention_heads=4, max_position_embeddings=cli.max_length, use_cache=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    train_loader = DataLoader(Documents(train, tokenizer, cli.max_length), batch_size=cli.batch_size, shuffle=True,
                              collate_fn=collator)
    eval_loader = DataLoader(Documents(evaluation, tokenizer, cli.max_length), batch_size=cli.batch_size,
                             collate_fn=collator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler)

    for epoch in range(cli.epochs):
        model.train()
        for batch in train_loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        model.eval()
        losses = []
        with torch.no_grad():
            for batch in eval_loader:
                batch_loss = model(**batch).loss
                losses.append(accelerator.gather_for_metrics(batch_loss.repeat(len(batch["input_ids"]))))
        eval_loss = torch.cat(losses).mean().item()
        accelerator.log({"eval_loss": eval_loss}, step=epoch)
        accelerator.print(f"epoch {epoch + 1}: train loss {loss.item():.4f}  eval loss {eval_loss:.4f}")


if __name__ == "__main__":
    main()
