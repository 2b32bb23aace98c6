"""Correlated noise for DP-SGD and FDP: banded matrix-factorization DP-FTRL (BandMF), a building block.

This module holds the strategy, the noise and (re-exported from :mod:`featuredp.accounting.bandmf`,
numpy only, so that the privacy plan can use it without torch) the accounting, each tested on its own. The Trainer
composes them (:mod:`featuredp.correlated`) with ``noise="bandmf", bands=b`` (``featuredp train --noise bandmf --bands
b``; docs/accounting.md): the cyclic sampler :class:`~featuredp.sampling.BMinSepSampler` replaces the private Poisson
sampler, :class:`BandedNoise` wraps the run's noise source, the strategy is :func:`banded_toeplitz_strategy` for
the run's private steps and its workload, and ε, the plan, the ledger and the guarantee come from
:func:`bandmf_event`.

The mechanism. Let x be the stream of clipped gradient sums (row t = step t, one row per step, n steps) and A the
workload: the linear map from gradients to what training uses of them. With plain SGD the iterates are
θ_t = θ_0 − η·(A x)_t with A the prefix sums (lower-triangular ones). With SGD momentum β (torch's ``SGD``, no
dampening: v_t = β·v_{t−1} + g_t, θ_t = θ_{t−1} − η·v_t) the iterates are θ_t = θ_0 − η·Σ_{r≤t} a_{t−r}·g_r, so

    A[t, r] = a_{t−r} = Σ_{s=r}^{t} β^{s−r} = (1 − β^{t−r+1}) / (1 − β)     for r <= t, 0 above the diagonal

(lower-triangular Toeplitz; β = 0 gives the prefix sums). BandMF factors A = B·C with C lower-triangular, b-banded
and Toeplitz (C[i, j] = c_{i−j} for 0 <= i − j < b, 0 elsewhere; c_0 = 1) and releases C x + z, z ~ N(0, σ²·I) per
coordinate (σ in units of the clip norm). Training then uses B (C x + z) = A (x + C⁻¹ z): each step adds the
correlated noise w_t = (C⁻¹ z)_t to its gradient sum, computed online by the banded recurrence
w_t = (z_t − Σ_{j=1}^{b−1} c_j·w_{t−j}) / c_0 (:class:`BandedNoise`). The total squared error of the workload is
E‖A C⁻¹ z‖_F² = σ²·‖A C⁻¹‖_F² per coordinate, and the σ that privacy needs is proportional to sens(C), so the
strategy minimises ‖A C⁻¹‖_F²·sens(C)² (:func:`banded_toeplitz_strategy`; scale-free in C).

Sensitivity (the lemma). A record that takes part in steps t_1 < t_2 < ... < t_k changes C x by
Σ_i C[:, t_i]·g_i with ‖g_i‖ <= 1 (clip norm 1). If consecutive participations are at least b steps apart
(b-min-sep) and C is b-banded, column t_i is supported on rows t_i .. t_i + b − 1, so the k columns have disjoint
supports, the cross terms vanish and ‖Σ_i C[:, t_i] g_i‖² = Σ_i ‖C[:, t_i]‖²·‖g_i‖² <= k·max_j ‖C[:, j]‖²: the
sensitivity for k participations is sqrt(k)·(max column norm), attained by g_i on the worst column. This is the
argument for b-banded matrices under b-min-separated participation (the participation schema of Section 3 of
Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu, "(Amplified) Banded Matrix Factorization: A unified
approach to private training", NeurIPS 2023, arXiv:2306.08153); ``tests/test_bandmf.py`` checks it by enumeration.
For a banded Toeplitz C the largest column is the first: max column norm = ‖(c_0, ..., c_{min(b, n)−1})‖₂
(:func:`sensitivity`).

Amplification and accounting (:func:`bandmf_event`). With the cyclic Poisson sampling of the same paper (Section 5,
Algorithm 2; :class:`~featuredp.sampling.BMinSepSampler`): each record is assigned to one of b partitions,
independently and uniformly with secret coins, and step t Poisson-samples partition t mod b at rate q = m·b/n (m the
expected batch). The assignment is independent per record, not an equal split, because the guarantee is for
add-or-remove neighbours: with an equal split of a random permutation, adding a record moves the others between
partitions, which the reduction does not cover (jax_privacy accepts add-or-remove only with its INDEPENDENT
partition for this reason).
Theorem 4 there (Theorem 1 is its informal statement; the numbering as cited by jax_privacy's
docs/batch_selection.md and its toeplitz module) reduces the privacy of b-banded BandMF run for n steps to that
of DP-SGD with Poisson sampling rate q, noise multiplier σ / (max column norm of C), run for ceil(n/b) steps: one
record lives in one partition, and the b steps of each round touch it at most once. jax_privacy implements exactly
this reduction (``jax_privacy.accounting.amplified_bandmf_event``: ``dpsgd_event(noise_multiplier, sampling_prob,
ceil(iterations / num_bands))`` with the noise multiplier stated for "a strategy matrix [with] maximum L2 column
norm of one"; ``matrix_factorization.toeplitz.optimize_coefs_for_amplifications`` cites Theorem 4 and Algorithm 2).
With b = 1 (C = I) the event is DP-SGD's, exactly.

Not to be confused: Dong & Ganesh (arXiv:2602.09338) call a *different* sampler "b-min-sep subsampling" (a record
is eligible whenever it sat out the last b steps) and account for it by Monte Carlo only; the accounting here holds
for the cyclic Poisson sampler of Choquette-Choo et al., which is what :class:`~featuredp.sampling.BMinSepSampler`
draws.

Randomness: the noise z comes from a featuredp noise source (:class:`~featuredp.noise.TorchNoise` or
:class:`~featuredp.noise.SecureNoise`), the partition and the coins from the private sampling stream
(:func:`featuredp.sampling.make_streams`). The noise history and the partition are secret: they live only in
``state_dict`` (the private checkpoint), never in a repr or a run file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.signal import lfilter

from featuredp._validate import check_int, check_nonnegative, check_positive, check_real
from featuredp.accounting.bandmf import (
    _check_coeffs,
    bandmf_epsilon,
    bandmf_event,
    bandmf_sampling_rate,
    calibrate_bandmf_noise,
    sensitivity,
)
from featuredp.noise.sources import CorrelatedNoise, NoiseSource

__all__ = [
    "BAND_CHOICES",
    "DEFAULT_BANDS",
    "RMSE_SETTINGS",
    "BandedNoise",
    "banded_toeplitz_strategy",
    "bandmf_epsilon",
    "bandmf_event",
    "bandmf_sampling_rate",
    "best_bands",
    "calibrate_bandmf_noise",
    "noise_rmse",
    "relative_rmse",
    "rmse_table",
    "run_strategy",
    "sensitivity",
    "strategy_loss",
    "strategy_matrix",
    "workload_coefficients",
]

#: the numbers of bands :func:`best_bands` tries by default
BAND_CHOICES = (1, 2, 4, 8, 16, 32, 64)


# ----------------------------------------------------------------------------- strategy


def _check_momentum(momentum: object) -> float:
    beta = check_real("momentum", momentum)
    if not 0 <= beta < 1:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    return beta


def workload_coefficients(n: int, momentum: float = 0.0) -> np.ndarray:
    """The Toeplitz coefficients a_0..a_{n−1} of the workload A (module docstring): a_k = Σ_{j<=k} β^j.

    >>> workload_coefficients(3).tolist()
    [1.0, 1.0, 1.0]
    >>> workload_coefficients(3, momentum=0.5).tolist()
    [1.0, 1.5, 1.75]
    """
    n = check_int("n", n, minimum=1)
    beta = _check_momentum(momentum)
    return np.cumsum(beta ** np.arange(n, dtype=np.float64))


def strategy_matrix(coeffs: Sequence[float] | np.ndarray, n: int) -> np.ndarray:
    """The n×n lower-triangular banded Toeplitz matrix C with first column ``coeffs`` (cut or zero-padded to n).

    >>> strategy_matrix([1.0, 0.5], 3).tolist()
    [[1.0, 0.0, 0.0], [0.5, 1.0, 0.0], [0.0, 0.5, 1.0]]
    """
    c = _check_coeffs(coeffs)
    n = check_int("n", n, minimum=1)
    out = np.zeros((n, n), dtype=np.float64)
    for j, cj in enumerate(c[:n]):
        out[np.arange(j, n), np.arange(0, n - j)] = cj
    return out


def _noising_column(c: np.ndarray, a: np.ndarray) -> np.ndarray:
    """The first column of A C⁻¹ (a lower-triangular Toeplitz matrix like A and C): C⁻¹ a by the banded recurrence."""
    return np.asarray(lfilter([1.0], c, a), dtype=np.float64)


def _frobenius_squared(h: np.ndarray) -> float:
    """‖T‖_F² of the n×n lower-triangular Toeplitz T with first column h: coefficient k appears n − k times."""
    n = h.size
    return float(np.dot(np.arange(n, 0, -1, dtype=np.float64), h * h))


def strategy_loss(coeffs: Sequence[float] | np.ndarray, n: int, *, momentum: float = 0.0) -> float:
    """‖A C⁻¹‖_F²·sens(C)²: the total squared error of the n-step workload per unit of noise multiplier.

    Invariant to the scale of C. With ``coeffs = [1.0]`` (DP-SGD, C = I) and prefix sums it is n(n + 1)/2.

    >>> strategy_loss([1.0], 4)
    10.0
    """
    c = _check_coeffs(coeffs)
    n = check_int("n", n, minimum=1)
    h = _noising_column(c[:n], workload_coefficients(n, momentum))
    return _frobenius_squared(h) * float(np.dot(c[:n], c[:n]))


def noise_rmse(coeffs: Sequence[float] | np.ndarray, n: int, std: float, *, momentum: float = 0.0) -> float:
    """Root mean squared noise of the n workload queries (per coordinate) when z ~ N(0, std²): std·sqrt(‖A C⁻¹‖_F²/n).

    ``std`` is the standard deviation of z in units of the clip norm (σ·sens(C) for a target noise multiplier σ);
    divide by the expected batch for the noise of the averaged gradients.

    >>> round(noise_rmse([1.0], 3, 2.0), 6)  # DP-SGD: sqrt((1 + 2 + 3) / 3)·2
    2.828427
    """
    c = _check_coeffs(coeffs)
    n = check_int("n", n, minimum=1)
    std = check_nonnegative("std", std)
    h = _noising_column(c[:n], workload_coefficients(n, momentum))
    return std * math.sqrt(_frobenius_squared(h) / n)


def _toeplitz_sqrt(a: np.ndarray) -> np.ndarray:
    """s with s * s = a (convolution, first len(a) terms) and s_0 = sqrt(a_0): the Toeplitz square root of A."""
    s = np.zeros_like(a)
    s[0] = math.sqrt(a[0])
    for k in range(1, a.size):
        s[k] = (a[k] - np.dot(s[1:k], s[k - 1 : 0 : -1])) / (2 * s[0])
    return s


def _log_loss_and_grad(x: np.ndarray, a: np.ndarray, weights: np.ndarray) -> tuple[float, np.ndarray]:
    """log(‖A C⁻¹‖_F²·‖c‖²) and its gradient in c_1..c_{b−1} (c_0 = 1), both exact, O(n·b).

    With h = C⁻¹ a and g = 2·w·h (w_k = n − k), ∂‖A C⁻¹‖_F²/∂c_j = −(C⁻ᵀ g)ᵀ S_j h, where S_j shifts down by j; C⁻ᵀ
    is the row-and-column reversal of C⁻¹, so both solves are the same banded recurrence (``lfilter``).
    """
    c = np.concatenate(([1.0], x))
    with np.errstate(all="ignore"):
        h = _noising_column(c, a)
        frob = float(np.dot(weights, h * h))
        sens2 = float(np.dot(c, c))
        if not (math.isfinite(frob) and frob > 0):
            # An unstable C (C⁻¹ blows up): a large value sends the line search back.
            return 1e6, np.zeros_like(x)
        g = 2.0 * weights * h
        u = _noising_column(c, g[::-1])[::-1]
        n = h.size
        d_frob = np.array([-np.dot(u[j:], h[: n - j]) for j in range(1, c.size)])
    grad = d_frob / frob + 2.0 * x / sens2
    if not np.all(np.isfinite(grad)):
        return 1e6, np.zeros_like(x)
    return math.log(frob) + math.log(sens2), grad


def banded_toeplitz_strategy(n_steps: int, bands: int, *, momentum: float = 0.0, iters: int = 2000) -> np.ndarray:
    """The ``bands`` coefficients c_0 = 1, c_1..c_{b−1} of the b-banded Toeplitz C that minimises ‖A C⁻¹‖_F²·sens(C)².

    A is the n-step workload with SGD momentum ``momentum`` (module docstring: A[t, r] = Σ_{s=r}^{t} β^{s−r}; prefix
    sums at β = 0) and sens(C) the largest column norm (the sensitivity of one participation; b-min-separated
    participations add in quadrature, so the same C is optimal for any number of them). The objective is
    minimised in float64 with exact gradients by L-BFGS (scipy), from the truncated Toeplitz square root of A; the
    result is deterministic, and never worse than that start or than C = I (DP-SGD). ``bands`` above ``n_steps``
    leaves the extra coefficients 0 (they never touch an n-step run).

    >>> c = banded_toeplitz_strategy(16, 2)
    >>> float(c[0]), bool(0 < c[1] < 1)
    (1.0, True)
    >>> strategy_loss(c, 16) < strategy_loss([1.0], 16)
    True
    """
    n = check_int("n_steps", n_steps, minimum=1)
    b = check_int("bands", bands, minimum=1)
    beta = _check_momentum(momentum)
    iters = check_int("iters", iters, minimum=0)
    out = np.zeros(b, dtype=np.float64)
    out[0] = 1.0
    k = min(b, n)
    if k == 1:
        return out
    a = workload_coefficients(n, beta)
    weights = np.arange(n, 0, -1, dtype=np.float64)
    starts = [_toeplitz_sqrt(a)[1:k], np.zeros(k - 1)]
    best_x, best_f = starts[1], _log_loss_and_grad(starts[1], a, weights)[0]
    for x0 in starts:
        f0 = _log_loss_and_grad(x0, a, weights)[0]
        if f0 < best_f:
            best_x, best_f = x0, f0
        if iters == 0:
            continue
        res = minimize(
            _log_loss_and_grad, x0, args=(a, weights), jac=True, method="L-BFGS-B",
            options={"maxiter": iters, "ftol": 1e-15, "gtol": 1e-10},
        )  # fmt: skip
        f = _log_loss_and_grad(res.x, a, weights)[0]
        if f < best_f:
            best_x, best_f = np.asarray(res.x, dtype=np.float64), f
    out[1:k] = best_x
    return out


# ----------------------------------------------------------------------------- noise

class BandedNoise(CorrelatedNoise):
    """Correlated noise w_t = (C⁻¹ z)_t for step t, online, for the b-banded Toeplitz C with first column ``coeffs``.

    The recurrence is w_t = (z_t − Σ_{j=1}^{b−1} c_j·w_{t−j}) / c_0 in float64, keeping only the last b − 1
    vectors (memory (b − 1)·dim·8 bytes); the rest is :class:`CorrelatedNoise`'s. With ``coeffs = [1.0]`` it
    returns bit for bit what ``source.add`` returns for the same generator state.
    """

    kind = "BandMF"
    _not_copied = (
        "BandedNoise holds the last b-1 noise vectors, which fix part of the noise of the next steps: it must not be "
        "copied or pickled (save state_dict() to the private checkpoint only)"
    )

    def __init__(self, coeffs: Sequence[float] | np.ndarray, dim: int, source: NoiseSource) -> None:
        self.coeffs = _check_coeffs(coeffs)
        super().__init__(dim, source)
        self.description = (
            f"banded correlated noise C^-1 z (BandMF, {self.bands} bands, float64 recurrence) of z from: "
            f"{source.description}"
        )

    @property
    def bands(self) -> int:
        """b, the number of nonzero diagonals of C."""
        return int(self.coeffs.size)

    def _buffer_rows(self) -> int:
        return self.bands - 1

    def _params(self) -> dict[str, torch.Tensor]:
        return {"coeffs": torch.from_numpy(self.coeffs.copy())}

    def _correlate(self, z: torch.Tensor, buffers: torch.Tensor | None) -> torch.Tensor:
        c = self.coeffs
        b = c.size
        t = self._step
        w = z
        if buffers is not None:
            for j in range(1, min(b, t + 1)):  # w_{t−j} = 0 before the first step
                w.sub_(buffers[(t - j) % (b - 1)], alpha=float(c[j]))
        if c[0] != 1.0:
            w.div_(float(c[0]))
        if buffers is not None:
            # Row t mod (b − 1) held w_{t−b+1}, read above for the last time.
            buffers[t % (b - 1)].copy_(w)
        return w

    def __repr__(self) -> str:  # never the history
        return f"BandedNoise(bands={self.bands}, dim={self.dim}, step={self._step})"


# ----------------------------------------------------------------------------- the RMSE figure


def relative_rmse(
    target_epsilon: float,
    delta: float,
    n: int,
    expected_batch: float,
    steps: int,
    bands: int,
    *,
    momentum: float = 0.0,
    coeffs: Sequence[float] | np.ndarray | None = None,
    relation: str = "add-remove",
    accountant: str = "pld",
    tolerance: float = 1e-3,
) -> float:
    """Noise RMSE of the workload under amplified BandMF over that of DP-SGD, both calibrated to the same (ε, δ).

    BandMF: C from :func:`banded_toeplitz_strategy` (or ``coeffs``), σ_b from :func:`calibrate_bandmf_noise`,
    RMSE = σ_b·sqrt(‖A C⁻¹‖_F²/steps). DP-SGD: b = 1, C = I, Poisson rate expected_batch/n, ``steps`` steps. Both
    batches are ``expected_batch``, so dividing by it changes neither. Below 1: BandMF adds less noise.
    """
    b = check_int("bands", bands, minimum=1)
    c = banded_toeplitz_strategy(steps, b, momentum=momentum) if coeffs is None else _check_coeffs(coeffs)
    kw: dict[str, Any] = {"relation": relation, "accountant": accountant, "tolerance": tolerance}
    sigma_b = calibrate_bandmf_noise(target_epsilon, delta, expected_batch, n, steps, b, c, **kw)
    sigma_1 = calibrate_bandmf_noise(target_epsilon, delta, expected_batch, n, steps, 1, [1.0], **kw)
    rmse_b = noise_rmse(c, steps, sigma_b, momentum=momentum)
    rmse_1 = noise_rmse([1.0], steps, sigma_1, momentum=momentum)
    return rmse_b / rmse_1


#: the bands when none are given and there is no target ε to choose them for (lowered to what fits the run)
DEFAULT_BANDS = 8


def run_strategy(
    n: int,
    expected_batch: float,
    steps: int,
    *,
    bands: int | None,
    target_epsilon: float | None,
    delta: float,
    momentum: float = 0.0,
    relation: str = "add-remove",
    accountant: str = "pld",
) -> tuple[int, np.ndarray]:
    """A run's bands b (given, or chosen) and its strategy's coefficients for its ``steps`` private steps.

    b must fit the run (b <= T) and the sampler (m·b <= n: a partition of n/b records supplies the expected batch
    on average). ``bands=None``: with a target ε, the b of :data:`BAND_CHOICES` with the least noise RMSE at that ε
    (:func:`best_bands`, a public computation); without one, :data:`DEFAULT_BANDS`, lowered to what fits.
    ``momentum``: the workload's (SGD momentum β; 0 for the prefix sums).
    """
    m = check_positive("expected_batch", expected_batch)
    fits = max(1, min(steps, int(n // m)))
    b = bands
    if b is None:
        if target_epsilon is not None:
            b = best_bands(target_epsilon, delta, n, m, steps, choices=[c for c in BAND_CHOICES if c <= fits],
                           momentum=momentum, relation=relation, accountant=accountant, tolerance=0.01)[0]  # fmt: skip
        else:
            b = min(DEFAULT_BANDS, fits)
    if b > steps:
        raise ValueError(f"bands must be <= the run's {steps} private steps, got bands={b}")
    if m * b / n > 1:
        raise ValueError(f"bands={b} is too many for batch_size {m:g} and {n} records (a partition of n/b records "
                         f"must supply the expected batch): use bands <= {max(1, int(n // m))}")  # fmt: skip
    return b, banded_toeplitz_strategy(steps, b, momentum=momentum)


def best_bands(
    target_epsilon: float,
    delta: float,
    n: int,
    expected_batch: float,
    steps: int,
    *,
    choices: Sequence[int] = BAND_CHOICES,
    momentum: float = 0.0,
    relation: str = "add-remove",
    accountant: str = "pld",
    tolerance: float = 1e-3,
) -> tuple[int, float, dict[int, float]]:
    """(best b, its :func:`relative_rmse`, the ratio of every feasible b) over ``choices``.

    A b is feasible when a partition can supply the expected batch (expected_batch·b <= n).
    """
    n = check_int("n", n, minimum=1)
    m = check_positive("expected_batch", expected_batch)
    ratios: dict[int, float] = {}
    for b in choices:
        b = check_int("choices[i]", b, minimum=1)
        if m * b > n:
            continue
        ratios[b] = relative_rmse(target_epsilon, delta, n, m, steps, b, momentum=momentum, relation=relation,
                                  accountant=accountant, tolerance=tolerance)  # fmt: skip
    if not ratios:
        raise ValueError(f"choices must hold a b with expected_batch·b <= n={n}, got {list(choices)!r}")
    best = min(ratios, key=lambda k: (ratios[k], k))
    return best, ratios[best], ratios


#: The settings of the RMSE table (issue 27): (name, n, expected batch m, steps T, δ). The image preset is
#: IMAGE_PRESETS["fashion-mnist"] (60,000 images, m = 512, one epoch: T = round(60000/512) = 117); Adult is
#: PRESETS["adult"]'s DP-SGD (n = 32,561 training rows, m = 1024, 5 epochs: T = round(5·32561/1024) = 159) and
#: its FDP (Alg. 1) (m = 512, 3 epochs: T = 191). tests/test_bandmf.py checks them against the presets.
RMSE_SETTINGS: tuple[tuple[str, int, int, int, float], ...] = (
    ("fashion-mnist", 60_000, 512, 117, 1e-5),
    ("adult (dpsgd)", 32_561, 1024, 159, 1e-5),
    ("adult (fdp)", 32_561, 512, 191, 1e-5),
)


def rmse_table(
    epsilons: Sequence[float] = (0.1, 1.0, 8.0), *, momentum: float = 0.0, accountant: str = "pld"
) -> list[dict[str, Any]]:
    """One row per (setting, ε) of :data:`RMSE_SETTINGS`: the best b of :data:`BAND_CHOICES` and its RMSE ratio."""
    rows = []
    for name, n, m, steps, delta in RMSE_SETTINGS:
        for eps in epsilons:
            b, ratio, ratios = best_bands(eps, delta, n, m, steps, momentum=momentum, accountant=accountant)
            rows.append({"setting": name, "n": n, "m": m, "steps": steps, "delta": delta, "epsilon": eps,
                         "best_bands": b, "ratio": ratio, "ratios": ratios})  # fmt: skip
    return rows


def _main() -> None:  # pragma: no cover - the table of the report: python -m featuredp.noise.bandmf
    # PLD is featuredp's accountant; RDP is what jax_privacy's amplified-BandMF helper calibrates with by default.
    for momentum, accountant in ((0.0, "pld"), (0.0, "rdp"), (0.9, "pld")):
        workload = "prefix sums" if momentum == 0 else f"SGD momentum {momentum}"
        print(f"\nworkload: {workload}; both σ calibrated with the {accountant.upper()} accountant")
        print("| setting | n | m | T | ε | best b | RMSE ratio | ratio per b |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rmse_table(momentum=momentum, accountant=accountant):
            per_b = ", ".join(f"{b}: {v:.3f}" for b, v in r["ratios"].items())
            print(f"| {r['setting']} | {r['n']} | {r['m']} | {r['steps']} | {r['epsilon']:g} | {r['best_bands']} | "
                  f"{r['ratio']:.3f} | {per_b} |")  # fmt: skip


if __name__ == "__main__":  # pragma: no cover
    _main()
