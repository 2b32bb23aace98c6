"""The exact discrete samplers' timing side channel: time of one draw against the size of the noise it returns.

CKS 2020's rejection samplers (:mod:`featuredp.mechanisms._discrete`) loop once per unit of |Y|/t (the discrete
Laplace's geometric part) and ⌊(|Y| − σ²/t)²/(2σ²)⌋ times in the discrete Gaussian's acceptance test, so whoever
times a release learns about the noise, hence about the value (Jin et al., S&P 2022). This prints the median time of
a draw per bucket of |Y| in noise scales and the least-squares slope, in µs per noise scale, for the parameters the
mechanisms use at ε = 1, Δ = 1 (Laplace: t = 1024; Gaussian at δ = 1e-5: σ_Z ≈ 3820). Run:
``OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/discrete_sampler_timing.py`` (a few seconds on one core).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from featuredp.mechanisms._discrete import Bits, round_up
from featuredp.mechanisms.classic import GaussianMechanism


def timed_draws(draw: Callable[[], int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """n draws: their values and their times in µs (one perf_counter_ns pair each)."""
    values, times = np.empty(n), np.empty(n)
    for i in range(n):
        start = time.perf_counter_ns()
        values[i] = draw()
        times[i] = (time.perf_counter_ns() - start) / 1000
    return values, times


def report(name: str, values: np.ndarray, times: np.ndarray, scale: float, buckets: int = 6) -> float:
    """Print the median time per bucket ⌊|Y|/scale⌋ and return the slope (µs per scale) of time on |Y|/scale."""
    units = np.abs(values) / scale
    bucket = np.minimum(np.floor(units), buckets - 1).astype(int)
    print(f"{name}: scale {scale:g}, {values.size} draws")
    for b in range(buckets):
        sel = bucket == b
        label = f"[{b}, {b + 1})" if b < buckets - 1 else f">= {b}"
        if sel.any():
            print(f"  |Y|/scale {label:>8}: {int(sel.sum()):6d} draws, median {np.median(times[sel]):7.2f} µs")
    # the median regression would be more robust to load spikes; the trimmed least squares is simpler and close
    keep = times < np.quantile(times, 0.99)
    slope = float(np.polyfit(units[keep], times[keep], 1)[0])
    print(f"  slope: {slope:+.2f} µs per noise scale")
    return slope


def main() -> None:
    """Time the discrete Laplace and the discrete Gaussian at the mechanisms' ε = 1 parameters."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--draws", type=int, default=20_000)
    args = parser.parse_args()
    bits = Bits(None)  # OS entropy, as a release uses
    t = Fraction(1024)  # LaplaceMechanism(1.0).grid_scale(1)
    values, times = timed_draws(lambda: bits.discrete_laplace(t), args.draws)
    report("discrete Laplace", values, times, float(t))
    mech = GaussianMechanism(1.0, 1e-5)
    sigma2 = round_up((mech.sigma / mech.grid) ** 2)
    values, times = timed_draws(lambda: bits.discrete_gaussian(sigma2), args.draws)
    report("discrete Gaussian", values, times, float(sigma2) ** 0.5)


if __name__ == "__main__":
    main()
