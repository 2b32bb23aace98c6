"""Noise for the one-shot DP-ERM mechanisms.

* The vector ("multivariate Laplace") mechanism of CMS11: density ∝ exp(−β‖b‖) on R^d.
  In polar coordinates the density of the norm r is ∝ r^{d−1} e^{−βr}, i.e.
  ‖b‖ ~ Gamma(shape=d, scale=1/β), and the direction is uniform on the sphere.
* The Gaussian mechanism with the exact (Balle–Wang) calibration, taken from
  :func:`featuredp.accounting.calibrate_noise_multiplier` at sampling rate 1 and one step
  (never above the target ε).
"""

from __future__ import annotations

import functools

import numpy as np

from featuredp._validate import check_int, check_positive
from featuredp.accounting import calibrate_noise_multiplier
from featuredp.mechanisms.classic import VectorMechanism


def sample_vector_laplace(dim: int, beta: float, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
    """Draw b ∈ R^dim with density ∝ exp(−beta·‖b‖); shape (dim,) or (size, dim).

    Delegates to :class:`featuredp.mechanisms.classic.VectorMechanism` (rate β = ε/Δ₂, here Δ₂ = 1).
    """
    dim = check_int("dim", dim, minimum=1)
    beta = check_positive("beta", beta)
    return VectorMechanism(epsilon=beta, sensitivity=1.0).noise(dim, size=size, rng=rng)


@functools.lru_cache(maxsize=256)
def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """σ/Δ of a single Gaussian release that is (ε, δ)-DP (exact calibration, rounded to the safe side)."""
    return calibrate_noise_multiplier(epsilon, delta, 1.0, 1)
