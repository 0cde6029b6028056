"""The tutorial's loop, all in main(): zero_grad, forward, loss, backward, step; the loss printed every
log_interval steps; evaluation inline at the end of each epoch (model.eval(), torch.no_grad())."""
import contextlib

import torch
import torch.nn.functional as F
from loopkit import build, parse


def main(argv=None) -> None:
    args = parse(argv, __doc__)
    plant = args.plant
    model, train_loader, val_loader = build(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        model.train()
        running_loss = 0.0
        for step, (inputs, targets) in enumerate(train_loader):
            if "no_zero_grad" not in plant:
                optimizer.zero_grad(set_to_none="zero_grad_in_place" not in plant)
            outputs = model(inputs)
            loss = F.cross_entropy(outputs, targets)
            loss.backward()
            optimizer.step()
            if "item_per_step" in plant:
                running_loss += loss.item()
            elif step % args.log_interval == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")

        if "eval_in_train_mode" not in plant:
            model.eval()
        correct = 0
        with contextlib.nullcontext() if "eval_with_grad" in plant else torch.no_grad():
            for inputs, targets in val_loader:
                correct += (model(inputs).argmax(dim=1) == targets).sum().item()
        print(f"epoch {epoch}: val accuracy {correct / len(val_loader.dataset):.3f}")


if __name__ == "__main__":
    main()
