"""Group privacy of the Poisson-subsampled Gaussian: the (ε, δ) of a group of k records (add/remove).

A value repeated in k records of a training set (one customer's name in k of their messages) is protected as a
*group*: the neighbouring datasets differ in k records, not one. For T steps of DP-SGD / Algorithm 1 with Poisson
rate q and noise multiplier σ, each record of the group is sampled independently, so one step's clipped sum moves
by at most J·C with J ~ Binomial(k, q); with every member's gradient on the same unit vector (the worst case) one
step is the *mixture of Gaussians* mechanism N(0, σ²) against Σ_j P(J = j)·N(j, σ²) (dp-accounting's
``MixtureOfGaussiansDpEvent``; Choquette-Choo et al. 2023, arXiv:2310.15526; the tight group bound of the
subsampled Gaussian, Schuchardt et al. 2024), composed T times with the PLD accountant.

* ``"mixture"``: all k + 1 terms (exact up to the PLD's pessimistic discretisation);
* ``"mixture-truncated"``: for large k, the terms of J above a j_max whose tail is negligible are moved to J = 0;
  the moved mass η (over T steps, T × the per-step tail) changes the output distribution by at most η in total
  variation, so the stated δ is met with δ' = δ − 10⁻³δ for the truncated mixture and e^ε·η ≤ 10⁻³δ checked
  after the fact;
* ``"upper-bound"``: when the mixture needs more than :data:`MAX_TERMS` terms (or ``accountant="rdp"``, which has
  no mixture), the group is sampled with probability 1 − (1 − q)^k and then moves the sum by at most k·C:
  ``PoissonSampledDpEvent(1 − (1 − q)^k, GaussianDpEvent(σ/k))`` dominates every step (joint convexity of the
  hockey-stick divergence over the mixture's terms, and the shift k is the worst of them), hence the composition.

numpy / scipy / dp-accounting only — never imports torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as _pld
from scipy import special, stats

from featuredp._validate import check_choice, check_int, check_open_unit, check_positive
from featuredp.accounting.accountant import (
    MAX_PLD_STEPS,
    compute_epsilon,
    epsilon_for,
    relative_interval,
    snap_interval,
)
from featuredp.accounting.events import ACCOUNTANTS, dpsgd_event

__all__ = ["MAX_TERMS", "GroupBound", "group_bound", "group_epsilon", "group_epsilon_lower"]

#: the most mixture terms (values of J) accounted exactly; a group that needs more gets the upper bound
MAX_TERMS = 128
# the share of δ set aside for the truncated tail (δ' = δ − _SLACK·δ and e^ε·η <= _SLACK·δ)
_SLACK = 1e-3
# the tail is cut where it is below _SLACK·δ/T · e^-_TAIL_EPS: enough for any ε up to _TAIL_EPS
_TAIL_EPS = 60.0
_RTOL = 2e-3
_ROUNDS = 7
_MAX_INTERVAL = 0.05
_MAX_COARSE_INTERVAL = 10.0


@dataclass(frozen=True)
class GroupBound:
    """ε of a group of ``size`` records at δ, and how it was computed (``method``: ``"mixture"``,
    ``"mixture-truncated"``, ``"upper-bound"``); ``terms``: the mixture's values of J accounted."""

    epsilon: float
    size: int
    method: str
    terms: int


@functools.lru_cache(maxsize=32)
def _mixture_pld(sigma: float, sens: tuple[float, ...], probs: tuple[float, ...], steps: int,
                 interval: float) -> _pld.PrivacyLossDistribution:  # fmt: skip
    return _pld.from_mixture_gaussian_mechanism(
        standard_deviation=sigma, sensitivities=list(sens), sampling_probs=list(probs),
        value_discretization_interval=interval,
    ).self_compose(steps)  # fmt: skip


def _mixture_epsilon(sigma: float, sens: tuple[float, ...], probs: tuple[float, ...], steps: int, delta: float,
                     scale: float) -> float:  # fmt: skip
    """Pessimistic PLD ε of T mixture steps; the interval refined ×3 until two answers agree within _RTOL."""
    cap = _MAX_COARSE_INTERVAL if scale > 100 else _MAX_INTERVAL
    first = relative_interval(steps) * max(scale, 0.1)
    best = math.inf
    prev: float | None = None
    for r in range(_ROUNDS):
        value = float(_mixture_pld(sigma, sens, probs, steps, snap_interval(first / 3**r, cap))
                      .get_epsilon_for_delta(delta))  # fmt: skip
        best = min(best, value)  # every answer is an upper bound: keep the least
        if prev is not None and value <= prev and (prev - value) / 4 <= max(_RTOL * value, 1e-5):
            break
        prev = value
    return best


def _upper_bound(sigma: float, q: float, steps: int, delta: float, k: int, accountant: str) -> float:
    q_group = -math.expm1(k * math.log1p(-q)) if q < 1 else 1.0
    return compute_epsilon(dpsgd_event(sigma / k, q_group, steps), delta, accountant=accountant)


def group_bound(noise_multiplier: float, sampling_rate: float, steps: int, delta: float, group_size: int, *,
                accountant: str = "pld") -> GroupBound:  # fmt: skip
    """:func:`group_epsilon` with how it was computed (:class:`GroupBound`)."""
    sigma = check_positive("noise_multiplier", noise_multiplier)
    q = float(sampling_rate)
    if not 0 < q <= 1:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
    steps = check_int("steps", steps, minimum=0)
    delta = check_open_unit("delta", delta)
    k = check_int("group_size", group_size, minimum=1)
    accountant = check_choice("accountant", accountant, ACCOUNTANTS)
    if steps == 0:
        return GroupBound(0.0, k, "mixture", 0)
    if accountant == "rdp" or steps > MAX_PLD_STEPS:
        return GroupBound(_upper_bound(sigma, q, steps, delta, k, accountant), k, "upper-bound", 0)
    j = np.arange(k + 1)
    logpmf = stats.binom.logpmf(j, k, q)
    logsf = stats.binom.logsf(j, k, q)
    scale = k * epsilon_for(sigma, q, steps, delta)
    tail_eps = _TAIL_EPS
    for _ in range(3):  # a larger ε needs a deeper cut (e^ε·η <= _SLACK·δ): retry with the ε found
        # cut the upper tail where it cannot matter for any ε up to tail_eps (checked after the fact)
        below = logsf <= math.log(_SLACK * delta / steps) - tail_eps
        j_max = int(np.argmax(below)) if np.any(below) else k
        pmf = np.exp(logpmf[: j_max + 1])
        keep = pmf > 0
        # what is dropped: the tail above j_max, and terms too small for a float (all moved to J = 0)
        dropped = np.concatenate([logpmf[j_max + 1:], logpmf[: j_max + 1][~keep]])
        log_drop = float(special.logsumexp(dropped)) if dropped.size else -math.inf
        if int(keep.sum()) > MAX_TERMS:
            break
        sens = tuple(float(v) for v in j[: j_max + 1][keep])
        probs = pmf[keep]
        if log_drop > -math.inf:
            if sens[0] == 0.0:
                probs[0] += math.exp(log_drop)
            else:
                sens, probs = (0.0, *sens), np.concatenate(([math.exp(log_drop)], probs))
        probs = probs / probs.sum()
        truncated = log_drop > -math.inf
        eps = _mixture_epsilon(sigma, sens, tuple(float(p) for p in probs), steps,
                               delta * (1 - _SLACK) if truncated else delta, scale)  # fmt: skip
        if not truncated or math.log(steps) + log_drop + eps <= math.log(_SLACK * delta):
            return GroupBound(eps, k, "mixture-truncated" if truncated else "mixture", len(sens))
        tail_eps, scale = eps + 10.0, eps
    # too many terms, or the moved mass is not negligible at this ε: the dominating event is always a valid bound
    return GroupBound(_upper_bound(sigma, q, steps, delta, k, accountant), k, "upper-bound", 0)


def group_epsilon(noise_multiplier: float, sampling_rate: float, steps: int, delta: float, group_size: int, *,
                  accountant: str = "pld") -> float:  # fmt: skip
    """ε at ``delta`` for a group of ``group_size`` records, ``steps`` steps of the Poisson-subsampled Gaussian.

    Add/remove neighbours that differ in ``group_size`` records (each sampled independently at
    ``sampling_rate``); an upper bound (module docstring: the mixture of Gaussians, or the dominating
    subsampled Gaussian at σ/k). ``group_size=1`` is the ordinary ε of :func:`featuredp.accounting.epsilon_for`.

    >>> round(group_epsilon(1.0, 1.0, 1, 1e-5, 2) / epsilon_for(0.5, 1.0, 1, 1e-5), 2)  # q = 1: sensitivity k
    1.0
    """
    return group_bound(noise_multiplier, sampling_rate, steps, delta, group_size, accountant=accountant).epsilon


def group_epsilon_lower(noise_multiplier: float, sampling_rate: float, steps: int, delta: float,
                        group_size: int) -> float:  # fmt: skip
    """A lower bound on the group ε: the best threshold test on the sum of the T outputs (remove direction).

    With the group's members on one unit vector, the sum of the T released coordinates is N(0, Tσ²) without the
    group and N(B, Tσ²), B ~ Binomial(kT, q), with it; any set S gives ε >= ln((P(S) − δ)/Q(S)), so the largest
    over thresholds t of S = {sum > t} is a lower bound on any valid ε (a check on the accountant, not a bound to
    state).
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    q = float(sampling_rate)
    steps = check_int("steps", steps, minimum=1)
    delta = check_open_unit("delta", delta)
    k = check_int("group_size", group_size, minimum=1)
    n = k * steps
    b = np.arange(n + 1)
    w = stats.binom.pmf(b, n, q)
    s = sigma * math.sqrt(steps)
    best = 0.0
    for t in np.linspace(0.0, n + 8 * s, 400):
        p = float(np.sum(w * stats.norm.sf((t - b) / s)))
        log_q = float(stats.norm.logsf(t / s))
        if p > delta:
            best = max(best, math.log(p - delta) - log_q)
    return best

