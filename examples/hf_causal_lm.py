"""Train a small Llama-style causal language model with transformers' Trainer, the way the transformers docs show
it: a tokenizer, a model built from a config (random weights, nothing downloaded), documents tokenized one by one,
DataCollatorForLanguageModeling padding each batch to its longest document, TrainingArguments and
Trainer.train(). The documents are the Python standard library's own functions and classes (every install has
them), the tokenizer a byte-level BPE trained on them first (a few seconds). It does not import trainfast:

    trainfast ablate --measure full --switches padding_free,group_by_length,sdpa,amp -- python examples/hf_causal_lm.py

switches it from the inside (the Trainer's group_by_length, bf16, its optim; the training collator wrapped to
pack the padded batches; the model's attention backend) and proves each switch by reading it back; each rung is
judged on the Trainer's eval_loss. With --eval-steps N the Trainer evaluates every N steps (eval_strategy="steps"),
and `trainfast ablate --target auto -- python examples/hf_causal_lm.py --eval-steps 5` reads each rung's time to
the baseline's final eval_loss from those evaluations."""
import argparse
import ast
import os
import sysconfig

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast,
                          Trainer, TrainingArguments)


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
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--out", default="/tmp/hf_causal_lm")
    parser.add_argument("--eval-steps", type=int, default=0, metavar="N",
                        help="evaluate every N optimizer steps during training (eval_strategy='steps'); default: "
                             "once, after training")
    cli = parser.parse_args()

    texts = stdlib_functions(cli.documents + cli.documents // 5)
    tokenizer = tokenizer_for(texts)
    train, evaluation = texts[: cli.documents], texts[cli.documents:]
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                         num_attention_heads=4, max_position_embeddings=cli.max_length, use_cache=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    args = TrainingArguments(output_dir=cli.out, per_device_train_batch_size=16, per_device_eval_batch_size=16,
                             num_train_epochs=cli.epochs, learning_rate=1e-3, weight_decay=0.01, warmup_steps=10,
                             logging_steps=10, save_strategy="no", report_to=[], seed=0,
                             eval_strategy="steps" if cli.eval_steps else "no", eval_steps=cli.eval_steps or None)
    trainer = Trainer(model=model, args=args, train_dataset=Documents(train, tokenizer, cli.max_length),
                      eval_dataset=Documents(evaluation, tokenizer, cli.max_length),
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
