"""A Session loop that leaves seeding to the Session (so the ablation's seeds reach it) and reports two
metrics, as `trainfast ablate --measure full` compares them: held-out accuracy and loss on sklearn's digits."""
import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn

import trainfast


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    tf = trainfast.Session()
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y)
    train = torch.utils.data.TensorDataset(x[360:], y[360:])
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10))
    loader = torch.utils.data.DataLoader(train, batch_size=32, shuffle=True)
    model, optimizer, loader = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.05), loader)
    for _ in range(args.epochs):
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad()
            tf.backward(nn.functional.cross_entropy(model(inputs), targets))
            optimizer.step()
    model.eval()
    with torch.no_grad():
        logits = model(x[:360])
    tf.report(val_accuracy=(logits.argmax(1) == y[:360]).float().mean(),
              val_loss=nn.functional.cross_entropy(logits, y[:360]))


if __name__ == "__main__":
    main()
