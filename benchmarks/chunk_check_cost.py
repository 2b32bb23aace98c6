"""What ghost clipping's chunk check costs on the MLP 600-300-100 at batch 1024 (docs/engine.md, "Trust model").

Times a DP-SGD step (ghost clipped sum at C = 0.01, Gaussian noise, SGD with momentum) with the chunk check off
and with it on every step, interleaved, one thread, and prints the cost per check and its share of a step at the
default rate. About a minute on one core.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/chunk_check_cost.py
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from featuredp.clipping import GhostGradients


def main(rounds: int = 6, reps: int = 3) -> None:
    """Print the step time without and with the chunk check, and its share at the default rate."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(600, 300), nn.ReLU(), nn.Linear(300, 100))

    def loss(m: nn.Module, b: dict, d: dict) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b["x"]), b["y"], reduction="none")

    batch = {"x": torch.randn(1024, 600), "y": torch.randint(0, 100, (1024,))}
    opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)  # lr 0: every round times the same model

    def step(strategy: GhostGradients) -> None:
        sums, _ = strategy.clipped_sum(model, loss, batch, {}, 0.01)
        for n, p in model.named_parameters():
            p.grad = (sums[n] + torch.randn_like(sums[n]) * 0.01) / 1024
        opt.step()

    strategies = {rate: GhostGradients() for rate in (0.0, 1.0)}
    for rate, strategy in strategies.items():
        strategy._chunk_check_rate = rate
        step(strategy)
    times: dict[float, list[float]] = {0.0: [], 1.0: []}
    for _ in range(rounds):
        for rate, strategy in strategies.items():
            t = time.perf_counter()
            for _ in range(reps):
                step(strategy)
            times[rate].append((time.perf_counter() - t) / reps)
    base, full = float(np.median(times[0.0])), float(np.median(times[1.0]))
    rate = GhostGradients._chunk_check_rate
    print(f"step without the chunk check {base * 1e3:.1f} ms, with it on every step {full * 1e3:.1f} ms; "
          f"per check {(full - base) * 1e3:.1f} ms; at the default rate {rate}: {rate * (full - base) / base:.1%} "
          "of a step")


if __name__ == "__main__":
    main()
