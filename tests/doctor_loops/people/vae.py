# VAE as in pytorch/examples (vae/main.py): reparameterize samples with randn_like in forward (no self.training check),
# loss = BCE + KLD, eval each epoch under model.eval() + no_grad
import torch, torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from common import digits

class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 64); self.fc21 = nn.Linear(64, 8); self.fc22 = nn.Linear(64, 8)
        self.fc3 = nn.Linear(8, 64); self.fc4 = nn.Linear(64, 64)
    def encode(self, x):
        h1 = F.relu(self.fc1(x)); return self.fc21(h1), self.fc22(h1)
    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar); eps = torch.randn_like(std); return mu + eps * std
    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))
    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar

def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld

torch.manual_seed(0)
(xt, _), (xv, _) = digits()
train_loader = DataLoader(TensorDataset(xt), batch_size=32, shuffle=True)
test_loader = DataLoader(TensorDataset(xv), batch_size=128)
model = VAE()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(3):
    model.train()
    train_loss = torch.zeros(())
    for batch_idx, (data,) in enumerate(train_loader):
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        train_loss += loss.detach()
        optimizer.step()
    model.eval()
    test_loss = torch.zeros(())
    with torch.no_grad():
        for (data,) in test_loader:
            recon, mu, logvar = model(data)
            test_loss += loss_function(recon, data, mu, logvar)
    print(f"epoch {epoch} train {train_loss.item() / len(xt):.3f} test {test_loss.item() / len(xv):.3f}")
