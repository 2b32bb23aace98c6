"""f-DP: trade-off curves of a run, (ε, δ) ↔ f conversions, and Theorem 4's attribute-inference bound.

A trade-off function f(α) is the smallest type-II error (β) of any test between two
neighbouring datasets whose type-I error is α. A mechanism with privacy profile δ(ε)
is f-DP for (Dong, Roth & Su 2019, Prop. 2.12 / the dual of the profile)

    f(α) = sup_ε max(0, 1 − δ(ε) − e^ε α, e^{−ε}(1 − δ(ε) − α)).

Taking the sup over a finite grid of ε gives a curve *below* the true f (a valid, slightly
conservative trade-off function), so bounds derived from it — e.g. attack success
1 − f(Ball) — are upper bounds. Theorem 4 (paper §4): an adversary who sees the model and
knows Ψ(x) = u guesses the private part within radius ρ with probability at most
1 − f(Ball), where Ball is the best success possible without the model; for (ε, δ)-DP
this is at most e^ε·Ball + δ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import dp_accounting
import numpy as np

from featuredp._io import atomic_save_png
from featuredp._validate import check_nonnegative, check_open_unit
from featuredp.accounting._gaussian import gaussian_tradeoff
from featuredp.accounting.accountant import DEFAULT_RTOL, compute_epsilon, privacy_profile
from featuredp.accounting.events import DpEvent, dpsgd_event

__all__ = [
    "attribute_inference_bound",
    "attribute_inference_bound_eps_delta",
    "delta_from_tradeoff",
    "epsilon_delta_tradeoff",
    "epsilon_from_tradeoff",
    "gaussian_tradeoff",
    "plot_tradeoff",
    "tradeoff_curve",
    "tradeoff_from_profile",
]


def _alphas(alphas: Any) -> np.ndarray:
    if alphas is None:
        # dense near 0 where attacks live, plus a uniform grid
        return np.unique(np.concatenate([[0.0], np.geomspace(1e-8, 1.0, 400), np.linspace(0, 1, 201)]))
    a = np.asarray(alphas, dtype=float)
    if a.ndim > 1 or a.size == 0 or np.any(~np.isfinite(a)) or np.any((a < 0) | (a > 1)):
        raise ValueError(f"alphas must be values in [0, 1], got {alphas!r}")
    return np.atleast_1d(a)


def tradeoff_from_profile(
    epsilons: np.ndarray, deltas: np.ndarray, alphas: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """f(α) = sup over the given (ε, δ(ε)) pairs of max(0, 1 − δ − e^ε α, e^{−ε}(1 − δ − α)).

    Every (ε, δ) pair the mechanism satisfies gives a valid lower bound on the trade-off;
    the pointwise maximum over the pairs is the best of them. Returns (alphas, f(alphas)).
    """
    eps = np.asarray(epsilons, dtype=float).reshape(-1)
    dlt = np.asarray(deltas, dtype=float).reshape(-1)
    if eps.shape != dlt.shape or eps.size == 0:
        raise ValueError(f"epsilons and deltas must have the same non-zero length, got {eps.size} and {dlt.size}")
    if np.any(eps < 0) or np.any((dlt < 0) | (dlt > 1)):
        raise ValueError("epsilons must be >= 0 and deltas in [0, 1]")
    a = _alphas(alphas)
    # (n_alpha, n_eps); chunked over ε so memory stays small for long grids
    f = np.zeros_like(a)
    for start in range(0, eps.size, 256):
        e = eps[start : start + 256][None, :]
        d = dlt[start : start + 256][None, :]
        with np.errstate(over="ignore", invalid="ignore"):
            t1 = 1 - d - np.exp(e) * a[:, None]
            t2 = np.exp(-e) * (1 - d - a[:, None])
        f = np.maximum(f, np.nan_to_num(np.maximum(t1, t2), nan=0.0, neginf=0.0).max(axis=1))
    return a, np.clip(f, 0.0, 1.0 - a)


def epsilon_delta_tradeoff(epsilon: float, delta: float, alphas: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """The trade-off function f_{ε,δ}(α) = max(0, 1 − δ − e^ε α, e^{−ε}(1 − δ − α)) of (ε, δ)-DP.

    >>> alphas, betas = epsilon_delta_tradeoff(1.0, 0.0, [0.0, 0.1, 0.5])
    >>> betas.round(4).tolist()
    [1.0, 0.7282, 0.1839]
    """
    epsilon = check_nonnegative("epsilon", epsilon)
    delta = check_nonnegative("delta", delta)
    if delta > 1:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    return tradeoff_from_profile(np.array([epsilon]), np.array([delta]), alphas)


def _epsilon_grid(event: DpEvent, relation: str, accountant: str, num: int, rtol: float) -> np.ndarray:
    # ε from 0 to where δ(ε) is negligible (ε at δ = 1e-12), denser at small ε where the curve bends.
    eps_max = compute_epsilon(event, 1e-12, relation=relation, accountant=accountant, rtol=rtol)
    if not math.isfinite(eps_max):
        return np.array([0.0])
    eps_max = max(eps_max, 1e-6)
    return np.unique(np.concatenate([[0.0], np.linspace(0, eps_max, num // 2), np.geomspace(1e-4, eps_max, num // 2)]))


def _as_event(event_or_params: Any) -> DpEvent:
    if isinstance(event_or_params, dp_accounting.DpEvent):  # DpEvent is an alias: isinstance needs the class
        return event_or_params
    if isinstance(event_or_params, dict):
        keys = {"noise_multiplier", "sampling_rate", "steps"}
        if not keys <= set(event_or_params):
            raise ValueError(f"event_or_params must have keys {sorted(keys)}, got {sorted(event_or_params)}")
        return dpsgd_event(event_or_params["noise_multiplier"], event_or_params["sampling_rate"],
                           event_or_params["steps"])
    if isinstance(event_or_params, Sequence) and not isinstance(event_or_params, str) and len(event_or_params) == 3:
        return dpsgd_event(*event_or_params)
    raise TypeError(
        "event_or_params must be a DpEvent, a dict with noise_multiplier/sampling_rate/steps, or a "
        f"(noise_multiplier, sampling_rate, steps) tuple; got {event_or_params!r}"
    )


def tradeoff_curve(
    event_or_params: Any,
    alphas: Any = None,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
    num_epsilons: int = 400,
    rtol: float = DEFAULT_RTOL,
) -> tuple[np.ndarray, np.ndarray]:
    """The trade-off curve (α, f(α)) of a run from its privacy profile (a valid lower bound of the true f).

    ``event_or_params`` is a DpEvent, or (noise_multiplier, sampling_rate, steps) as a
    tuple or dict. The profile δ(ε) is evaluated on ``num_epsilons`` values of ε.
    """
    event = _as_event(event_or_params)
    if int(num_epsilons) < 2:
        raise ValueError(f"num_epsilons must be >= 2, got {num_epsilons!r}")
    grid = _epsilon_grid(event, relation, accountant, int(num_epsilons), rtol)
    deltas = privacy_profile(event, grid, relation=relation, accountant=accountant, rtol=rtol)
    return tradeoff_from_profile(grid, deltas, alphas)


def delta_from_tradeoff(alphas: Any, betas: Any, epsilon: float) -> float:
    """δ(ε) = sup_α (1 − f(α) − e^ε α) of the curve through the given points (f-DP → (ε, δ)).

    Exact for the piecewise-linear curve through the points; for a convex f sampled at
    these α, that curve lies above f, so the result can be slightly *below* the true δ
    of f — sample α densely (especially near 0).
    """
    epsilon = check_nonnegative("epsilon", epsilon)
    a = _alphas(alphas)
    b = np.asarray(betas, dtype=float).reshape(-1)
    if b.shape != a.shape:
        raise ValueError(f"alphas and betas must have the same length, got {a.size} and {b.size}")
    with np.errstate(over="ignore"):
        d = 1 - b - np.exp(epsilon) * a
    return float(np.clip(np.max(d), 0.0, 1.0))


def epsilon_from_tradeoff(alphas: Any, betas: Any, delta: float) -> float:
    """The smallest ε with delta_from_tradeoff(ε) <= ``delta`` (f-DP → (ε, δ); ∞ if none)."""
    delta = check_open_unit("delta", delta)
    if delta_from_tradeoff(alphas, betas, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while delta_from_tradeoff(alphas, betas, hi) > delta:
        hi *= 2
        if hi > 1e4:
            return math.inf
    lo = 0.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if delta_from_tradeoff(alphas, betas, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def attribute_inference_bound_eps_delta(epsilon: float, delta: float, ball: Any) -> Any:
    """The (ε, δ) form of Theorem 4: attack success <= min(1, e^ε·Ball + δ).

    >>> round(attribute_inference_bound_eps_delta(1.0, 1e-5, 0.1), 4)
    0.2718
    """
    epsilon = check_nonnegative("epsilon", epsilon)
    delta = check_nonnegative("delta", delta)
    b = _ball(ball)
    out = np.minimum(1.0, np.exp(epsilon) * b + delta)
    return float(out) if np.ndim(ball) == 0 else out


def _ball(ball: Any) -> np.ndarray:
    b = np.asarray(ball, dtype=float)
    if b.size == 0 or np.any(~np.isfinite(b)) or np.any((b < 0) | (b > 1)):
        raise ValueError(f"ball must be a probability in [0, 1], got {ball!r}")
    return b


def attribute_inference_bound(
    event_or_params: Any,
    ball: Any,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
    num_epsilons: int = 400,
) -> Any:
    """Theorem 4: the success of attribute inference is at most 1 − f(Ball).

    ``event_or_params``: a DpEvent, (noise_multiplier, sampling_rate, steps), or a dict of
    those, or ``{"epsilon": ε, "delta": δ}`` for the (ε, δ) trade-off. ``ball``: the best
    success possible without the model (scalar or array). Because f comes from a finite
    ε grid (a lower bound of the true f), the returned value is an upper bound.
    """
    b = _ball(ball)
    if isinstance(event_or_params, dict) and {"epsilon", "delta"} <= set(event_or_params):
        _, f = epsilon_delta_tradeoff(event_or_params["epsilon"], event_or_params["delta"], b.reshape(-1))
    else:
        _, f = tradeoff_curve(event_or_params, b.reshape(-1), relation=relation, accountant=accountant,
                              num_epsilons=num_epsilons)
    out = np.clip(1.0 - f, 0.0, 1.0).reshape(b.shape)
    # 1 − f(α) >= α always (f(α) <= 1 − α): the model can only help the attacker
    out = np.maximum(out, b)
    return float(out) if np.ndim(ball) == 0 else out


def plot_tradeoff(
    path: str,
    alphas: np.ndarray,
    betas: np.ndarray,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    title: str | None = None,
) -> None:
    """Draw the trade-off curve (and the (ε, δ) curve if given) into a PNG, written atomically."""
    import matplotlib  # lazy: plotting is optional and matplotlib is slow to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot(alphas, betas, label="trade-off f(α) of the run", color="C0")
    if epsilon is not None and delta is not None and math.isfinite(epsilon):
        a, f = epsilon_delta_tradeoff(epsilon, delta)
        ax.plot(a, f, "--", color="C1", label=f"(ε={epsilon:.3g}, δ={delta:.1e}) line")
    ax.plot([0, 1], [1, 0], ":", color="grey", label="perfect privacy (1 − α)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("type I error α")
    ax.set_ylabel("type II error β")
    ax.set_aspect("equal")
    ax.legend(loc="upper right", fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    atomic_save_png(fig, path)
