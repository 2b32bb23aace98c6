"""The user's own loop: featuredp's PrivacyEngine against Opacus's, and what featuredp's every-step checks cost there.

Opacus's tutorial loop on Adult (MLP 64, ghost, σ = 1, C = 1, expected batch 512, SGD with momentum), one epoch per
run, the arms interleaved in rounds, median samples/s:

* ``opacus`` — Opacus 1.6's PrivacyEngine (if installed);
* ``featuredp`` — featuredp's, only the import changed;
* ``featuredp-nochecks`` — the same with ghost's every-step separability check and forward guard switched off
  (timing only: that step has a weaker guarantee), to measure what the checks cost inside the engine's loop;
* ``featuredp+fdp`` — Algorithm 1 with ``Columns(private=["sex", "race"])`` in the same loop.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/own_loop_speed.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ARMS = ("opacus", "featuredp", "featuredp-nochecks", "featuredp+fdp")


def run(arm: str, train_set: Any, seed: int) -> float:
    """Samples/s of one epoch of the tutorial loop for ``arm`` (the first step, which plans the model, untimed)."""
    if arm == "opacus":
        from opacus import PrivacyEngine
    else:
        from featuredp import PrivacyEngine
    from featuredp.features import Columns

    torch.manual_seed(seed)
    x, y = torch.tensor(train_set.X), torch.tensor(train_set.y)
    model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 2))
    fdp = {"feature_map": Columns(private=["sex", "race"]), "dataset": train_set} if arm.endswith("fdp") else {}
    engine = PrivacyEngine()
    m, o, c, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=512), criterion=nn.CrossEntropyLoss(),
        noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode="ghost", **fdp)  # fmt: skip
    if arm == "featuredp-nochecks":
        from featuredp.experiments.throughput import _without_checks

        _without_checks(engine.run.strategy)
    seen, start = 0, 0.0
    for i, (xb, yb) in enumerate(loader):
        if i == 1:
            start = time.perf_counter()
        o.zero_grad()
        c(m(xb), yb).backward()
        o.step()
        seen += len(xb) if i >= 1 else 0
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from featuredp.data import load_dataset

    warnings.simplefilter("ignore")
    train_set, _ = load_dataset("adult")
    arms = list(ARMS)
    try:
        import opacus  # noqa: F401
    except ImportError:
        arms.remove("opacus")
    runs: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:  # the order rotates: drift hits every arm alike
            runs[arm].append(run(arm, train_set, seed=r))
    median = {a: statistics.median(v) for a, v in runs.items()}
    base = median.get("opacus")
    print(f"Adult, MLP 64, ghost, expected batch 512, one epoch a run; medians of {args.rounds} interleaved rounds")
    print(f"{'arm':22s} {'samples/s':>10s} {'÷ Opacus':>9s}")
    for a in arms:
        ratio = f"{median[a] / base:9.2f}" if base else "        -"
        print(f"{a:22s} {median[a]:10.0f} {ratio}")
    print(f"checks' share of featuredp's step: {1 - median['featuredp'] / median['featuredp-nochecks']:.0%}")


if __name__ == "__main__":
    main()
