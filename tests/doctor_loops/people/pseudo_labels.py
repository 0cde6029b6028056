# semi-supervised self-training (pseudo-labels): the model labels an unlabeled batch under no_grad *in training mode*
# (intended: BN uses batch stats for both passes), then trains on labeled + confident pseudo-labeled data
import torch, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from common import digits, SmallCNN
torch.manual_seed(0)
(xt, yt), (xv, yv) = digits()
lab, unl = 300, len(xt) - 300
labeled = DataLoader(TensorDataset(xt[:lab], yt[:lab]), batch_size=16, shuffle=True, drop_last=True)
unlabeled = DataLoader(TensorDataset(xt[lab:]), batch_size=32, shuffle=True, drop_last=True)
val_loader = DataLoader(TensorDataset(xv, yv), batch_size=128)
model = SmallCNN()
optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, nesterov=True)
threshold = 0.9
for epoch in range(3):
    model.train()
    lab_iter = iter(labeled)
    for (xu,) in unlabeled:
        try:
            xl, yl = next(lab_iter)
        except StopIteration:
            lab_iter = iter(labeled); xl, yl = next(lab_iter)
        with torch.no_grad():
            probs = torch.softmax(model(xu), dim=1)
            conf, pseudo = probs.max(dim=1)
            mask = (conf >= threshold).float()
        logits = model(torch.cat([xl, xu]))
        loss = F.cross_entropy(logits[:len(xl)], yl) + (F.cross_entropy(logits[len(xl):], pseudo, reduction="none") * mask).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum() for x, y in val_loader)
    print(f"epoch {epoch} acc {correct.item() / len(xv):.3f}")
