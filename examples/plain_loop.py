"""A plain PyTorch classification loop, and the same loop adopted by trainfast.Session.

plain_loop.py: the handwritten digits that ship with scikit-learn (no download), a small conv net, AdamW, a few
dozen steps, then the held-out accuracy. adopted_loop.py: the same file with the import and three changed
lines (Session(), setup(...), tf.backward(loss)), plus one optional line (tf.report) for the ablation's full
mode; the model, the data and the loss are untouched. With the
default recipe (fp32, every technique off) both print the same numbers, bit for bit; with a recipe, from the
code or from the TRAINFAST_RECIPE environment variable, the adopted loop runs with the recipe's techniques:

    python examples/plain_loop.py
    python examples/adopted_loop.py
    TRAINFAST_RECIPE='{"precision": "bf16", "channels_last": true}' python examples/adopted_loop.py
    trainfast ablate -- python examples/adopted_loop.py --epochs 60     # what each switch buys in this loop
    trainfast ablate --target auto -- python examples/adopted_loop.py --epochs 8 --eval-every 10
                                    # ... and how soon each reaches the baseline's final accuracy (its reports)
"""
import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def digits(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """1,797 real 8x8 scans in [0, 1]; 360 held out (a fixed split)."""
    x, y = load_digits(return_X_y=True)
    images = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    labels = torch.tensor(y)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    val, train = order[:360], order[360:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--eval-every", type=int, default=0, metavar="N",
                        help="evaluate every N optimizer steps (default: once, at the end of each epoch)")
    args = parser.parse_args()

    torch.manual_seed(0)
    train_set, val_set = digits()
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=256)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    eval_every = args.eval_every or len(train_loader)
    step = 0
    for epoch in range(args.epochs):
        model.train()
        for inputs, targets in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            step += 1
            if step % eval_every:
                continue
            model.eval()
            correct = 0
            with torch.no_grad():
                for val_inputs, val_targets in val_loader:
                    correct += (model(val_inputs).argmax(dim=1) == val_targets).sum().item()
            accuracy = correct / len(val_set)
            print(f"epoch {epoch + 1} step {step}: train loss {loss.item():.4f}  val accuracy {accuracy:.4f}")
            model.train()
    print(f"final train_loss={loss.item()!r} val_accuracy={accuracy!r}")


if __name__ == "__main__":
    main()
