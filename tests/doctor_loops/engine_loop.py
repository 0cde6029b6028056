"""The detection reference engine's order: forward, loss, then zero_grad, backward, step (zero_grad comes after
the forward); train_one_epoch() and an evaluate() under @torch.inference_mode(), called from main(); the loss
summed on the device and read once per epoch."""
import contextlib
import math

import torch
import torch.nn.functional as F
from loopkit import build, parse


def train_one_epoch(model, optimizer, data_loader, epoch, plant):
    model.train()
    loss_sum = torch.zeros(())
    for images, targets in data_loader:
        outputs = model(images)
        loss = F.cross_entropy(outputs, targets)
        if "item_per_step" in plant:
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise SystemExit(f"loss is {loss_value}, stopping training")
        if "no_zero_grad" not in plant:
            optimizer.zero_grad(set_to_none="zero_grad_in_place" not in plant)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach()
    print(f"epoch {epoch}: mean train loss {loss_sum.item() / len(data_loader):.4f}")


def evaluate(model, data_loader, plant):
    if "eval_in_train_mode" not in plant:
        model.eval()
    correct = torch.zeros((), dtype=torch.long)
    with contextlib.nullcontext() if "eval_with_grad" in plant else torch.inference_mode():
        for images, targets in data_loader:
            correct += (model(images).argmax(dim=1) == targets).sum()
    return correct.item() / len(data_loader.dataset)


def main(argv=None) -> None:
    args = parse(argv, __doc__)
    model, train_loader, val_loader = build(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1)
    for epoch in range(args.epochs):
        train_one_epoch(model, optimizer, train_loader, epoch, args.plant)
        lr_scheduler.step()
        print(f"epoch {epoch}: val accuracy {evaluate(model, val_loader, args.plant):.3f}")


if __name__ == "__main__":
    main()
