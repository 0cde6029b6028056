"""A framework script whose bf16 rung is faster but ruins its metric, on purpose, to prove the accuracy guard
keeps such a rung from being recommended (tests/test_fw_guard.py). Run as `python fw_hurt.py --framework hf`
(or lightning, accelerate): it never imports trainfast. It reads its precision back from its framework, as
the ablation's switch left it, and in bf16 sets a learning rate of 0 (the model never learns: its validation
metric stays at its initial value). Every training forward pass sleeps, 100 ms in fp32 and 10 ms in bf16, so
the bf16 rung is measured faster, by a margin this busy machine's noise cannot hide, whatever bf16 does for so
small a model. One epoch, evaluated once at its end (no evaluation between two timed steps). Each framework evaluates the way it does:
the Trainer's compute_metrics with metric_for_best_model, Lightning's logged val_loss, accelerator.log."""
import argparse
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

SLOW_S, FAST_S = 0.1, 0.01     # what an fp32 and a bf16 training step cost, on purpose


class Blobs(Dataset):
    """Two Gaussian blobs in 8 dimensions (separable): a small MLP learns them in a few dozen steps."""

    def __init__(self, size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 2, (size,), generator=g)
        self.x = torch.randn(size, 8, generator=g) + (2 * self.y[:, None] - 1) * 0.8

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class MLP(nn.Module):
    def __init__(self, slow: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            time.sleep(SLOW_S if self.slow else FAST_S)
        return self.net(x)


def mlp(slow: bool = False) -> nn.Module:
    return MLP(slow)


def run_hf(epochs: int) -> None:
    import numpy as np
    from transformers import Trainer, TrainingArguments

    class Model(nn.Module):
        def __init__(self, slow: bool) -> None:
            super().__init__()
            self.net = mlp(slow)

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
    trainer = Trainer(model=Model(slow=not args.bf16), args=args, train_dataset=Blobs(512, 0),
                      eval_dataset=Blobs(256, 1), data_collator=collate, compute_metrics=compute_metrics)
    trainer.train()
    print(trainer.evaluate())


def run_lightning(epochs: int) -> None:
    import lightning as L

    L.seed_everything(0)

    class Module(L.LightningModule):
        def __init__(self, lr: float, slow: bool) -> None:
            super().__init__()
            self.net, self.lr = mlp(slow), lr

        def training_step(self, batch, i):
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def validation_step(self, batch, i):
            self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        def train_dataloader(self):
            return DataLoader(Blobs(512, 0), batch_size=16, shuffle=True)

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
    model = mlp(slow=not bf16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0 if bf16 else 0.05)
    train = DataLoader(Blobs(512, 0), batch_size=16, shuffle=True)
    held_out = DataLoader(Blobs(256, 1), batch_size=64)
    model, optimizer, train, held_out = accelerator.prepare(model, optimizer, train, held_out)
    for epoch in range(epochs):
        model.train()
        for x, y in train:
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        losses = [F.cross_entropy(model(x).float(), y, reduction="sum") for x, y in held_out]
    accelerator.log({"eval_loss": (sum(losses) / len(held_out.dataset)).item()}, step=epochs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=["hf", "lightning", "accelerate"], required=True)
    parser.add_argument("--epochs", type=int, default=1)
    cli = parser.parse_args()
    {"hf": run_hf, "lightning": run_lightning, "accelerate": run_accelerate}[cli.framework](cli.epochs)
