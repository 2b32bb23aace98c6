"""Your own loop on several processes: ``torchrun --nproc-per-node 2 examples/own_loop_torchrun.py``.

Nothing in the loop changes. Under torchrun (gloo on CPU, NCCL on GPUs) the engine finds the process group: each
rank's loader Poisson-samples its own shard of the records at the global rate, from secret coins of its own; each
rank computes its shard's clipped sum; rank 0 alone adds the noise before the all-reduce, so the noisy total (and
every rank's update) is the one-process mechanism's. Every rank must build the same model, optimizer and settings
(the engine checks the plan and settings agree, and refuses on every rank if not).

Prints, on rank 0, ε and the accuracy, and (``--out FILE``) writes them with every rank's parameter checksum.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from featuredp import PrivacyEngine


def main(out: str | None = None, epochs: int = 2) -> None:
    """Train a small MLP with DP-SGD under torchrun; rank 0 reports."""
    warnings.simplefilter("ignore", UserWarning)
    torch.manual_seed(0)  # the data and the initialisation only: the same on every rank
    x = torch.randn(1200, 8)
    y = (x[:, 0] - x[:, 1] > 0).long()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    engine = PrivacyEngine()
    model, optimizer, criterion, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=DataLoader(TensorDataset(x, y), batch_size=60),
        criterion=nn.CrossEntropyLoss(), noise_multiplier=1.0, max_grad_norm=1.0, epochs=epochs,
        grad_sample_mode="ghost")
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = criterion(model(xb), yb)
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    rank = int(os.environ.get("RANK", "0"))
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    report = {"rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "steps": engine.steps,
              "epsilon": engine.get_epsilon(1e-5), "accuracy": accuracy, "checksum": checksum}  # fmt: skip
    if rank == 0:
        print(f"{report['world_size']} process(es), {engine.steps} private steps: epsilon {report['epsilon']:.3f} at "
              f"delta 1e-5, training accuracy {accuracy:.3f}")  # fmt: skip
    if out:
        with open(f"{out}.{rank}", "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write each rank's report to OUT.<rank> (JSON)")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    main(args.out, args.epochs)
