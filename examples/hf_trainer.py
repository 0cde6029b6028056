"""Fine-tune a small BERT for sequence classification with transformers' Trainer, the way the transformers
docs show it: a model built from a config (random weights, nothing downloaded), a dataset made on the fly,
TrainingArguments and Trainer.train(). It does not import trainfast:

    trainfast ablate -- python examples/hf_trainer.py

switches it from the inside (bf16, torch_compile, the fused AdamW, the loader's workers) through the
Trainer's own arguments, and proves each switch applied by reading it back. With --measure full each rung is
judged on the Trainer's own evaluation: eval_accuracy from compute_metrics, the metric_for_best_model."""
import argparse

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class ParityTokens(Dataset):
    """Token sequences labelled by whether token 7 appears an odd number of times: learnable, and made on
    the fly from a seed, so the script needs no download."""

    def __init__(self, size: int, length: int = 32, vocab: int = 128, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (size, length), generator=g)
        self.labels = ((self.ids == 7).sum(dim=1) % 2).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def compute_metrics(prediction) -> dict:
    """Held-out accuracy, as the Trainer's docs write compute_metrics."""
    logits, labels = prediction
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--train-size", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--output-dir", default="runs/hf_trainer")
    cli = parser.parse_args()

    config = BertConfig(vocab_size=128, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=256, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=cli.output_dir,
        num_train_epochs=cli.epochs,
        per_device_train_batch_size=cli.batch_size,
        per_device_eval_batch_size=64,
        learning_rate=5e-4,
        eval_strategy="epoch",
        metric_for_best_model="accuracy",
        save_strategy="no",
        logging_steps=20,
        report_to="none",
    )
    trainer = Trainer(model=model, args=args, train_dataset=ParityTokens(cli.train_size),
                      eval_dataset=ParityTokens(512, seed=1), compute_metrics=compute_metrics)
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
