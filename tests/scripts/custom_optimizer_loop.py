"""A Session loop whose optimizer is not one of torch's: plain SGD written by hand. Every rung trains it,
except optimizer_impl=fused, which cannot rebuild it (it takes no `fused` argument): that run fails with a
message naming the optimizer, and the ablation goes on with the other rungs."""
import torch
from torch import nn

import trainfast

EPOCHS = 4000       # more than a run takes: speed mode stops it once timed (2 s of 0.5 ms steps on a fast CPU)


class HandSGD(torch.optim.Optimizer):
    def __init__(self, params, lr=0.05):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def main() -> None:
    tf = trainfast.Session()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    data = torch.utils.data.TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True)
    model, optimizer, loader = tf.setup(model, HandSGD(model.parameters()), loader)
    for _ in range(EPOCHS):
        for inputs, targets in loader:
            optimizer.zero_grad()
            tf.backward(nn.functional.cross_entropy(model(inputs), targets))
            optimizer.step()


if __name__ == "__main__":
    main()
