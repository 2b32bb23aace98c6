"""Opacus's image-classifier tutorial shape in the user's loop: featuredp's PrivacyEngine against Opacus's, ghost.

sklearn's digits (1,500 8×8 images, offline), two Conv2d layers each followed by GroupNorm(C, C) (what Opacus's
``ModuleValidator.fix`` makes of BatchNorm2d for C ≤ 32), expected batch 100, σ = 1, C = 1; one epoch per run,
interleaved rounds, median samples/s (the first step of each run, which plans the model, not timed); a third arm
times featuredp with its every-step checks off, to show what they cost.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/cnn_tutorial_speed.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(16, 16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(32, 32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, 10))  # fmt: skip


def run(library: str, data: TensorDataset) -> float:
    """Samples/s of one epoch of the tutorial loop with ``library``'s PrivacyEngine (``featuredp-nochecks``: ghost's
    every-step check and forward guard switched off, to measure what they cost; that step has a weaker guarantee)."""
    if library == "opacus":
        from opacus import PrivacyEngine
    else:
        from featuredp import PrivacyEngine
    model = cnn()
    engine = PrivacyEngine()
    out = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              data_loader=DataLoader(data, batch_size=100), noise_multiplier=1.0,
                              max_grad_norm=1.0, grad_sample_mode="ghost", criterion=nn.CrossEntropyLoss())
    if library == "featuredp-nochecks":
        from featuredp.experiments.throughput import _without_checks

        _without_checks(engine.run.strategy)
    m, o, criterion, loader = out
    batches = iter(loader)
    x, y = next(batches)
    o.zero_grad()
    criterion(m(x), y).backward()
    o.step()
    seen, start = 0, time.perf_counter()
    for x, y in batches:
        o.zero_grad()
        criterion(m(x), y).backward()
        o.step()
        seen += len(x)
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    digits = load_digits()
    x = torch.tensor(digits.images[:1500] / 16.0, dtype=torch.float32).unsqueeze(1)
    data = TensorDataset(x, torch.tensor(digits.target[:1500], dtype=torch.long))
    runs: dict[str, list[float]] = {"opacus": [], "featuredp": [], "featuredp-nochecks": []}
    for _ in range(args.rounds):
        for library in runs:
            runs[library].append(run(library, data))
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"without the every-step checks (timing only): {med['featuredp-nochecks']:.0f} samples/s, "
          f"{med['featuredp-nochecks'] / med['opacus']:.2f} × Opacus")
    print(f"samples/s (median of {args.rounds}): Opacus {med['opacus']:.0f}, featuredp {med['featuredp']:.0f}; "
          f"featuredp ÷ Opacus {med['featuredp'] / med['opacus']:.2f}")


if __name__ == "__main__":
    main()
