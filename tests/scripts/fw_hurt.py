"""A framework script whose bf16 rung is faster but ruins its metric, on purpose, to prove the accuracy guard
keeps such a rung from being recommended (tests/test_fw_guard.py). Run as `python fw_hurt.py --framework hf`
(or lightning, accelerate): it never imports trainfast. It reads its precision back from its framework, as
the ablation's switch left it, and in bf16 sets a learning rate of 0 (the model never learns: its validation
metric stays at its initial value); in fp32 it sleeps in every batch it loads (so the bf16 rung is measured
faster whatever bf16 does for so small a model on this machine). Each framework evaluates the way it does:
the Trainer's compute_metrics with metric_for_best_model, Lightning's logged val_loss, accelerator.log."""
import argparse
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

SLOW_S = 0.02          # what an fp32 batch costs on purpose


class Blobs(Dataset):
    """Two Gaussian blobs in 8 dimensions (separable): a small MLP learns them in a few dozen steps."""

    def __init__(self, size: int, seed: int, slow: bool = False) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 2, (size,), generator=g)
        self.x = torch.randn(size, 8, generator=g) + (2 * self.y[:, None] - 1) * 0.8
        self.slow = slow

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        if self.slow and i % 16 == 0:        # once a batch of 16
            time.sleep(SLOW_S)
        return self.x[i], self.y[i]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))


def run_hf(epochs: int) -> None:
    import numpy as np
    from transformers import Trainer, TrainingArguments

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def forward(self, x, labels=None):
            logits = self.net(x)
            return {"loss": F.cross_entropy(logits, labels), "logits": logits}

    def collate(batch):
        return {"x": torch.stack([b[0] for b in batch]), "labels": torch.stack([b[1] for b in batch])}

    def compute_metrics(prediction):
        logits, labels = prediction
        return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}

    args = TrainingArguments(output_dir="hf_out", num_train_epochs=epochs, per_device_train_batch_size=16,
                             learning_rate=0.05, eval_strategy="no", save_strategy="no", logging_strategy="no",
                             report_to="none", disable_tqdm=True, metric_for_best_model="accuracy", use_cpu=True,
                             optim="sgd", lr_scheduler_type="constant")
    if args.bf16:
        args.learning_rate = 0.0
    trainer = Trainer(model=Model(), args=args, train_dataset=Blobs(256, 0, slow=not args.bf16),
                      eval_dataset=Blobs(256, 1), data_collator=collate, compute_metrics=compute_metrics)
    trainer.train()
    print(trainer.evaluate())


def run_lightning(epochs: int) -> None:
    import lightning as L

    L.seed_everything(0)

    class Module(L.LightningModule):
        def __init__(self, lr: float, slow: bool) -> None:
            super().__init__()
            self.net, self.lr, self.slow = mlp(), lr, slow

        def training_step(self, batch, i):
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def validation_step(self, batch, i):
            self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        def train_dataloader(self):
            return DataLoader(Blobs(256, 0, slow=self.slow), batch_size=16, shuffle=True)

        def val_dataloader(self):
            return DataLoader(Blobs(256, 1), batch_size=64)

    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    bf16 = str(trainer.precision).startswith("bf16")
    trainer.fit(Module(0.0 if bf16 else 0.05, slow=not bf16))
    print(dict(trainer.callback_metrics))


def run_accelerate(epochs: int) -> None:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    accelerator = Accelerator(cpu=True)
    set_seed(0)
    bf16 = accelerator.mixed_precision == "bf16"
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0 if bf16 else 0.05)
    train = DataLoader(Blobs(256, 0, slow=not bf16), batch_size=16, shuffle=True)
    held_out = DataLoader(Blobs(256, 1), batch_size=64)
    model, optimizer, train, held_out = accelerator.prepare(model, optimizer, train, held_out)
    for epoch in range(epochs):
        for x, y in train:
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad():
            losses = [F.cross_entropy(model(x).float(), y, reduction="sum") for x, y in held_out]
        accelerator.log({"eval_loss": (sum(losses) / len(held_out.dataset)).item()}, step=epoch)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=["hf", "lightning", "accelerate"], required=True)
    parser.add_argument("--epochs", type=int, default=2)
    cli = parser.parse_args()
    {"hf": run_hf, "lightning": run_lightning, "accelerate": run_accelerate}[cli.framework](cli.epochs)
