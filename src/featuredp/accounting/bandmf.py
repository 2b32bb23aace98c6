"""Amplified BandMF accounting (numpy only): the privacy of banded matrix-factorization DP-FTRL with cyclic Poisson
sampling as a dp_accounting event, its ε and the σ for a target ε.

The mechanism, the sensitivity lemma and the reduction (Choquette-Choo et al. 2023, Theorem 4) are described in
:mod:`featuredp.noise.bandmf`, which re-exports everything here; these functions live in the accountant's package so
that the privacy plan (:mod:`featuredp.plan`, which never imports torch) can account a BandMF run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from featuredp._validate import check_int, check_positive
from featuredp.accounting.accountant import compute_epsilon
from featuredp.accounting.calibrate import calibrate_noise_multiplier, scaled_noise
from featuredp.accounting.events import DpEvent, dpsgd_event

__all__ = ["bandmf_epsilon", "bandmf_event", "bandmf_sampling_rate", "bandmf_terms", "calibrate_bandmf_noise",
           "sensitivity"]


def _check_coeffs(coeffs: object) -> np.ndarray:
    """The Toeplitz coefficients as a 1-D finite float64 array with c_0 > 0."""
    try:
        c = np.array(coeffs, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"coeffs must be a sequence of real numbers, got {type(coeffs).__name__}") from None
    if c.ndim != 1 or c.size == 0:
        raise ValueError(f"coeffs must be a non-empty 1-D sequence, got shape {c.shape}")
    if not np.all(np.isfinite(c)):
        raise ValueError(f"coeffs must be finite, got {c.tolist()!r}")
    if not c[0] > 0:
        raise ValueError(f"coeffs[0] must be > 0 (C must be invertible), got {float(c[0])!r}")
    return c


def sensitivity(coeffs: Sequence[float] | np.ndarray, n: int) -> float:
    """The largest column norm of the n×n banded Toeplitz C: ‖coeffs[:n]‖₂ (its first column holds them all).

    Under b-min-separated participation with b >= len(coeffs), k participations have sensitivity
    sqrt(k) times this (module docstring, "the lemma").

    >>> sensitivity([1.0, 0.75], 10)
    1.25
    """
    c = _check_coeffs(coeffs)
    n = check_int("n", n, minimum=1)
    return float(np.linalg.norm(c[:n]))


def bandmf_sampling_rate(expected_batch: float, n: int, bands: int) -> float:
    """q = min(1, expected_batch·bands/n): each record's inclusion probability at the steps of its partition.

    >>> bandmf_sampling_rate(512, 60000, 4)
    0.034133333333333335
    """
    m = check_positive("expected_batch", expected_batch)
    n = check_int("n", n, minimum=1)
    b = check_int("bands", bands, minimum=1)
    return min(1.0, m * b / n)


def bandmf_event(
    noise_multiplier: float,
    expected_batch: float,
    n: int,
    steps: int,
    bands: int,
    coeffs: Sequence[float] | np.ndarray,
) -> DpEvent:
    """The dp_accounting event of ``steps`` BandMF steps with cyclic Poisson sampling (amplified BandMF).

    ``noise_multiplier`` is σ, the standard deviation of z in units of the clip norm; ``coeffs`` the b' <= ``bands``
    coefficients of C (a b'-banded C is b-banded). By Choquette-Choo et al. (2023), Theorem 4 (module docstring)
    the run is as private as DP-SGD with sampling rate q = min(1, expected_batch·bands/n), noise multiplier
    σ / sens(C) (sens = the largest column norm) and ceil(steps/bands) steps: this returns
    ``dpsgd_event(σ / sens(C), q, ceil(steps / bands))``, so with ``bands = 1`` and ``coeffs = [1.0]`` it is
    DP-SGD's event exactly.

    >>> bandmf_event(1.0, 512, 60000, 117, 1, [1.0]) == dpsgd_event(1.0, 512 / 60000, 117)
    True
    """
    return dpsgd_event(*bandmf_terms(noise_multiplier, expected_batch, n, steps, bands, coeffs))


def bandmf_terms(noise_multiplier: float, expected_batch: float, n: int, steps: int, bands: int,
                 coeffs: Sequence[float] | np.ndarray) -> tuple[float, float, int]:  # fmt: skip
    """(σ / sens(C), q = min(1, m·b/n), ⌈steps/b⌉): the Poisson-subsampled Gaussian :func:`bandmf_event` is.

    >>> bandmf_terms(2.0, 512, 60000, 117, 1, [1.0]) == (2.0, 512 / 60000, 117)
    True
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    steps, c, q = _amplified(expected_batch, n, steps, bands, coeffs)
    return sigma / sensitivity(c, steps), q, -(-steps // int(bands))


def _amplified(expected_batch: float, n: int, steps: int, bands: int, coeffs: Sequence[float] | np.ndarray
               ) -> tuple[int, np.ndarray, float]:  # fmt: skip
    """(steps, coefficients, sampling rate m·b/n), checked: C may not be wider than the sampler's separation b."""
    steps = check_int("steps", steps, minimum=1)
    b = check_int("bands", bands, minimum=1)
    c = _check_coeffs(coeffs)
    if c.size > b:
        raise ValueError(f"coeffs has {c.size} bands, more than bands={b}: the sampler's separation must be at "
                         "least the bandwidth of C")  # fmt: skip
    return steps, c, bandmf_sampling_rate(expected_batch, n, b)


def bandmf_epsilon(
    noise_multiplier: float,
    expected_batch: float,
    n: int,
    steps: int,
    bands: int,
    coeffs: Sequence[float] | np.ndarray,
    delta: float,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
) -> float:
    """ε(δ) of :func:`bandmf_event` (the same accountants as :func:`featuredp.accounting.compute_epsilon`)."""
    event = bandmf_event(noise_multiplier, expected_batch, n, steps, bands, coeffs)
    return compute_epsilon(event, delta, relation=relation, accountant=accountant)


def calibrate_bandmf_noise(
    target_epsilon: float,
    delta: float,
    expected_batch: float,
    n: int,
    steps: int,
    bands: int,
    coeffs: Sequence[float] | np.ndarray,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
    tolerance: float = 0.01,
) -> float:
    """σ, the std of z (units of the clip norm), at which BandMF gives ε <= ``target_epsilon`` at ``delta``.

    :func:`featuredp.accounting.calibrate_noise_multiplier` on the equivalent DP-SGD event (rate q,
    ceil(steps/bands) steps) times sens(C), rounded up so that σ / sens(C) is never below the calibrated
    multiplier: the achieved ε is in [(1 − tolerance)·target, target], never above. Raises
    ``UnreachableTargetError`` as that function does.
    """
    steps, c, q = _amplified(expected_batch, n, steps, bands, coeffs)
    nm = calibrate_noise_multiplier(
        target_epsilon, delta, q, -(-steps // int(bands)), relation=relation, accountant=accountant,
        tolerance=tolerance,
    )
    return scaled_noise(nm, sensitivity(c, steps))
