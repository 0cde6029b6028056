"""A plain PyTorch loop (no trainfast.Session) with flags of its own, as research code has them: --amp (bf16
autocast around the forward), --dtype (bf16 autocast, entered only on CUDA, as many scripts guard it: on a CPU
the flag is accepted and does nothing), --channels-last (the model and its batches), --lr, --steps. `trainfast ablate --rung
NAME='--amp' -- python own_flags_loop.py` measures what each of its own flags buys. It writes the environment
variable OWN_FLAGS_NOTE to its output when set, so a rung's variables can be seen reaching it."""
import argparse
import contextlib
import os

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--channels-last", action="store_true")
    args = parser.parse_args()
    print(f"flags: {vars(args)} note: {os.environ.get('OWN_FLAGS_NOTE')}", flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 4))
    images, labels = torch.randn(64, 3, 16, 16), torch.randint(0, 4, (64,))
    if args.channels_last:
        model, images = model.to(memory_format=torch.channels_last), images.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    autocast = torch.autocast("cpu", torch.bfloat16) if args.amp else contextlib.nullcontext()
    if args.dtype == "bf16" and device == "cuda":
        autocast = torch.autocast("cuda", torch.bfloat16)
    for step in range(args.steps):
        batch = slice(16 * (step % 4), 16 * (step % 4 + 1))
        optimizer.zero_grad()
        with autocast:
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
