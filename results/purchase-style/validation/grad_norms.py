import os, sys, numpy as np, torch
torch.set_num_threads(1)
from featuredp.experiments import GridConfig, GridRunner
from featuredp.engine import Trainer, init_seed
from featuredp.features import Columns
from featuredp.losses import GaussianPadding, Masking
from featuredp.models import build_model, spec_for
r = GridRunner(GridConfig(dataset="purchase-style", out="/tmp/fdpdiag/x", progress=False))
tr, va = r.validation
print("train_sub", tr.n, "val", va.n, "d", len(tr.feature_names))
X = torch.as_tensor(tr.X, dtype=torch.float32)
print("x mean", X.mean().item(), "x std", X.std().item(), "row L1 mean", X.sum(1).mean().item())
fmap = Columns(private=list(tr.default_private)).bind(tr)
m = fmap.private_entries()["x"]
print("private cols", int(m.sum()), "row nnz private", X[:, m].sum(1).mean().item(), "public", X[:, ~m].sum(1).mean().item())
idx = torch.arange(400)
b = {"x": X[idx], "y": torch.as_tensor(tr.y[idx])}
def norms(model, fn, split, b):
    g = torch.Generator().manual_seed(0)
    d = split.draws(b, g)
    out = []
    ps = [p for p in model.parameters()]
    for i in range(len(b["y"])):
        bi = {k: v[i:i+1] for k, v in b.items()}; di = {k: v[i:i+1] for k, v in d.items()}
        l = fn(model, bi, di).sum()
        gr = torch.autograd.grad(l, ps)
        out.append(torch.sqrt(sum((x**2).sum() for x in gr)).item())
    return np.array(out)
def q(a): return " ".join(f"{v:.3f}" for v in np.quantile(a, [0.1, 0.5, 0.9]))
for name, mk in [("pad1.0", lambda: GaussianPadding(fmap, scale=1.0)), ("pad0.25", lambda: GaussianPadding(fmap, scale=0.25)), ("zero", lambda: Masking(fmap))]:
    split = mk().bind(tr)
    spec = spec_for(tr, "mlp", hidden=[300])
    net = build_model(spec, seed=init_seed(0))
    print(name, "init   |g_full| q10/50/90:", q(norms(net, split.loss, split, b)), " |g_priv|:", q(norms(net, split.private_loss, split, b)), " |g_pub|:", q(norms(net, split.public_loss, split, b)))
    t = Trainer(net, "public", loss_split=split, epochs=4, batch_size=1250, lr=0.2, momentum=0.9, seed=0, progress=False)
    t.fit(tr)
    print(name, "pretr4 |g_full| q10/50/90:", q(norms(net, split.loss, split, b)), " |g_priv|:", q(norms(net, split.private_loss, split, b)), " |g_pub|:", q(norms(net, split.public_loss, split, b)))
