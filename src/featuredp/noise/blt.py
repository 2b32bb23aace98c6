"""Correlated noise for DP-SGD and FDP: buffered linear Toeplitz (BLT) matrix factorization, a building block.

BLT (Dvijotham, McMahan, Pillutla, Steinke, Thakurta 2024, arXiv:2404.16706; McMahan, Xu, Zhang 2024,
arXiv:2408.08868) factors the workload A = B·C with C lower-triangular Toeplitz whose coefficients are a sum of d
geometric sequences: c_0 = 1, c_j = Σ_i ω_i·θ_i^(j−1). Unlike BandMF's b-banded C it correlates the noise of every
step with all the earlier ones, yet generates it with d buffers: training adds w_t = (C⁻¹ z)_t, and C w = z gives

    w_t = z_t − Σ_i ω_i·s_{i,t},     s_{i,t+1} = θ_i·s_{i,t} + w_t,     s_{i,0} = 0

(Algorithm 3 of arXiv:2408.08868), d vectors of memory, in float64 (:class:`BLTNoise`).

Participation and accounting (:mod:`featuredp.accounting.blt`, re-exported here). A BLT run samples with the same
cyclic sampler as BandMF (:class:`featuredp.sampling.BMinSepSampler`) over b = ⌊n/m⌋ secret partitions, one per step
of an epoch, each taken whole (rate m·b/n, at least 1 − m/n): a record takes part once per epoch, b steps apart,
as in multi-epoch DP-FTRL. C is not banded, so the cyclic Poisson amplification of BandMF does not apply; the run is
accounted as one Gaussian release with the min-sep sensitivity of C (no amplification), as jax_privacy accounts its
BLT and DP-FTRL runs. That is the trade: BLT's noise is far more correlated than BandMF's, DP-SGD's and BandMF's
sampling amplification is given up. :func:`blt_relative_rmse` says which wins for a run; at small ε and few
epochs amplification usually does.

The strategy (:func:`optimize_blt`) minimises the run's total squared error per unit of noise multiplier,
‖A C⁻¹‖_F²·Δ(C)², over θ in [0, 1)^d and ω >= 0 with Σ ω <= 1 (the region where the sensitivity argument holds), for
the run's workload (prefix sums, or SGD momentum's: :func:`featuredp.noise.bandmf.workload_coefficients`), with d chosen
among 1..:data:`MAX_BUFFERS`. Everything there is a function of public quantities (n, m, T, the workload).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize
from scipy.signal import lfilter
from scipy.special import expit

from featuredp._validate import check_int, check_positive
from featuredp.accounting.blt import (
    blt_coefficients,
    blt_epsilon,
    blt_event,
    blt_min_separation,
    blt_sensitivity,
    calibrate_blt_noise,
    check_blt_params,
    minsep_sensitivity,
    split_blt_params,
)
from featuredp.noise.bandmf import (
    RMSE_SETTINGS,
    _check_momentum,
    _frobenius_squared,
    best_bands,
    calibrate_bandmf_noise,
    noise_rmse,
    workload_coefficients,
)
from featuredp.noise.sources import CorrelatedNoise, NoiseSource

__all__ = [
    "MAX_BUFFERS",
    "BLTNoise",
    "blt_coefficients",
    "blt_epsilon",
    "blt_event",
    "blt_loss",
    "blt_min_separation",
    "blt_relative_rmse",
    "blt_sensitivity",
    "calibrate_blt_noise",
    "check_blt_params",
    "inverse_coefficients",
    "minsep_sensitivity",
    "optimize_blt",
    "rmse_table",
    "split_blt_params",
]

#: the most buffers :func:`optimize_blt` tries (more rarely help at the steps of a training run: arXiv:2408.08868)
MAX_BUFFERS = 4


def _polynomials(theta: np.ndarray, omega: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P, Q), increasing powers, with C(x) = Σ c_j x^j = P(x) / Q(x): Q = Π(1 − θ_i x), P = Q + x·Σ ω_i Π_{j≠i}."""
    q = np.poly(theta) if theta.size else np.ones(1)
    p = np.concatenate((q, [0.0]))
    for i in range(theta.size):
        others = np.poly(np.delete(theta, i)) if theta.size > 1 else np.ones(1)
        p[1 : 1 + others.size] += omega[i] * others
    return np.asarray(p[: theta.size + 1], dtype=np.float64), np.asarray(q, dtype=np.float64)


def inverse_coefficients(buf_decay: object, output_scale: object, n: int) -> np.ndarray:
    """The first n Toeplitz coefficients of C⁻¹ (the noise's correlation: w = C⁻¹ z), from C(x)⁻¹ = Q(x)/P(x).

    >>> inverse_coefficients([0.5], [0.5], 4).tolist()  # C(x) = (1 − 0·x)/(1 − x/2): C⁻¹ = 1 − x/2
    [1.0, -0.5, 0.0, 0.0]
    """
    theta, omega = check_blt_params(buf_decay, output_scale)
    n = check_int("n", n, minimum=1)
    p, q = _polynomials(theta, omega)
    impulse = np.zeros(n, dtype=np.float64)
    impulse[0] = 1.0
    return np.asarray(lfilter(q, p, impulse), dtype=np.float64)


def blt_loss(buf_decay: object, output_scale: object, n: int, min_sep: int, *, momentum: float = 0.0) -> float:
    """‖A C⁻¹‖_F²·Δ(C)²: the n-step workload's total squared error per unit of noise multiplier, Δ the min-sep
    sensitivity with separation ``min_sep`` (all ⌈n/min_sep⌉ participations). With d = 0 (C = I) and prefix sums
    it is n(n + 1)/2 · ⌈n/min_sep⌉.

    >>> blt_loss([], [], 4, 4)
    10.0
    """
    theta, omega = check_blt_params(buf_decay, output_scale)
    n = check_int("n", n, minimum=1)
    p, q = _polynomials(theta, omega)
    h = np.asarray(lfilter(q, p, workload_coefficients(n, momentum)), dtype=np.float64)
    sens = minsep_sensitivity(blt_coefficients(theta, omega, n), n, min_sep)
    return _frobenius_squared(h) * sens * sens


def _unpack(x: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """θ = sigmoid(u), ω = sigmoid(r)·softmax(v): the valid region, unconstrained."""
    u, v, r = x[:d], x[d : 2 * d], x[2 * d]
    theta = expit(u)  # no overflow however far a line search wanders
    e = np.exp(v - v.max())
    omega = e / e.sum() * float(expit(r))
    while omega.sum() > 1.0:  # rounding: Σω may come out an ulp above 1, outside the valid region
        omega = np.nextafter(omega, 0.0)
    return np.minimum(theta, 1.0 - 1e-12), omega


def _objective(x: np.ndarray, d: int, n: int, b: int, a: np.ndarray, weights: np.ndarray) -> float:
    theta, omega = _unpack(x, d)
    with np.errstate(all="ignore"):
        p, q = _polynomials(theta, omega)
        h = lfilter(q, p, a)
        frob = float(np.dot(weights, h * h))
        if not (math.isfinite(frob) and frob > 0):
            return 1e6  # an unstable C⁻¹: the line search backs off
        sens = minsep_sensitivity(blt_coefficients(theta, omega, n), n, b)
    return math.log(frob) + 2.0 * math.log(sens)


def _starts(d: int, n: int) -> list[np.ndarray]:
    """A few deterministic starts: decays spread from fast to about 1/n, and two output scales."""
    out = []
    for total in (0.5, 0.9):
        for top in (math.log10(max(n, 10)), 1.0 + 0.5 * math.log10(max(n, 10))):
            gaps = np.logspace(-0.3, -top, d)  # 1 − θ_i
            theta = np.clip(1.0 - gaps, 1e-3, 1 - 1e-9)
            u = np.log(theta / (1.0 - theta))
            out.append(np.concatenate((u, np.zeros(d), [math.log(total / (1.0 - total))])))
    return out


def optimize_blt(n_steps: int, min_sep: int, *, buffers: int | None = None, momentum: float = 0.0,
                 iters: int = 300) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(θ, ω) of the BLT strategy that minimises :func:`blt_loss` for ``n_steps`` steps, participation separation
    ``min_sep`` and SGD momentum ``momentum``; ``buffers``: d (default: buffers are added, up to
    :data:`MAX_BUFFERS`, while one more lowers the loss by more than 0.5 %, and the fewest within 0.5 % of the best
    is kept). L-BFGS from a few deterministic starts, in float64; the result is deterministic and
    never worse than C = I (DP-SGD's noise, returned as d = 0 when nothing beats it).

    >>> theta, omega = optimize_blt(64, 64, buffers=1)
    >>> blt_loss(theta, omega, 64, 64) < blt_loss([], [], 64, 64)
    True
    """
    n = check_int("n_steps", n_steps, minimum=1)
    b = check_int("min_sep", min_sep, minimum=1)
    beta = _check_momentum(momentum)
    iters = check_int("iters", iters, minimum=0)
    choices = range(1, MAX_BUFFERS + 1) if buffers is None else [check_int("buffers", buffers, minimum=1)]
    a = workload_coefficients(n, beta)
    weights = np.arange(n, 0, -1, dtype=np.float64)
    none = np.empty(0, dtype=np.float64)
    best: dict[int, tuple[float, np.ndarray, np.ndarray]] = {0: (math.log(blt_loss(none, none, n, b, momentum=beta)),
                                                                  none, none)}  # fmt: skip
    if n == 1:
        return none, none
    for d in choices:
        found = best[0]
        for x0 in _starts(d, n):
            res = minimize(_objective, x0, args=(d, n, b, a, weights), method="L-BFGS-B",
                           options={"maxiter": iters})  # fmt: skip
            f = _objective(res.x, d, n, b, a, weights)
            if f < found[0]:
                theta, omega = _unpack(res.x, d)
                found = (f, theta, omega)
        best[d] = found
        if buffers is None and found[0] > best[d - 1][0] - math.log(1.005):
            break  # one more buffer gained less than 0.5 %: more rarely do, and each costs a search
    floor = min(v[0] for v in best.values())
    d = min(k for k, v in best.items() if v[0] <= floor + math.log(1.005))
    order = np.argsort(-best[d][1], kind="stable")
    return best[d][1][order].copy(), best[d][2][order].copy()


class BLTNoise(CorrelatedNoise):
    """Correlated noise w_t = (C⁻¹ z)_t for the BLT C with decays ``buf_decay`` (θ) and scales ``output_scale`` (ω),
    online with d buffers (module docstring; memory d·dim·8 bytes); the rest is :class:`CorrelatedNoise`'s. With
    d = 0 (C = I) it returns bit for bit what ``source.add`` returns for the same generator state.
    """

    kind = "BLT"
    _not_copied = (
        "BLTNoise holds its buffers, which fix part of the noise of every later step: it must not be copied or "
        "pickled (save state_dict() to the private checkpoint only)"
    )

    def __init__(self, buf_decay: object, output_scale: object, dim: int, source: NoiseSource) -> None:
        self.theta, self.omega = check_blt_params(buf_decay, output_scale)
        super().__init__(dim, source)
        self.description = (
            f"buffered linear Toeplitz correlated noise C^-1 z (BLT, {self.buffers} buffers, float64 recurrence) of "
            f"z from: {source.description}"
        )

    @property
    def buffers(self) -> int:
        """d, the number of buffers."""
        return int(self.theta.size)

    def _buffer_rows(self) -> int:
        return self.buffers

    def _params(self) -> dict[str, torch.Tensor]:
        return {"buf_decay": torch.from_numpy(self.theta.copy()), "output_scale": torch.from_numpy(self.omega.copy())}

    def _correlate(self, z: torch.Tensor, buffers: torch.Tensor | None) -> torch.Tensor:
        if buffers is None:
            return z
        w = z
        for i in range(self.buffers):
            w.sub_(buffers[i], alpha=float(self.omega[i]))
        for i in range(self.buffers):
            buffers[i].mul_(float(self.theta[i])).add_(w)
        return w

    def __repr__(self) -> str:  # never the buffers
        return f"BLTNoise(buffers={self.buffers}, dim={self.dim}, step={self._step})"


def blt_relative_rmse(target_epsilon: float, delta: float, n: int, expected_batch: float, steps: int, *,
                      momentum: float = 0.0, params: Sequence[float] | np.ndarray | None = None,
                      relation: str = "add-remove", accountant: str = "pld",
                      tolerance: float = 1e-3) -> tuple[float, np.ndarray]:  # fmt: skip
    """(noise RMSE of the workload under BLT over that of DP-SGD at the same (ε, δ), the BLT's flat parameters).

    BLT: the strategy from :func:`optimize_blt` (or ``params``), σ from :func:`calibrate_blt_noise` (one Gaussian,
    min-sep sensitivity), RMSE = σ·sqrt(‖A C⁻¹‖_F²/steps). DP-SGD: Poisson rate m/n, ``steps`` steps, C = I. Below 1:
    BLT adds less noise.
    """
    m = check_positive("expected_batch", expected_batch)
    b = blt_min_separation(n, m)
    if params is None:
        theta, omega = optimize_blt(steps, b, momentum=momentum)
        params = np.concatenate((theta, omega))
    theta, omega = split_blt_params(params)
    kw: dict[str, Any] = {"relation": relation, "accountant": accountant, "tolerance": tolerance}
    sigma = calibrate_blt_noise(target_epsilon, delta, params, m, n, steps, **kw)
    p, q = _polynomials(theta, omega)
    h = np.asarray(lfilter(q, p, workload_coefficients(steps, momentum)), dtype=np.float64)
    rmse = sigma * math.sqrt(_frobenius_squared(h) / steps)
    sigma_1 = calibrate_bandmf_noise(target_epsilon, delta, m, n, steps, 1, [1.0], **kw)
    return rmse / noise_rmse([1.0], steps, sigma_1, momentum=momentum), np.asarray(params, dtype=np.float64)


def rmse_table(epsilons: Sequence[float] = (0.1, 1.0, 8.0), *, momentum: float = 0.0,
               accountant: str = "pld") -> list[dict[str, Any]]:  # fmt: skip
    """One row per (setting, ε) of :data:`featuredp.noise.bandmf.RMSE_SETTINGS`: BLT's RMSE ratio to DP-SGD beside
    BandMF's (its best b), each calibrated to the same (ε, δ)."""
    rows = []
    for name, n, m, steps, delta in RMSE_SETTINGS:
        theta, omega = optimize_blt(steps, blt_min_separation(n, m), momentum=momentum)
        params = np.concatenate((theta, omega))
        for eps in epsilons:
            ratio, _ = blt_relative_rmse(eps, delta, n, m, steps, momentum=momentum, params=params,
                                         accountant=accountant)  # fmt: skip
            b, band_ratio, _ = best_bands(eps, delta, n, m, steps, momentum=momentum, accountant=accountant)
            rows.append({"setting": name, "n": n, "m": m, "steps": steps, "epsilon": eps, "buffers": int(theta.size),
                         "blt_ratio": ratio, "bandmf_bands": b, "bandmf_ratio": band_ratio})  # fmt: skip
    return rows


def _main() -> None:  # pragma: no cover - the table of the report: python -m featuredp.noise.blt
    for momentum in (0.0, 0.9):
        workload = "prefix sums" if momentum == 0 else f"SGD momentum {momentum}"
        print(f"\nworkload: {workload}; noise RMSE over DP-SGD's at the same (ε, δ), PLD accountant")
        print("| setting | n | m | T | ε | BLT (buffers) | BandMF (best b) |")
        print("|---|---|---|---|---|---|---|")
        for r in rmse_table(momentum=momentum):
            print(f"| {r['setting']} | {r['n']} | {r['m']} | {r['steps']} | {r['epsilon']:g} | {r['blt_ratio']:.3f} "
                  f"({r['buffers']}) | {r['bandmf_ratio']:.3f} (b = {r['bandmf_bands']}) |")


if __name__ == "__main__":  # pragma: no cover
    _main()
