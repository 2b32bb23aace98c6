"""Composition rules for generic (ε, δ)-DP mechanisms (the textbook rules; see ``docs/accounting.md``).

These are the textbook bounds for mechanisms known only by their (ε, δ). For DP-SGD and
Algorithm 1 use the tight accountants in :mod:`featuredp.accounting.accountant`, which
are much tighter than any of these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from featuredp._validate import check_int, check_nonnegative, check_open_unit, check_sampling_rate

__all__ = ["advanced_composition", "amplify_by_subsampling", "basic_composition", "parallel_composition"]


def _pairs(name: str, guarantees: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for i, item in enumerate(guarantees):
        try:
            eps, delta = item
        except (TypeError, ValueError):
            raise TypeError(f"{name}[{i}] must be an (epsilon, delta) pair, got {item!r}") from None
        eps = check_nonnegative(f"{name}[{i}] epsilon", eps, allow_inf=True)
        delta = check_nonnegative(f"{name}[{i}] delta", delta)
        if delta > 1:
            raise ValueError(f"{name}[{i}] delta must be in [0, 1], got {delta!r}")
        out.append((eps, delta))
    return out


def basic_composition(guarantees: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Sequential composition: (Σ ε_i, Σ δ_i) (δ capped at 1).

    >>> basic_composition([(1.0, 1e-5), (0.5, 0.0)])
    (1.5, 1e-05)
    """
    pairs = _pairs("guarantees", guarantees)
    return sum(e for e, _ in pairs), min(1.0, sum(d for _, d in pairs))


def advanced_composition(epsilon: float, delta: float, k: int, delta_prime: float) -> tuple[float, float]:
    """k-fold adaptive composition of an (ε, δ)-DP mechanism (Dwork, Rothblum & Vadhan 2010).

    ε̃ = k·ε·(e^ε − 1) + ε·sqrt(2k·ln(1/δ')),  δ̃ = k·δ + δ'.
    Returned as is, even where basic composition (kε, kδ) is smaller (small k or large ε).

    >>> eps, delta = advanced_composition(0.1, 0.0, 100, 1e-5)
    >>> round(eps, 3), delta
    (5.85, 1e-05)
    """
    epsilon = check_nonnegative("epsilon", epsilon)
    delta = check_nonnegative("delta", delta)
    k = check_int("k", k, minimum=1)
    delta_prime = check_open_unit("delta_prime", delta_prime)
    eps_adv = k * epsilon * math.expm1(epsilon) + epsilon * math.sqrt(2 * k * math.log(1 / delta_prime))
    return eps_adv, min(1.0, k * delta + delta_prime)


def parallel_composition(guarantees: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Mechanisms on disjoint parts of the data: (max ε_i, max δ_i).

    >>> parallel_composition([(1.0, 0.0), (2.0, 1e-6)])
    (2.0, 1e-06)
    """
    pairs = _pairs("guarantees", guarantees)
    if not pairs:
        return 0.0, 0.0
    return max(e for e, _ in pairs), max(d for _, d in pairs)


def amplify_by_subsampling(epsilon: float, delta: float, sampling_rate: float) -> tuple[float, float]:
    """Privacy amplification by Poisson subsampling at rate q: ε' = ln(1 + q(e^ε − 1)), δ' = q·δ.

    (Add/remove neighbours; Balle, Barthe & Gaboardi 2018.)

    >>> eps, delta = amplify_by_subsampling(1.0, 1e-5, 0.01)
    >>> round(eps, 4), round(delta, 9)
    (0.017, 1e-07)
    """
    epsilon = check_nonnegative("epsilon", epsilon)
    delta = check_nonnegative("delta", delta)
    q = check_sampling_rate("sampling_rate", sampling_rate)
    return math.log1p(q * math.expm1(epsilon)), q * delta
