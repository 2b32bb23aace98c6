"""Accuracy cost of the floating-point-safe one-shot mechanisms: mean absolute error of a count's release.

Old: fl(value + numpy Laplace(1/ε)) and fl(value + N(0, σ²)) (σ analytic at δ = 1e-5); new: LaplaceMechanism and
GaussianMechanism (the discrete Laplace / Gaussian on the grid Λ, exact samplers). Run:
``OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/mechanisms_grid.py`` (about a minute on one core).
"""

from __future__ import annotations

import numpy as np

from featuredp.mechanisms.classic import GaussianMechanism, LaplaceMechanism, analytic_gaussian_sigma

N = 20_000
COUNT = 1234.0


def main() -> None:
    """Print one row per mechanism and ε."""
    rng = np.random.default_rng(0)
    print(f"{'mechanism':10} {'eps':>5} {'old MAE':>10} {'new MAE':>10} {'ratio':>7} {'grid':>12}")
    for eps in (0.1, 1.0, 8.0):
        lap = LaplaceMechanism(eps)
        old = np.abs(COUNT + rng.laplace(0.0, 1 / eps, N) - COUNT).mean()
        new = np.abs(np.array([lap.release(COUNT, rng=rng) for _ in range(N)]) - COUNT).mean()
        print(f"{'laplace':10} {eps:5g} {old:10.5f} {new:10.5f} {new / old:7.4f} {lap.grid:12.6g}")
        gau = GaussianMechanism(eps, 1e-5)
        old = np.abs(rng.normal(0.0, analytic_gaussian_sigma(eps, 1e-5), N)).mean()
        new = np.abs(np.array([gau.release(COUNT, rng=rng) for _ in range(N)]) - COUNT).mean()
        print(f"{'gaussian':10} {eps:5g} {old:10.5f} {new:10.5f} {new / old:7.4f} {gau.grid:12.6g}")


if __name__ == "__main__":
    main()
