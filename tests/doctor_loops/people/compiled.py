# torch.compile'd model, otherwise a standard loop
import torch, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from common import digits, MLP
torch.manual_seed(0)
(xt, yt), (xv, yv) = digits()
train_loader = DataLoader(TensorDataset(xt, yt), batch_size=64, shuffle=True, drop_last=True)
model = MLP()
cmodel = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
for epoch in range(3):
    cmodel.train()
    running = torch.zeros(())
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(cmodel(x), y)
        loss.backward()
        optimizer.step()
        running += loss.detach()
    cmodel.eval()
    with torch.no_grad():
        acc = (cmodel(xv).argmax(1) == yv).float().mean()
    print(f"epoch {epoch} loss {running.item() / len(train_loader):.4f} acc {acc.item():.3f}")
