"""BLT accounting (numpy only): the privacy of buffered-linear-Toeplitz (BLT) correlated noise under min-separated
participation, as one Gaussian release, its ε and the σ for a target ε.

The mechanism and the sampler are described in :mod:`featuredp.noise.blt`, which re-exports everything here; these
functions live in the accountant's package so that the privacy plan (:mod:`featuredp.plan`, never torch) can
account a BLT run.

The strategy C is lower-triangular Toeplitz with first column c_0 = 1, c_j = Σ_i ω_i·θ_i^(j−1) (j >= 1): the BLT
with buffer decays θ (``buf_decay``) and output scales ω (``output_scale``) of Dvijotham, McMahan, Pillutla,
Steinke and Thakurta (2024, arXiv:2404.16706) and McMahan, Xu and Zhang (2024, arXiv:2408.08868). The run releases
C x + z with z ~ N(0, σ²·I) per coordinate, x the stream of clipped gradient sums; each record takes part in steps
of one residue class modulo b (b-min-separated participation, at most k = ⌈T/b⌉ times in T steps).

Sensitivity. A record in steps t_1 < ... < t_k changes C x by Σ_i C[:, t_i]·g_i with ‖g_i‖ <= 1. C is not banded,
so the columns overlap and the cross terms do not vanish; but when the coefficients are non-negative, the inner
products C[:, s]ᵀC[:, t] are non-negative, the worst case takes every g_i equal to one unit vector and the
sensitivity is max over patterns ‖Σ_i C[:, t_i]‖₂; when they are also non-increasing, the worst pattern starts at
step 0 with the separations exactly b (McKenna 2024, arXiv:2405.13763, Theorem 2; jax_privacy's
``toeplitz.minsep_sensitivity_squared``). :func:`minsep_sensitivity` computes that pattern's norm and refuses
coefficients for which the argument does not hold. A BLT with θ_i in [0, 1), ω_i >= 0 and Σ ω_i <= 1 has such
coefficients (each term decays; c_1 = Σ ω_i <= c_0).

Accounting. There is no amplification by sampling here: amplification for a non-banded C needs the MMCC analysis
(Choquette-Choo, Ganesh, Steinke, Thakurta 2024), which featuredp does not implement; the cyclic Poisson reduction
of BandMF holds for b-banded C only. The run is one Gaussian mechanism on the whole stream, with noise multiplier
σ / Δ for Δ the min-sep sensitivity: (ε, δ) from that single Gaussian event, exactly as jax_privacy's
``SingleReleaseTrainingAccountant`` accounts DP-FTRL. The stream is adaptive (each gradient depends on the earlier
releases); for a lower-triangular C and Gaussian noise the adaptive release is as private as the non-adaptive one
(Denisov, McMahan, Rush, Smith, Thakurta 2022, Theorem 2.1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from featuredp._validate import check_int, check_positive
from featuredp.accounting.accountant import compute_epsilon
from featuredp.accounting.calibrate import calibrate_noise_multiplier, scaled_noise
from featuredp.accounting.events import DpEvent, dpsgd_event

__all__ = [
    "blt_coefficients",
    "blt_epsilon",
    "blt_event",
    "blt_min_separation",
    "blt_sensitivity",
    "blt_terms",
    "calibrate_blt_noise",
    "check_blt_params",
    "minsep_sensitivity",
    "split_blt_params",
]


def check_blt_params(buf_decay: object, output_scale: object) -> tuple[np.ndarray, np.ndarray]:
    """θ and ω as float64 arrays of one length d >= 0, checked: θ_i in [0, 1), ω_i >= 0, Σ ω_i <= 1.

    These make C's coefficients non-negative and non-increasing, which the sensitivity argument needs.
    """
    try:
        theta = np.array(buf_decay, dtype=np.float64).reshape(-1)
        omega = np.array(output_scale, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError("buf_decay and output_scale must be sequences of real numbers") from None
    if theta.shape != omega.shape:
        raise ValueError(f"buf_decay and output_scale must have one length, got {theta.size} and {omega.size}")
    if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(omega))):
        raise ValueError(f"buf_decay and output_scale must be finite, got {theta.tolist()!r}, {omega.tolist()!r}")
    if np.any(theta < 0) or np.any(theta >= 1):
        raise ValueError(f"buf_decay must be in [0, 1), got {theta.tolist()!r}")
    if np.any(omega < 0) or float(omega.sum()) > 1.0:
        raise ValueError(f"output_scale must be >= 0 with sum <= 1, got {omega.tolist()!r}")
    return theta, omega


def split_blt_params(params: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(θ, ω) from the flat form (θ_1..θ_d, ω_1..ω_d) a plan stores, checked (:func:`check_blt_params`).

    >>> [v.tolist() for v in split_blt_params([0.9, 0.5])]
    [[0.9], [0.5]]
    """
    flat = np.array(params, dtype=np.float64).reshape(-1)
    if flat.size % 2:
        raise ValueError(f"BLT parameters must be (buf_decay..., output_scale...) of even length, got {flat.size}")
    d = flat.size // 2
    return check_blt_params(flat[:d], flat[d:])


def blt_coefficients(buf_decay: object, output_scale: object, n: int) -> np.ndarray:
    """The first n Toeplitz coefficients of C: c_0 = 1, c_j = Σ_i ω_i·θ_i^(j−1).

    >>> blt_coefficients([0.5], [0.5], 4).tolist()
    [1.0, 0.5, 0.25, 0.125]
    """
    theta, omega = check_blt_params(buf_decay, output_scale)
    n = check_int("n", n, minimum=1)
    c = np.zeros(n, dtype=np.float64)
    c[0] = 1.0
    if n > 1 and theta.size:
        powers = np.arange(n - 1, dtype=np.float64)[:, None]
        with np.errstate(under="ignore"):
            c[1:] = (theta[None, :] ** powers * omega[None, :]).sum(axis=1)
    return c


def minsep_sensitivity(coeffs: Sequence[float] | np.ndarray, n: int, min_sep: int,
                       max_participations: int | None = None) -> float:  # fmt: skip
    """Δ: the largest ‖Σ_i C[:, t_i]·g_i‖₂ over ‖g_i‖ <= 1 and participations t_i at least ``min_sep`` apart, at
    most ``max_participations`` (default: as many as fit in n steps), for the n×n lower-triangular Toeplitz C with
    first column ``coeffs`` (cut or zero-padded to n), which must be non-negative and non-increasing (module
    docstring). The worst pattern is 0, b, 2b, ...: Δ² = ‖Σ_j shift(c, j·b)‖².

    >>> minsep_sensitivity([1.0], 10, 3)  # C = I: sqrt(k) with k = ⌈10/3⌉ = 4
    2.0
    >>> round(minsep_sensitivity([1.0, 0.5], 4, 1), 6)  # every step: column sums 1.5, 1.5, 1.5, 1
    2.783882
    """
    n = check_int("n", n, minimum=1)
    b = check_int("min_sep", min_sep, minimum=1)
    c = np.zeros(n, dtype=np.float64)
    given = np.array(coeffs, dtype=np.float64).reshape(-1)[:n]
    c[: given.size] = given
    if not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError("coeffs must be finite and non-negative for the min-sep sensitivity")
    if np.any(np.diff(c) > 1e-12 * max(1.0, float(c[0]))):
        raise ValueError("coeffs must be non-increasing for the min-sep sensitivity (the worst pattern is then "
                         "b apart from step 0)")  # fmt: skip
    k = -(-n // b)
    if max_participations is not None:
        k = min(k, check_int("max_participations", max_participations, minimum=1))
    # v[t] = Σ_{j<k} c[t − j·b]: the running sums down each residue class, less those more than k back.
    rows = -(-n // b)
    padded = np.zeros(rows * b, dtype=np.float64)
    padded[:n] = c
    v = padded.reshape(rows, b).cumsum(axis=0).reshape(-1)
    if k < rows:
        v[k * b :] -= v[: (rows - k) * b].copy()
    return float(np.linalg.norm(v[:n]))


def blt_min_separation(n: int, expected_batch: float) -> int:
    """b = max(1, ⌊n/m⌋): the number of secret partitions a BLT run cycles through (one epoch of b steps), so that
    each record takes part at most once every b steps.

    >>> blt_min_separation(60000, 512)
    117
    """
    n = check_int("n", n, minimum=1)
    m = check_positive("expected_batch", expected_batch)
    return max(1, int(n // m))


def blt_sensitivity(params: Sequence[float] | np.ndarray, expected_batch: float, n: int, steps: int) -> float:
    """Δ of ``steps`` BLT steps on n records at expected batch m: :func:`minsep_sensitivity` of C's first ``steps``
    coefficients with separation b = :func:`blt_min_separation` and ⌈steps/b⌉ participations."""
    theta, omega = split_blt_params(params)
    steps = check_int("steps", steps, minimum=1)
    b = blt_min_separation(n, expected_batch)
    return minsep_sensitivity(blt_coefficients(theta, omega, steps), steps, b)


def blt_event(noise_multiplier: float, params: Sequence[float] | np.ndarray, expected_batch: float, n: int,
              steps: int) -> DpEvent:  # fmt: skip
    """The dp_accounting event of ``steps`` BLT steps: one Gaussian release with multiplier σ / Δ (no amplification;
    module docstring). ``params`` = (θ_1..θ_d, ω_1..ω_d); with d = 0 (C = I) and steps <= n/m it is one DP-SGD step
    without sampling: ``GaussianDpEvent(σ)``.

    >>> blt_event(2.0, [], 100, 1000, 5)
    GaussianDpEvent(noise_multiplier=2.0)
    """
    return dpsgd_event(*blt_terms(noise_multiplier, params, expected_batch, n, steps))


def blt_terms(noise_multiplier: float, params: Sequence[float] | np.ndarray, expected_batch: float, n: int,
              steps: int) -> tuple[float, float, int]:  # fmt: skip
    """(σ / Δ, 1, 1): :func:`blt_event` as a Poisson-subsampled Gaussian (rate 1, one release).

    >>> blt_terms(2.0, [], 100, 1000, 30)  # C = I over 3 epochs: Δ = sqrt(3)
    (1.1547005383792517, 1.0, 1)
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    return sigma / blt_sensitivity(params, expected_batch, n, steps), 1.0, 1


def blt_epsilon(noise_multiplier: float, params: Sequence[float] | np.ndarray, expected_batch: float, n: int,
                steps: int, delta: float, *, relation: str = "add-remove",
                accountant: str = "pld") -> float:  # fmt: skip
    """ε(δ) of :func:`blt_event` (exact for the PLD accountant: a single Gaussian)."""
    event = blt_event(noise_multiplier, params, expected_batch, n, steps)
    return compute_epsilon(event, delta, relation=relation, accountant=accountant)


def calibrate_blt_noise(target_epsilon: float, delta: float, params: Sequence[float] | np.ndarray,
                        expected_batch: float, n: int, steps: int, *, relation: str = "add-remove",
                        accountant: str = "pld", tolerance: float = 0.01) -> float:  # fmt: skip
    """σ, the std of z (units of the clip norm), at which ``steps`` BLT steps give ε <= ``target_epsilon``: the
    Gaussian's calibrated multiplier times Δ, rounded up so that σ / Δ never falls below it (ε never overshoots).
    Raises ``UnreachableTargetError`` as :func:`featuredp.accounting.calibrate_noise_multiplier` does."""
    nm = calibrate_noise_multiplier(target_epsilon, delta, 1.0, 1, relation=relation, accountant=accountant,
                                    tolerance=tolerance)  # fmt: skip
    return scaled_noise(nm, blt_sensitivity(params, expected_batch, n, steps))
