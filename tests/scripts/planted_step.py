"""A training script whose step costs a known amount of real CPU work, set by the switch that reaches it: in fp32
every step does three times the fixed fp32 work it does once half precision is on, so the amp rung is 3x faster on any
CPU (the work runs outside autocast: its cost does not depend on the CPU's half-precision speed). Written as a
Session loop (--framework session) or as a LightningModule under Lightning's Trainer (--framework lightning,
which does not import trainfast: the precision is read from the Trainer).

With --hog-dir DIR, the first run with half precision on creates `hog-now` there (once: `claimed` marks
it taken), the signal for a CPU hog the test started to spin beside that one run."""
import argparse
import os

import torch
from torch import nn
from torch.nn import functional as F

SIZE = 384


def planted_work(half: bool) -> None:
    """Fixed fp32 matrix products: three times as many in fp32 as in half precision, outside autocast."""
    with torch.autocast("cpu", enabled=False):
        x = torch.ones(SIZE, SIZE) / SIZE
        for _ in range(8 if half else 24):
            x = x @ x


def claim_hog(where: str | None, half: bool) -> None:
    if not (where and half):
        return
    try:
        os.close(os.open(os.path.join(where, "claimed"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    open(os.path.join(where, "hog-now"), "w").close()


def data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 16, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())


def session_main(epochs: int, hog_dir: str | None) -> None:
    import trainfast

    torch.manual_seed(0)
    tf = trainfast.Session()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    loader = torch.utils.data.DataLoader(data(), batch_size=16, shuffle=True)
    model, optimizer, loader = tf.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    half = tf.recipe.precision != "fp32"
    claim_hog(hog_dir, half)
    for _ in range(epochs):
        for inputs, targets in loader:
            planted_work(half)
            optimizer.zero_grad()
            with tf.autocast():
                loss = F.cross_entropy(model(inputs), targets)
            tf.backward(loss)
            optimizer.step()
    tf.report(train_loss=float(loss))


def lightning_main(epochs: int, hog_dir: str | None) -> None:
    import lightning as L

    class Planted(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))

        def on_train_start(self) -> None:
            claim_hog(hog_dir, self.half)

        @property
        def half(self) -> bool:
            return "16" in str(self.trainer.precision)

        def training_step(self, batch, batch_idx):
            planted_work(self.half)
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            # Two loader workers: their CPU is the run's own, not other work on the machine.
            return torch.utils.data.DataLoader(data(), batch_size=16, shuffle=True, num_workers=2,
                                               persistent_workers=True)

    L.seed_everything(0)
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Planted())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=("session", "lightning"), default="session")
    # More than a run takes: speed mode stops it once its budget is timed (2 s of 3 ms steps on a fast CPU is
    # more than 3 epochs) or at its cap.
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--hog-dir", help="signal the first half-precision run to a CPU hog waiting on this folder")
    args = parser.parse_args()
    (session_main if args.framework == "session" else lightning_main)(args.epochs, args.hog_dir)


if __name__ == "__main__":
    main()
