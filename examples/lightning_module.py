"""Train a small convolutional net with PyTorch Lightning, the way Lightning's docs show it: a LightningModule
(training_step, configure_optimizers, train_dataloader), a Trainer and trainer.fit(). The images are made on
the fly from a seed, so nothing is downloaded. It does not import trainfast:

    trainfast ablate -- python examples/lightning_module.py

switches it from the inside (the Trainer's precision, channels_last, torch.compile, the fused AdamW, the
loader's settings) and proves each switch applied by reading it back from what Lightning ended up with. With
--measure full each rung is judged on what validation_step logs (val_loss, as no callback monitors a metric)."""
import argparse

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


def random_images(size: int, classes: int = 10, seed: int = 0) -> TensorDataset:
    """Random 3x32x32 images, each labelled by a fixed random linear rule on its 4x4 average-pooled colours:
    learnable by a small conv net, and the same for every run with the same seed."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(size, 3, 32, 32, generator=g)
    rule = torch.randn(3 * 4 * 4, classes, generator=torch.Generator().manual_seed(1234))
    labels = (F.adaptive_avg_pool2d(images, 4).flatten(1) @ rule).argmax(dim=1)
    return TensorDataset(images, labels)


class ConvNet(L.LightningModule):
    def __init__(self, classes: int = 10, lr: float = 3e-3, train_size: int = 4096, batch_size: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.head = nn.Linear(32 * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", (logits.argmax(dim=1) == y).float().mean(), prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        return DataLoader(random_images(self.hparams.train_size), batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(random_images(512, seed=1), batch_size=256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train-size", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    cli = parser.parse_args()

    L.seed_everything(0)
    model = ConvNet(train_size=cli.train_size, batch_size=cli.batch_size)
    trainer = L.Trainer(max_epochs=cli.epochs, accelerator="auto", devices=1, logger=False,
                        enable_checkpointing=False)
    trainer.fit(model)
    metrics = trainer.callback_metrics
    print(f"final train_loss {metrics['train_loss'].item():.4f}  val_loss {metrics['val_loss'].item():.4f}  "
          f"val_acc {metrics['val_acc'].item():.4f}")


if __name__ == "__main__":
    main()
