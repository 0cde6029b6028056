"""A Session loop whose step time is set by the recipe that reaches it, on a virtual clock: each step advances
`time.perf_counter` (the clock trainfast's step timer reads) by a pace that a half precision makes 0.6x and
set_to_none 0.5x. The timings are then exact whatever else runs on the machine, so what `trainfast tune --
COMMAND` decides from them is deterministic: both gains, combined. Reports `val_accuracy`."""
import argparse
import time

import torch
from torch import nn

import trainfast

PACE_S = 0.04


class VirtualClock:
    def __init__(self) -> None:
        self.now = time.perf_counter()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    clock = time.perf_counter = VirtualClock()
    tf = trainfast.Session()
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    model = nn.Linear(8, 2)
    # One loader worker: trainfast then leaves the check for disturbance by other processes out (it compares the
    # machine's real CPU time with the clock, here virtual).
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, num_workers=1, persistent_workers=True)
    model, optimizer, loader = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    recipe = tf.recipe
    pace = PACE_S * (0.6 if recipe.precision != "fp32" else 1.0) * (0.5 if recipe.set_to_none else 1.0)
    step = 0
    while step < args.steps:
        for inputs, targets in loader:
            clock.advance(pace)
            optimizer.zero_grad()
            tf.backward(nn.functional.cross_entropy(model(inputs), targets))
            optimizer.step()
            step += 1
    tf.report(val_accuracy=0.9 + 0.001 * (recipe.seed % 3))


if __name__ == "__main__":
    main()
