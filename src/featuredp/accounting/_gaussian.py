"""Closed forms of the Gaussian mechanism's privacy profile (Balle & Wang 2018; Dong et al. μ-GDP).

With μ = Δ/σ (T-fold composition: μ·√T), the exact profile is
δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2). Everything here is numpy/scipy only.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special


def gaussian_delta(epsilon: float, mu: float) -> float:
    """Exact δ(ε) of a μ-GDP mechanism (the Gaussian mechanism with Δ/σ = μ).

    >>> round(gaussian_delta(1.0, 1.0), 4)
    0.1269
    """
    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    a = -epsilon / mu + mu / 2
    b = -epsilon / mu - mu / 2
    # log-space for the second term: e^ε Φ(b) overflows/underflows separately, the product does not.
    first = special.ndtr(a)
    second = math.exp(epsilon + special.log_ndtr(b))
    return float(max(0.0, first - second))


def gaussian_epsilon(delta: float, mu: float) -> float:
    """Exact ε(δ) of a μ-GDP mechanism, rounded up: the returned ε satisfies δ(ε) <= delta."""
    if mu <= 0:
        return 0.0
    if gaussian_delta(0.0, mu) <= delta:
        return 0.0
    hi = max(1.0, mu * mu / 2 + mu * math.sqrt(2 * math.log(1 / delta)) + 1.0)
    while gaussian_delta(hi, mu) > delta:
        hi *= 2
    eps = optimize.brentq(lambda e: gaussian_delta(e, mu) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12)
    # brentq's root may sit a hair on the wrong side; step up until the guarantee holds.
    step = max(1e-12, 1e-12 * eps)
    while gaussian_delta(eps, mu) > delta:
        eps += step
        step *= 2
    return float(eps)


def gaussian_tradeoff(alpha: np.ndarray, mu: float) -> np.ndarray:
    """The μ-GDP trade-off function G_μ(α) = Φ(Φ⁻¹(1 − α) − μ)."""
    alpha = np.clip(np.asarray(alpha, dtype=float), 0.0, 1.0)
    return special.ndtr(special.ndtri(1 - alpha) - mu)
