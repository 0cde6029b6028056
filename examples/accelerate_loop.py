"""Train a small conv net with Hugging Face Accelerate, the way Accelerate's docs show it: an Accelerator, the
model, optimizer, loaders and LR scheduler through accelerator.prepare(), accelerator.backward(loss), then
optimizer.step(), scheduler.step(), optimizer.zero_grad(). The images are made on the fly from a seed (a bright
square in one of four quadrants, on noise), so nothing is downloaded. It does not import trainfast:

    python examples/accelerate_loop.py
    trainfast ablate -- python examples/accelerate_loop.py

switches it from the inside (mixed_precision, dynamo_backend, the fused AdamW, channels_last, the training
loader's settings) through the Accelerator and the objects handed to prepare(), and proves each switch applied
by reading it back. --mixed-precision and --fused stand for a script that sets its own speed settings. Each
epoch's evaluation goes to accelerator.log (eval_loss, eval_accuracy): with --measure full, the rungs are
judged on it (eval_loss, the validation loss, as the script declares no metric of its own)."""
import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


def quadrant_images(size: int, seed: int, image_size: int = 24) -> TensorDataset:
    """`size` noisy 3-channel images, each labelled by the quadrant (0-3) that holds a brighter square."""
    g = torch.Generator().manual_seed(seed)
    images = 0.5 * torch.randn(size, 3, image_size, image_size, generator=g)
    labels = torch.randint(0, 4, (size,), generator=g)
    half, quarter = image_size // 2, image_size // 4
    for quadrant in range(4):
        top, left = (quadrant // 2) * half + quarter // 2, (quadrant % 2) * half + quarter // 2
        images[labels == quadrant, :, top:top + quarter, left:left + quarter] += 1.0
    return TensorDataset(images, labels)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=4800)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--mixed-precision", choices=["no", "bf16", "fp16"], default=None,
                        help="passed to Accelerator() (default: Accelerate's own, from its environment)")
    parser.add_argument("--fused", action="store_true", help="AdamW(fused=True)")
    cli = parser.parse_args()

    accelerator = Accelerator(mixed_precision=cli.mixed_precision)
    set_seed(0)
    train_loader = DataLoader(quadrant_images(cli.train_size, seed=0), batch_size=cli.batch_size, shuffle=True)
    eval_loader = DataLoader(quadrant_images(512, seed=1), batch_size=256)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cli.lr, **({"fused": True} if cli.fused else {}))
    total = cli.epochs * len(train_loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / total))
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler)

    for epoch in range(cli.epochs):
        model.train()
        for inputs, targets in train_loader:
            loss = F.cross_entropy(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        model.eval()
        correct = seen = 0
        total_loss = 0.0
        with torch.no_grad():
            for inputs, targets in eval_loader:
                logits = model(inputs)
                logits, targets = accelerator.gather_for_metrics((logits, targets))
                total_loss += F.cross_entropy(logits.float(), targets, reduction="sum").item()
                correct += (logits.argmax(dim=1) == targets).sum().item()
                seen += len(targets)
        accelerator.log({"eval_loss": total_loss / seen, "eval_accuracy": correct / seen}, step=epoch)
        accelerator.print(f"epoch {epoch + 1}: train loss {loss.item():.4f}  eval loss {total_loss / seen:.4f}  "
                          f"eval accuracy {correct / seen:.4f}")


if __name__ == "__main__":
    main()
