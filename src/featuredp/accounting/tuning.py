"""The privacy cost of private hyperparameter tuning: repeat a private run a random number of times, keep the best.

Papernot & Steinke (ICLR 2022, "Hyperparameter tuning with Renyi differential privacy") show that running a
DP mechanism Q a *random* number of times K and releasing only the best (candidate, model, score) costs little
more than one run, provided K is drawn from a suitable distribution and kept secret. Tuning with a fixed number
of trials k instead costs about k runs. With K ~ a truncated negative binomial D(η, γ) on {1, 2, ...}
(Theorem 2; η = 1: geometric, η = 0: logarithmic), if Q is (λ, ε(λ))-RDP at every order, the tuner is RDP with

    ε'(λ) = ε(λ) + (1 + η)·min over λ̂ of [(1 − 1/λ̂)·ε(λ̂) + log(1/γ)/λ̂] + log(E[K])/(λ − 1).

With K ~ Poisson(μ) (Theorem 6; K = 0 releases nothing): ε'(λ) = ε(λ) + μ·δ̂ + log(μ)/(λ − 1), where Q is
(ε̂, δ̂)-DP at ε̂ = log(1 + 1/(λ − 1)).

This module computes those bounds with its own RDP of the Poisson-subsampled Gaussian (Mironov, Talwar & Zhang
2019: exact at integer orders, add/remove) and its own RDP → (ε, δ) conversion (Canonne, Kamath & Steinke 2020),
so the tests can check it against dp-accounting's ``RepeatAndSelectDpEvent``, an independent implementation.
The event of a tuned run is that dp-accounting event, so ledgers and run files describe it in the usual way;
:func:`featuredp.accounting.compute_epsilon` sends every event holding one here (the PLD backend has no bound
for it).

numpy / scipy / dp-accounting only (no torch).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import dp_accounting
import numpy as np
from dp_accounting.dp_event import RepeatAndSelectDpEvent as _RepeatAndSelect
from scipy.special import gammaln, logsumexp

from featuredp._validate import check_open_unit, check_positive
from featuredp.accounting.events import DpEvent, check_relation, compose_events, dpsgd_event, gaussian_event

__all__ = [
    "DISTRIBUTIONS",
    "RDP_ORDERS",
    "SCORE_MU_SHARE",
    "calibrate_tuning_noise",
    "contains_tuning",
    "event_rdp",
    "rdp_to_epsilon",
    "repeat_and_select_rdp",
    "sample_trials",
    "score_noise_multiplier",
    "subsampled_gaussian_rdp",
    "tnb_gamma",
    "tnb_mean",
    "trial_event",
    "tuning_delta",
    "tuning_epsilon",
    "tuning_event",
]

#: integer Renyi orders: the subsampled-Gaussian formula below is exact at integers
RDP_ORDERS: tuple[int, ...] = (*range(2, 129), 160, 192, 256, 320, 384, 512, 768, 1024)

#: the distributions of the number of trials, by their shape η (math.inf: Poisson)
DISTRIBUTIONS: dict[str, float] = {"geometric": 1.0, "logarithmic": 0.0, "poisson": math.inf}


# ----------------------------------------------------------------------------- one run's RDP


def subsampled_gaussian_rdp(sampling_rate: float, noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """RDP ε(λ) of one Poisson-subsampled Gaussian step (add/remove), exact at the integer ``orders``.

    ε(λ) = log Σ_k C(λ, k)·(1−q)^(λ−k)·q^k·exp(k(k−1)/(2σ²)) / (λ − 1); at q = 1 this is λ/(2σ²).

    >>> float(subsampled_gaussian_rdp(1.0, 2.0, np.array([4]))[0])  # 4 / (2 · 4)
    0.5
    """
    q, sigma = float(sampling_rate), float(noise_multiplier)
    orders = np.asarray(orders, dtype=float)
    if q >= 1.0:
        return orders / (2 * sigma**2)
    out = np.empty(len(orders))
    for i, lam in enumerate(orders):
        k = np.arange(int(lam) + 1, dtype=float)
        log_binom = gammaln(lam + 1) - gammaln(k + 1) - gammaln(lam - k + 1)
        terms = log_binom + (lam - k) * math.log1p(-q) + k * math.log(q) + k * (k - 1) / (2 * sigma**2)
        out[i] = logsumexp(terms) / (lam - 1)
    return out


def rdp_to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """The smallest ε over ``orders`` with RDP ε(λ) → (ε, δ)-DP (Canonne, Kamath & Steinke 2020, Prop. 12).

    ε = ε(λ) + log((λ − 1)/λ) − (log δ + log λ)/(λ − 1), and never below 0.
    """
    delta = check_open_unit("delta", delta)
    lam = np.asarray(orders, dtype=float)
    eps = np.asarray(rdp, dtype=float) + np.log1p(-1 / lam) - (math.log(delta) + np.log(lam)) / (lam - 1)
    eps = eps[np.isfinite(eps)]
    return math.inf if eps.size == 0 else max(0.0, float(eps.min()))


def _rdp_to_delta(orders: np.ndarray, rdp: np.ndarray, epsilon: float) -> float:
    """The smallest δ with RDP ε(λ) → (ε, δ)-DP, by the same conversion solved for δ (at most 1)."""
    lam = np.asarray(orders, dtype=float)
    log_delta = (lam - 1) * (np.asarray(rdp, dtype=float) - epsilon + np.log1p(-1 / lam)) - np.log(lam)
    log_delta = log_delta[np.isfinite(log_delta)]
    return 1.0 if log_delta.size == 0 else float(min(1.0, math.exp(min(0.0, float(log_delta.min())))))


# ----------------------------------------------------------------------------- the number of trials


def tnb_mean(gamma: float, shape: float) -> float:
    """E[K] of the truncated negative binomial D(η = ``shape``, γ) on {1, 2, ...}.

    P(K = k) ∝ C(k + η − 1, k)·(1 − γ)^k; η = 1 is geometric (E[K] = 1/γ), η = 0 logarithmic,
    P(K = k) ∝ (1 − γ)^k / k (E[K] = (1/γ − 1)/log(1/γ)).

    >>> tnb_mean(0.1, 1.0)
    10.0
    """
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    if gamma == 1:
        return 1.0
    if shape == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    if shape == 1:
        return 1 / gamma
    return shape * (1 - gamma) / (gamma * -math.expm1(shape * math.log(gamma)))


def tnb_gamma(mean: float, shape: float) -> float:
    """The γ whose D(η, γ) has E[K] = ``mean`` (bisection; the larger E[K] side is returned, the safe one)."""
    if not mean >= 1:
        raise ValueError(f"mean number of trials must be >= 1, got {mean}")
    if shape == 1:
        return 1 / mean
    lo, hi = 0.0, 1.0  # tnb_mean decreases in γ: mean(lo) = ∞ > mean ≥ mean(hi) = 1
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if tnb_mean(mid, shape) < mean:
            hi = mid
        else:
            lo = mid
    return lo if lo > 0 else hi


def _shape(distribution: str | float) -> float:
    if isinstance(distribution, str):
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)} or a shape >= 0, "
                             f"got {distribution!r}")
        return DISTRIBUTIONS[distribution]
    shape = float(distribution)
    if math.isnan(shape) or shape < 0:
        raise ValueError(f"distribution shape must be >= 0, got {distribution!r}")
    return shape


def sample_trials(mean: float, distribution: str | float, uniform: Callable[[], float]) -> int:
    """Draw the number of trials K (secret) by inverting the CDF at ``uniform()`` ∈ [0, 1).

    ``uniform`` must be secret randomness (the tuner passes a ChaCha20 stream keyed by the OS): the guarantee
    holds only while K is unknown to whoever sees the result. Poisson may return 0 (nothing is released).
    """
    shape = _shape(distribution)
    mean = float(mean)
    u = float(uniform())
    if not 0 <= u < 1:
        raise ValueError(f"uniform() must return a value in [0, 1), got {u}")
    if math.isinf(shape):
        log_p, k = -mean, 0  # Poisson pmf, recursively
        cdf = math.exp(log_p)
        while cdf <= u and k < 10**7:
            k += 1
            log_p += math.log(mean) - math.log(k)
            cdf += math.exp(log_p)
        return k
    gamma = tnb_gamma(mean, shape)
    x = 1 - gamma
    if x <= 0:
        return 1
    # unnormalised p_k: η > 0: Γ(k+η)/(Γ(η) k!)·x^k, sum (γ^−η − 1); η = 0: x^k / k, sum log(1/γ)
    if shape == 0:
        total, p = math.log(1 / gamma), x
    else:
        total, p = math.expm1(-shape * math.log(gamma)), shape * x
    k, cdf = 1, p / total
    while cdf <= u and k < 10**7:
        p *= (k + shape) / (k + 1) * x
        k += 1
        cdf += p / total
    return k


# ----------------------------------------------------------------------------- repeat and select


def repeat_and_select_rdp(orders: np.ndarray, rdp: np.ndarray, mean: float, distribution: str | float) -> np.ndarray:
    """RDP at ``orders`` of running a mechanism with RDP ``rdp`` K times (E[K] = ``mean``) and keeping the best.

    Theorem 2 (truncated negative binomial, shape η ≥ 0) or Theorem 6 (Poisson) of Papernot & Steinke (2022);
    then the bound at each order is lowered to the smallest bound at any higher order (RDP grows with λ).
    """
    shape = _shape(distribution)
    lam = np.asarray(orders, dtype=float)
    eps = np.asarray(rdp, dtype=float)
    mean = float(mean)
    if mean < 1:
        raise ValueError(f"mean number of trials must be >= 1, got {mean}")
    if math.isinf(shape):
        out = np.array([
            eps[i] + mean * _rdp_to_delta(lam, eps, math.log1p(1 / (lam[i] - 1))) + math.log(mean) / (lam[i] - 1)
            for i in range(len(lam))
        ])
    else:
        gamma = tnb_gamma(mean, shape)
        # λ̂ also takes fractional values from 1.1 (dp-accounting's smallest default order): there ε(λ̂) ≤ ε at the
        # next order given (RDP grows with the order), a valid bound that matters where the best λ̂ is below 2.
        hat = np.unique(np.concatenate([1.1 + np.arange(0, 190) / 100, lam]))
        nxt = np.searchsorted(lam, hat, side="left")
        ok = nxt < len(lam)
        eps_hat = eps[nxt[ok]]
        const = (1 + shape) * float(np.min((1 - 1 / hat[ok]) * eps_hat + math.log(1 / gamma) / hat[ok]))
        out = eps + math.log(mean) / (lam - 1) + const
    return np.minimum.accumulate(out[::-1])[::-1] if np.all(np.diff(lam) > 0) else out


def tuning_event(trial_event: DpEvent, mean_trials: float, distribution: str | float = "geometric") -> DpEvent:
    """The event of a tuned run: ``trial_event`` repeated K times (E[K] = ``mean_trials``), the best kept."""
    shape = _shape(distribution)
    mean = check_positive("mean_trials", mean_trials)
    if mean < 1:
        raise ValueError(f"mean_trials must be >= 1, got {mean_trials}")
    return _RepeatAndSelect(trial_event, mean, shape)


# ----------------------------------------------------------------------------- events


def contains_tuning(event: DpEvent) -> bool:
    """Whether ``event`` holds a ``RepeatAndSelectDpEvent`` anywhere (only this module accounts those)."""
    if isinstance(event, _RepeatAndSelect):
        return True
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return contains_tuning(event.event)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return any(contains_tuning(e) for e in event.events)
    return False


def event_rdp(event: DpEvent, relation: str = "add-remove", orders: tuple[int, ...] = RDP_ORDERS) -> np.ndarray:
    """RDP at ``orders`` of an event made of Gaussians, Poisson-subsampled Gaussians, compositions and tuned runs.

    ``relation="replace-one"`` doubles a plain Gaussian's sensitivity and refuses Poisson sampling (no RDP bound
    here, as for the RDP backend).
    """
    relation = check_relation(relation)
    lam = np.asarray(orders, dtype=float)
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return np.zeros(len(lam))
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return np.full(len(lam), math.inf)
    if isinstance(event, dp_accounting.GaussianDpEvent):
        if event.noise_multiplier == 0:
            return np.full(len(lam), math.inf)
        sens = 2.0 if relation == "replace-one" else 1.0
        return lam * sens**2 / (2 * float(event.noise_multiplier) ** 2)
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        p = float(event.sampling_probability)
        if p >= 1:
            return event_rdp(event.event, relation, orders)
        if relation == "replace-one":
            raise ValueError(f"a tuned run has no RDP bound for relation='replace-one' with Poisson sampling "
                             f"(sampling_rate={p}); use relation='add-remove'")
        if not isinstance(event.event, dp_accounting.GaussianDpEvent):
            raise ValueError(f"Poisson sampling of {type(event.event).__name__} is not supported with a tuned run")
        if p == 0:
            return np.zeros(len(lam))
        if event.event.noise_multiplier == 0:
            return np.full(len(lam), math.inf)
        return subsampled_gaussian_rdp(p, float(event.event.noise_multiplier), lam)
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return event.count * event_rdp(event.event, relation, orders)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return sum((event_rdp(e, relation, orders) for e in event.events), np.zeros(len(lam)))
    if isinstance(event, _RepeatAndSelect):
        inner = event_rdp(event.event, relation, orders)
        return repeat_and_select_rdp(lam, inner, float(event.mean), float(event.shape))
    raise ValueError(f"event {type(event).__name__} is not supported in a budget that holds a tuned run")


def tuning_epsilon(event: DpEvent, delta: float, relation: str = "add-remove") -> float:
    """ε at ``delta`` of an event holding tuned runs (RDP, integer orders; an upper bound).

    >>> from featuredp.accounting import dpsgd_event
    >>> one = dpsgd_event(1.0, 0.01, 1000)
    >>> round(tuning_epsilon(one, 1e-5), 2), round(tuning_epsilon(tuning_event(one, 10), 1e-5), 2)
    (2.11, 4.11)
    """
    return rdp_to_epsilon(np.asarray(RDP_ORDERS, dtype=float), event_rdp(event, relation), delta)


def tuning_delta(event: DpEvent, epsilon: float, relation: str = "add-remove") -> float:
    """δ at ``epsilon`` of an event holding tuned runs (the same RDP bound as :func:`tuning_epsilon`)."""
    return _rdp_to_delta(np.asarray(RDP_ORDERS, dtype=float), event_rdp(event, relation), float(epsilon))


#: the score of each trial (its count of correct validation predictions) is released with Gaussian noise whose
#: μ is this share of the training's Gaussian-DP μ ≈ q·√T/σ (its RDP adds 1/16 of the training's at this share)
SCORE_MU_SHARE = 0.25


def score_noise_multiplier(noise_multiplier: float, sampling_rate: float, steps: int) -> float:
    """σ of the Gaussian noise on a trial's validation score (sensitivity 1): 1 / (share · q·√T/σ)."""
    mu = float(sampling_rate) * math.sqrt(max(1, int(steps))) / float(noise_multiplier)
    return 1.0 / (SCORE_MU_SHARE * mu)


def trial_event(noise_multiplier: float, sampling_rate: float, steps: int) -> DpEvent:
    """One trial of the tuner: DP-SGD / Algorithm 1 steps, then its noisy validation score."""
    return compose_events(
        dpsgd_event(noise_multiplier, sampling_rate, steps),
        gaussian_event(score_noise_multiplier(noise_multiplier, sampling_rate, steps)),
    )


def calibrate_tuning_noise(
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    mean_trials: float,
    distribution: str | float = "geometric",
    relation: str = "add-remove",
) -> float:
    """The smallest σ (to 0.1 %) whose tuned run — K trials of :func:`trial_event`, the best kept — has ε ≤ target.

    >>> sigma = calibrate_tuning_noise(2.0, 1e-5, 0.02, 600, 5)
    >>> tuned = tuning_event(trial_event(sigma, 0.02, 600), 5)
    >>> tuning_epsilon(tuned, 1e-5) <= 2.0
    True
    """
    target = check_positive("target_epsilon", target_epsilon)

    def eps(sigma: float) -> float:
        return tuning_epsilon(tuning_event(trial_event(sigma, sampling_rate, steps), mean_trials, distribution),
                              delta, relation)

    lo, hi = 0.05, 1.0
    while eps(hi) > target:
        lo, hi = hi, hi * 2
        if hi > 1e5:
            raise ValueError(f"no noise multiplier below 1e5 reaches epsilon={target_epsilon} for a tuned run "
                             f"(sampling_rate={sampling_rate}, steps={steps}, mean_trials={mean_trials})")
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        if eps(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi
