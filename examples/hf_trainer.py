"""Fine-tune a small BERT for sequence classification with transformers' Trainer, the way the transformers
docs show it: a model built from a config (random weights, nothing downloaded), a dataset made on the fly,
TrainingArguments and Trainer.train(). It does not import trainfast:

    trainfast ablate -- python examples/hf_trainer.py

switches it from the inside (bf16, torch_compile, the fused AdamW, the loader's workers) through the
Trainer's own arguments, and proves each switch applied by reading it back. With --measure full each rung is
judged on the Trainer's own evaluation: eval_accuracy from compute_metrics, the metric_for_best_model.

`--model cnn` trains a small conv net on generated images instead (any nn.Module whose forward returns the loss
and the logits trains under the Trainer): the switches that pay on conv nets, bf16 and channels_last, then have
something to act on, on a CPU too."""
import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
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


class QuadrantImages(Dataset):
    """3x32x32 noise images, each with a slightly brighter 16x16 square in one quadrant (1.2% of the range:
    faint enough that an epoch leaves it partly learnt), labelled by that quadrant."""

    def __init__(self, size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (size,), generator=g)
        self.images = torch.rand(size, 3, 32, 32, generator=g)
        for image, label in zip(self.images, self.labels):
            row, col = divmod(int(label), 2)
            image[:, 16 * row:16 * row + 16, 16 * col:16 * col + 16] += 0.012

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"pixel_values": self.images[i], "labels": self.labels[i]}


class SmallCNN(nn.Module):
    """Four 3x3 conv blocks and a linear head; returns the loss with the logits, as the Trainer expects."""

    def __init__(self, width: int = 64, classes: int = 4) -> None:
        super().__init__()
        layers, channels = [], 3
        for out in (width, width, 2 * width, 2 * width):
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(), nn.MaxPool2d(2)]
            channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels * 2 * 2, classes)

    def forward(self, pixel_values, labels=None):
        logits = self.head(self.features(pixel_values).flatten(1))
        return {"loss": F.cross_entropy(logits, labels) if labels is not None else None, "logits": logits}


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
    parser.add_argument("--model", choices=("bert", "cnn"), default="bert")
    cli = parser.parse_args()

    if cli.model == "cnn":
        model, train, held_out = SmallCNN(), QuadrantImages(cli.train_size), QuadrantImages(512, seed=1)
    else:
        config = BertConfig(vocab_size=128, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=256, max_position_embeddings=64, num_labels=2)
        model, train, held_out = (BertForSequenceClassification(config), ParityTokens(cli.train_size),
                                  ParityTokens(512, seed=1))
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
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=held_out,
                      compute_metrics=compute_metrics)
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
