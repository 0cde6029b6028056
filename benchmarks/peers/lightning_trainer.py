"""The same work under a Lightning Trainer with its best precision flag on this device.

The same model (timm, random weights), the same torchvision ImageFolder pipeline as plain_timm_style.py,
AdamW (with --channels-last: the model and each batch converted, as a user would);
Trainer(precision="bf16-mixed" | "16-mixed" | "32-true"), validation every epoch and Lightning's
default checkpoint (one per epoch), no logger, no progress bar. Needs `lightning` importable: peers.py
installs it into benchmarks/.peers-lib (never a dependency of trainfast) and puts that on PYTHONPATH.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import lightning as L
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_timm_style import MEAN, STD  # noqa: E402  (one definition of the pipeline's statistics)


class Classifier(L.LightningModule):
    def __init__(self, model: nn.Module, lr: float, weight_decay: float) -> None:
        super().__init__()
        self.model, self.lr, self.weight_decay = model, lr, weight_decay
        self.loss_fn = nn.CrossEntropyLoss()
        self.correct = self.total = 0
        self.memory_format = torch.contiguous_format

    def layout(self, images: torch.Tensor) -> torch.Tensor:
        """Lightning has no channels_last flag: a user converts the model and each batch, as here."""
        return images.contiguous(memory_format=self.memory_format)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return self.loss_fn(self.model(self.layout(images)), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        images = self.layout(images)
        self.correct += (self.model(images).argmax(1) == labels).sum().item()
        self.total += labels.numel()

    def on_validation_epoch_start(self):
        self.correct = self.total = 0

    # An epoch's seconds, training and its validation (Lightning validates before on_train_epoch_end), as
    # trainfast's metrics.jsonl and the plain loop record them.
    def on_train_epoch_start(self):
        self.started = time.perf_counter()

    def on_train_epoch_end(self):
        print(json.dumps({"epoch": self.current_epoch + 1, "epoch_time_s": time.perf_counter() - self.started}),
              flush=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


def main() -> None:
    import timm
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--channels-last", action="store_true", help="model and batches in channels_last")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    L.seed_everything(0, verbose=False)
    size = args.image_size
    train_tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    val_tf = transforms.Compose([transforms.Resize(int(size / 0.875)), transforms.CenterCrop(size),
                                 transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    train_set = datasets.ImageFolder(Path(args.data) / "train", train_tf)
    val_set = datasets.ImageFolder(Path(args.data) / "val", val_tf)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True,
                              num_workers=args.workers, persistent_workers=args.workers > 0)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, num_workers=args.workers,
                            persistent_workers=args.workers > 0)
    model = timm.create_model(args.model, pretrained=False, num_classes=len(train_set.classes))
    module = Classifier(model, args.lr, args.weight_decay)
    if args.channels_last:
        module.memory_format = torch.channels_last
        model.to(memory_format=torch.channels_last)
    precision = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true"}[args.precision]
    trainer = L.Trainer(max_epochs=args.epochs, precision=precision, default_root_dir=args.out, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        deterministic=False)
    trainer.fit(module, train_loader, val_loader)
    print(json.dumps({"val_accuracy": module.correct / max(1, module.total)}))


if __name__ == "__main__":
    main()
