"""A plain PyTorch loop, as research code writes one: a tiny CNN, AdamW, a DataLoader, loss.backward(),
optimizer.step(), and a few flags of its own. No trainfast in it: the ablation reaches it through the probe's
hooks alone. `--dtype bf16` is entered only where `device == "cuda"` (as many scripts guard it), so on a CPU it
runs fp32 whatever the flag says. `--val` prints its accuracy as pytorch/examples' ImageNet script does (a
training line per step, ` * Acc@1 ... Acc@5 ...` after each epoch's validation). The odd shapes (`--two-models`, `--frozen-first`) are the loops in which the
trained model is ambiguous.

`main(argv)` returns the losses, so the tests run it in their own process too."""
from __future__ import annotations

import argparse
import contextlib

import torch
from torch import nn


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(8 * 16, 10))


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--own-autocast", action="store_true", help="bf16 autocast on any device")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--fused", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "lbfgs-like"))
    parser.add_argument("--two-models", action="store_true", help="a second model in the same optimizer")
    parser.add_argument("--frozen-first", action="store_true", help="a module no optimizer holds runs first")
    parser.add_argument("--two-optimizers", action="store_true", help="the conv in one optimizer, the rest in another")
    parser.add_argument("--autograd-grad", action="store_true", help="gradients by torch.autograd.grad, no backward")
    parser.add_argument("--clip", type=float, default=None, help="clip_grad_norm_ before the step")
    parser.add_argument("--val", action="store_true", help="print accuracy lines, the ImageNet script's shape")
    return parser.parse_args(argv)


class NoFusedSGD(torch.optim.Optimizer):
    """An optimizer of the script's own, with no fused or foreach form."""

    def __init__(self, params, lr=0.01):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def validate(model: nn.Module, device: str) -> None:
    """Accuracy on a held-out set of its own (its own generator: the training data and order are unchanged)."""
    generator = torch.Generator().manual_seed(1)
    images, labels = torch.randn(64, 3, 16, 16, generator=generator), torch.randint(0, 10, (64,), generator=generator)
    model.eval()
    with torch.no_grad():
        top5 = model(images.to(device)).float().topk(5, dim=1).indices.cpu()
    model.train()
    acc1 = (top5[:, 0] == labels).float().mean().item() * 100
    acc5 = (top5 == labels[:, None]).any(dim=1).float().mean().item() * 100
    print(f" * Acc@1 {acc1:.3f} Acc@5 {acc5:.3f}", flush=True)


def main(argv=None) -> list[float]:
    args = parse(argv)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = cnn().to(device)
    extra = nn.Linear(10, 10).to(device) if args.two_models else None
    frozen = nn.Conv2d(3, 3, 1).to(device).requires_grad_(False) if args.frozen_first else None
    params = list(model.parameters()) + (list(extra.parameters()) if extra is not None else [])
    optimizer = (torch.optim.AdamW(params, lr=1e-3, fused=True if args.fused else None)
                 if args.optimizer == "adamw" else NoFusedSGD(params))
    second = torch.optim.SGD(params[2:], lr=1e-3) if args.two_optimizers else None
    if second is not None:
        optimizer = torch.optim.AdamW(params[:2], lr=1e-3)
    if args.compile:
        model = torch.compile(model)
    data = torch.utils.data.TensorDataset(torch.randn(args.steps * args.batch, 3, 16, 16),
                                          torch.randint(0, 10, (args.steps * args.batch,)))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, num_workers=args.workers)
    use_amp = args.own_autocast or (args.dtype == "bf16" and device == "cuda")
    losses = []
    model.train()
    for epoch in range(args.epochs):
        for i, (images, labels) in enumerate(loader):
            images, labels = images.to(device), labels.to(device)
            with torch.autocast(device, torch.bfloat16) if use_amp else contextlib.nullcontext():
                inputs = frozen(images) if frozen is not None else images
                outputs = model(inputs)
                if extra is not None:
                    outputs = extra(outputs)
            loss = nn.functional.cross_entropy(outputs.float(), labels)
            optimizer.zero_grad()
            if args.autograd_grad:
                for p, g in zip(params, torch.autograd.grad(loss, params)):
                    p.grad = g
            else:
                loss.backward()
            if args.clip is not None:
                torch.nn.utils.clip_grad_norm_(params, args.clip)
            optimizer.step()
            if second is not None:
                second.step()
                second.zero_grad()
            losses.append(loss.item())
            if args.val:
                batch_acc = (outputs.argmax(1) == labels).float().mean().item() * 100
                print(f"Epoch: [{epoch}][{i}/{len(loader)}]\tLoss {loss.item():.4f}\tAcc@1 {batch_acc:6.2f}")
        if args.val:
            validate(model, device)
    return losses


if __name__ == "__main__":
    main()
