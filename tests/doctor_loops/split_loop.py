"""The loop split across functions as pytorch/examples' mnist does: set-up in main(), train(args, ...) and
test(...) per epoch; here the gradients are cleared after the step (forward, loss, backward, step, then
model.zero_grad()), and the loss printed every log_interval batches."""
import contextlib

import torch
import torch.nn.functional as F
from loopkit import build, parse


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    losses = []
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()
        if "no_zero_grad" not in args.plant:
            model.zero_grad(set_to_none="zero_grad_in_place" not in args.plant)
        if "item_per_step" in args.plant:
            losses.append(loss.item())
        elif batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]"
                  f"\tLoss: {loss.item():.6f}")


def test(args, model, device, test_loader):
    if "eval_in_train_mode" not in args.plant:
        model.eval()
    test_loss, correct = 0.0, 0
    with contextlib.nullcontext() if "eval_with_grad" in args.plant else torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.cross_entropy(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    n = len(test_loader.dataset)
    print(f"Test set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n}")


def main(argv=None) -> None:
    args = parse(argv, __doc__)
    device = torch.device("cpu")
    model, train_loader, test_loader = build(args)
    model = model.to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(args, model, device, test_loader)
        scheduler.step()


if __name__ == "__main__":
    main()
