# tiny MLP on the 64 digit features, TensorDataset + DataLoader(batch_size=64, shuffle=True), num_workers=0 (the default)
import torch, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from common import digits, MLP
import sys
torch.manual_seed(0)
(xt, yt), (xv, yv) = digits()
nw = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if __name__ == "__main__":
    train_loader = DataLoader(TensorDataset(xt.flatten(1), yt), batch_size=64, shuffle=True, num_workers=nw, persistent_workers=nw > 0)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(6):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            acc = (model(xv.flatten(1)).argmax(1) == yv).float().mean().item()
        print(f"epoch {epoch} acc {acc:.3f}")
