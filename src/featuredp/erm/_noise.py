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


def sample_vector_laplace(dim: int, beta: float, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
    """Draw b ∈ R^dim with density ∝ exp(−beta·‖b‖); shape (dim,) or (size, dim)."""
    dim = check_int("dim", dim, minimum=1)
    beta = check_positive("beta", beta)
    shape = (1 if size is None else check_int("size", size, minimum=1), dim)
    direction = rng.standard_normal(shape)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    radius = rng.gamma(shape=dim, scale=1.0 / beta, size=(shape[0], 1))
    out = direction * radius
    return out[0] if size is None else out


@functools.lru_cache(maxsize=256)
def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """σ/Δ of a single Gaussian release that is (ε, δ)-DP (exact calibration, rounded to the safe side)."""
    from featuredp.accounting import calibrate_noise_multiplier

    return calibrate_noise_multiplier(epsilon, delta, 1.0, 1)
