"""The loop a user runs today: timm's train.py with `--amp`, reduced to what it does on this workload.

torchvision's default ImageFolder pipeline (PIL decode, RandomResizedCrop + flip, ToTensor, Normalize), a timm
model from random weights, AdamW, autocast in the given dtype (a GradScaler with fp16), `zero_grad()` with
torch's default, one evaluation pass over val/ and one checkpoint per epoch (timm's train.py does both by
default). Prints a JSON line per epoch with its seconds (training and evaluation, as trainfast's metrics.jsonl
records them), then one at the end: the final val accuracy.

    python benchmarks/peers/plain_timm_style.py --data PHOTOS --model resnet18 --image-size 128 \
        --batch-size 128 --epochs 2 --out /tmp/plain
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import timm
import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size = args.image_size
    train_tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    val_tf = transforms.Compose([transforms.Resize(int(size / 0.875)), transforms.CenterCrop(size),
                                 transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    train_set = datasets.ImageFolder(Path(args.data) / "train", train_tf)
    val_set = datasets.ImageFolder(Path(args.data) / "val", val_tf)
    pin = device.type == "cuda"
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True,
                              num_workers=args.workers, pin_memory=pin, persistent_workers=args.workers > 0)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, num_workers=args.workers, pin_memory=pin)

    model = timm.create_model(args.model, pretrained=False, num_classes=len(train_set.classes)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.precision]
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    loss_fn = nn.CrossEntropyLoss()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    accuracy = 0.0
    for epoch in range(args.epochs):
        started = time.perf_counter()
        model.train()
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            with torch.autocast(device.type, dtype=dtype, enabled=args.precision != "fp32"):
                loss = loss_fn(model(images), labels)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in val_loader:
                images, labels = images.to(device), labels.to(device)
                with torch.autocast(device.type, dtype=dtype, enabled=args.precision != "fp32"):
                    correct += (model(images).argmax(1) == labels).sum().item()
                total += labels.numel()
        accuracy = correct / max(1, total)
        print(json.dumps({"epoch": epoch + 1, "epoch_time_s": time.perf_counter() - started}), flush=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                   out / "last.pth")
    print(json.dumps({"val_accuracy": accuracy}))


if __name__ == "__main__":
    main()
