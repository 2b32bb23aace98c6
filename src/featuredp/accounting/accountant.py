"""ε(δ) and δ(ε) of privacy events: a tight PLD backend (default) and RDP for comparison.

Relations: ``"add-remove"`` (insertion/deletion of one record, the default; the
maximum over the add and the remove direction) and ``"replace-one"`` (one record
replaced by another; sensitivity 2 for the Gaussian).

PLD backend (dp-accounting's privacy loss distributions, pessimistic estimates, so
every number is an upper bound):

* Plain Gaussian releases (sampling rate 1) are combined in closed form: the exact
  analytic Gaussian profile with μ = Δ·sqrt(Σ T_i/σ_i²) (μ-GDP), no discretisation.
* Poisson-subsampled Gaussians use an *adaptive* discretisation: the interval is set
  relative to the expected ε (from a cheap RDP estimate) and refined ×3 until the
  estimated excess of the pessimistic answer over the exact one is <= ``rtol`` (relative)
  or 1e-5 (absolute). The cost of a PLD is ~ (support width)/(interval) and the support
  width scales with ε, so a relative interval makes the cost nearly independent of T.

RDP backend: dp-accounting's ``RdpAccountant`` with its default orders. For
``"replace-one"`` plain Gaussians are accounted with sensitivity 2 (σ/2); a
Poisson-subsampled event under ``"replace-one"`` has no RDP bound here and raises a
``ValueError`` that points to ``accountant="pld"`` (dp-accounting raises as well; we
do not silently substitute a looser or unproven conversion).

Tuned runs (an event holding dp-accounting's ``RepeatAndSelectDpEvent``: private hyperparameter tuning,
Papernot & Steinke 2022) have an RDP bound only: :mod:`featuredp.accounting.tuning` accounts every event that
holds one, whichever backend is asked for.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting.pld import privacy_loss_distribution as _pld

from featuredp._validate import check_nonnegative, check_open_unit, check_positive
from featuredp.accounting._gaussian import gaussian_delta, gaussian_epsilon
from featuredp.accounting.events import DpEvent, check_accountant, check_relation, dpsgd_event
from featuredp.accounting.tuning import contains_tuning, tuning_delta, tuning_epsilon

_NeighborRel = dp_accounting.NeighboringRelation
_DP_RELATION = {"add-remove": _NeighborRel.ADD_OR_REMOVE_ONE, "replace-one": _NeighborRel.REPLACE_ONE}
_SENSITIVITY = {"add-remove": 1.0, "replace-one": 2.0}

#: default relative tolerance of the adaptive PLD discretisation: estimated excess over the exact ε
DEFAULT_RTOL = 2e-3
# first interval = this × relative_interval(T) × the expected ε; then refined by _REFINE each round
_REL_INTERVAL_SCALE = 1.0
_REFINE = 3.0
_MIN_INTERVAL = 1e-7
_MAX_INTERVAL = 0.05
_MAX_ROUNDS = 8
# absolute floor on the tolerated excess of ε (ε below ~1e-4 is 'practically zero' anyway)
_EPS_ATOL = 1e-5

#: the most Poisson-subsampled steps the PLD backend accounts: its cost grows faster than the number of
#: steps (measured on one core at σ = 1, p = 0.01: 10⁶ steps 4 s, 3·10⁶ 20 s, 10⁷ about 2 min), so more
#: would take tens of minutes; the RDP backend (``accountant="rdp"``) costs the same for any number of steps.
MAX_PLD_STEPS = 10**7
# Large ε (ε ≳ 100: a vacuous guarantee, e.g. σ = 0.01): the PLD's support grows with ε, so at the usual
# cap of 0.05 on the interval it had millions of points (σ = 0.01, p = 0.0625, T = 320: 23 s and 2.2 GB;
# σ = 0.003: minutes, > 6 GB). Where the ε estimate exceeds _COARSE_FROM_EPSILON the interval may grow to
# _MAX_COARSE_INTERVAL: still pessimistic (an upper bound), and the relative rule keeps it within rtol.
_COARSE_FROM_EPSILON = 100.0
_MAX_COARSE_INTERVAL = 10.0


@dataclass(frozen=True)
class _Atom:
    """``count`` releases of a Gaussian with noise multiplier ``sigma``, Poisson-sampled at ``p`` (1 = none)."""

    sigma: float
    p: float
    count: int


class _NonPrivateError(Exception):
    """The event contains a non-private release (ε = ∞)."""


def _flatten(event: DpEvent, count: int = 1) -> list[_Atom] | None:
    """The event as Gaussian atoms, or None when it holds something else (generic path)."""
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return []
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        raise _NonPrivateError
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return _flatten(event.event, count * event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        atoms: list[_Atom] = []
        for sub in event.events:
            part = _flatten(sub, count)
            if part is None:
                return None
            atoms.extend(part)
        return atoms
    if isinstance(event, dp_accounting.GaussianDpEvent):
        if event.noise_multiplier == 0:
            raise _NonPrivateError
        return [_Atom(float(event.noise_multiplier), 1.0, count)]
    if isinstance(event, dp_accounting.PoissonSampledDpEvent) and isinstance(
        event.event, dp_accounting.GaussianDpEvent
    ):
        p = float(event.sampling_probability)
        if p == 0 or count == 0:
            return []
        if event.event.noise_multiplier == 0:
            raise _NonPrivateError
        return [_Atom(float(event.event.noise_multiplier), p, count)]
    return None


def _merge(atoms: list[_Atom]) -> tuple[float, list[_Atom]]:
    """(Σ count/σ² over plain Gaussians, subsampled atoms with equal (σ, p) merged)."""
    inv_var = 0.0
    counts: dict[tuple[float, float], int] = {}
    for a in atoms:
        if a.count <= 0:
            continue
        if a.p >= 1.0:
            inv_var += a.count / a.sigma**2
        else:
            counts[(a.sigma, a.p)] = counts.get((a.sigma, a.p), 0) + a.count
    return inv_var, [_Atom(s, p, c) for (s, p), c in sorted(counts.items())]


# ----------------------------------------------------------------------------- PLD


@functools.lru_cache(maxsize=16)
def _step_pld(sigma: float, p: float, relation: str, interval: float) -> _pld.PrivacyLossDistribution:
    return _pld.from_gaussian_mechanism(
        standard_deviation=sigma,
        sampling_prob=p,
        value_discretization_interval=interval,
        neighboring_relation=_DP_RELATION[relation],
    )


@functools.lru_cache(maxsize=8)
def _composed_pld(
    atoms: tuple[_Atom, ...], inv_var: float, relation: str, interval: float
) -> _pld.PrivacyLossDistribution:
    pld = None
    for a in atoms:
        part = _step_pld(a.sigma, a.p, relation, interval).self_compose(a.count)
        pld = part if pld is None else pld.compose(part)
    if inv_var > 0:
        g = _pld.from_gaussian_mechanism(
            standard_deviation=1.0 / math.sqrt(inv_var),
            value_discretization_interval=interval,
            neighboring_relation=_DP_RELATION[relation],
        )
        pld = g if pld is None else pld.compose(g)
    assert pld is not None  # callers only come here with at least one atom
    return pld


# few integer orders: a rough scale is enough, and fractional orders make dp-accounting log warnings
_GUESS_ORDERS = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128, 256, 512)


def _rdp_estimate(atoms: tuple[_Atom, ...], inv_var: float, delta: float) -> float:
    """A cheap estimate of ε (RDP, add-remove, integer orders); may be ∞."""
    acc = dp_accounting.rdp.RdpAccountant(orders=_GUESS_ORDERS)
    for a in atoms:
        acc.compose(dp_accounting.PoissonSampledDpEvent(a.p, dp_accounting.GaussianDpEvent(a.sigma)), a.count)
    if inv_var > 0:
        acc.compose(dp_accounting.GaussianDpEvent(1.0 / math.sqrt(inv_var)))
    return float(acc.get_epsilon(delta))


def _rdp_guess(atoms: tuple[_Atom, ...], inv_var: float, delta: float) -> float:
    """:func:`_rdp_estimate`, used only to pick the PLD interval (10 where it is 0, 1e6 where it is ∞)."""
    eps = _rdp_estimate(atoms, inv_var, delta)
    if math.isinf(eps):
        return 1e6  # a vacuous guarantee: start coarse (the refinement finds the answer)
    return eps if eps > 0 else 10.0


def pld_refusal(atoms: tuple[_Atom, ...]) -> str | None:
    """Why the PLD backend refuses these Poisson-subsampled ``atoms`` (more than :data:`MAX_PLD_STEPS`), or None."""
    steps = sum(a.count for a in atoms)
    if steps <= MAX_PLD_STEPS:
        return None
    return (f"steps={steps} is above the PLD accountant's limit of {MAX_PLD_STEPS:,} Poisson-subsampled steps "
            f"(its cost grows with the steps, 10 million take about 2 min: this would take "
            f"{_duration(4.0 * (steps / 1e6) ** 1.5)}); "
            "use accountant='rdp' (the same cost for any number of steps; a looser upper bound)")  # fmt: skip


def _duration(seconds: float) -> str:
    """A rough human duration: '40 s', '12 min', '3.5 h', '2.1 days'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.3g} days"


def _check_pld(atoms: tuple[_Atom, ...]) -> None:
    reason = pld_refusal(atoms)
    if reason is not None:
        raise ValueError(reason)


def snap_interval(interval: float, cap: float = _MAX_INTERVAL) -> float:
    """Round an interval down onto the grid 10^(k/8): nearby queries share cached PLDs, and it stays pessimistic."""
    interval = min(cap, max(_MIN_INTERVAL, interval))
    return 10 ** (math.floor(math.log10(interval) * 8 + 1e-9) / 8)


def relative_interval(steps: int) -> float:
    """A discretisation interval, relative to ε, that is a few % pessimistic after ``steps`` compositions.

    The excess of a pessimistic PLD grows with the number of compositions (≈ with √T at a
    fixed interval/ε in our measurements), and a single step's excess is at most one
    interval; so relative intervals can be coarse for few steps, and must shrink like 1/√T.
    """
    return min(1e-2, 0.3 / math.sqrt(max(1, steps)))


def _interval_schedule(eps_scale: float, sensitivity: float, steps: int) -> list[float]:
    cap = _MAX_COARSE_INTERVAL if eps_scale > _COARSE_FROM_EPSILON else _MAX_INTERVAL
    first = _REL_INTERVAL_SCALE * relative_interval(steps) * eps_scale * sensitivity
    first = min(cap, max(_MIN_INTERVAL * _REFINE**_MAX_ROUNDS, first))
    return [snap_interval(first / _REFINE**k, cap) for k in range(_MAX_ROUNDS)]


def _pld_adaptive(
    atoms: tuple[_Atom, ...],
    inv_var: float,
    relation: str,
    scale: float,
    query: Callable[[_pld.PrivacyLossDistribution], float],
    rtol: float,
    atol: float = 0.0,
) -> tuple[float, float]:
    """Refine the interval ×3 until the estimated excess of the last answer is <= ``rtol`` (relative).

    Observed (and expected for connect-the-dots PLDs) convergence is quadratic in the
    interval, so the excess of the finer answer is ≈ (difference of the last two)/8; we
    use /4 for margin; ``atol`` is an absolute floor on the tolerated excess (so that
    ε ≈ 1e-5 does not force absurdly fine intervals). Returns (the pessimistic, upper-bound
    answer, the interval that gave it).
    """
    prev: float | None = None
    best = (math.inf, _MAX_INTERVAL)
    steps = sum(a.count for a in atoms)
    for interval in _interval_schedule(scale, _SENSITIVITY[relation], steps):
        value = query(_composed_pld(atoms, inv_var, relation, interval))
        if value <= best[0]:
            best = (value, interval)
        if prev is not None and value <= prev and (prev - value) / 4 <= max(rtol * value, atol, 1e-15):
            return best
        prev = value
    return best


def _pld_epsilon(atoms: tuple[_Atom, ...], inv_var: float, relation: str, delta: float, rtol: float) -> float:
    _check_pld(atoms)
    scale = _rdp_guess(atoms, inv_var, delta)
    return _pld_adaptive(
        atoms, inv_var, relation, scale, lambda pld: pld.get_epsilon_for_delta(delta), rtol, _EPS_ATOL
    )[0]


def _pld_epsilon_fixed(atoms: tuple[_Atom, ...], inv_var: float, relation: str, delta: float, interval: float) -> float:
    """Pessimistic PLD ε at one given interval (snapped to the grid); an upper bound at any interval.

    Intervals above 1 (targets of ε ≳ 100) may stay coarse, up to _MAX_COARSE_INTERVAL.
    """
    cap = _MAX_COARSE_INTERVAL if interval > 1.0 else _MAX_INTERVAL
    return _composed_pld(atoms, inv_var, relation, snap_interval(interval, cap)).get_epsilon_for_delta(delta)


def _pld_delta(atoms: tuple[_Atom, ...], inv_var: float, relation: str, epsilon: float, rtol: float) -> float:
    _check_pld(atoms)
    scale = max(epsilon, 1e-2, min(_rdp_guess(atoms, inv_var, 1e-5), 1e6) if epsilon > _COARSE_FROM_EPSILON else 0.0)
    return _pld_adaptive(atoms, inv_var, relation, scale, lambda pld: pld.get_delta_for_epsilon(epsilon), rtol)[0]


def _generic_accountant(relation: str, accountant: str) -> Any:
    if accountant == "pld":
        return dp_accounting.pld.PLDAccountant(_DP_RELATION[relation], value_discretization_interval=1e-4)
    return dp_accounting.rdp.RdpAccountant(neighboring_relation=_NeighborRel.ADD_OR_REMOVE_ONE)


def _compose_generic(acc: Any, event: DpEvent, accountant: str) -> None:
    try:
        acc.compose(event)
    except dp_accounting.UnsupportedEventError as exc:
        raise ValueError(f"event {event!r} is not supported by accountant {accountant!r}: {exc}") from None


# ----------------------------------------------------------------------------- RDP


def _rdp_event(event: DpEvent, relation: str) -> DpEvent:
    """The event to feed dp-accounting's add/remove RDP accountant under ``relation``."""
    if relation == "add-remove":
        return event
    # replace-one: plain Gaussians have sensitivity 2 → σ/2. Subsampled events have no RDP bound here.
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return dp_accounting.GaussianDpEvent(event.noise_multiplier / 2)
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return dp_accounting.SelfComposedDpEvent(_rdp_event(event.event, relation), event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return dp_accounting.ComposedDpEvent([_rdp_event(e, relation) for e in event.events])
    if isinstance(event, (dp_accounting.NoOpDpEvent, dp_accounting.NonPrivateDpEvent)):
        return event
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        if event.sampling_probability >= 1:
            return _rdp_event(event.event, relation)
        raise ValueError(
            f"accountant='rdp' has no bound for relation='replace-one' with Poisson sampling "
            f"(sampling_rate={event.sampling_probability}); use accountant='pld', which supports it"
        )
    raise ValueError(f"event {event!r} is not supported by accountant 'rdp' with relation='replace-one'")


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    # dp-accounting logs a WARNING for every fractional RDP order whose series does not converge
    # (it drops that order, which is safe); users of the CLI should not see dozens of those lines.
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _rdp_accountant(event: DpEvent, relation: str) -> Any:
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=_NeighborRel.ADD_OR_REMOVE_ONE)
    with _quiet_absl():
        _compose_generic(acc, _rdp_event(event, relation), "rdp")
    return acc


# ----------------------------------------------------------------------------- public API


def _check_event(event: object) -> DpEvent:
    if not isinstance(event, dp_accounting.DpEvent):
        raise TypeError(f"event must be a dp_accounting.DpEvent, got {event!r} ({type(event).__name__})")
    return event


def compute_epsilon(
    event: DpEvent,
    delta: float,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
    rtol: float = DEFAULT_RTOL,
) -> float:
    """The smallest ε such that ``event`` is (ε, δ)-DP under ``relation`` (an upper bound; ∞ if non-private).

    ``rtol`` (PLD only) is the relative agreement of two successive discretisations
    at which the adaptive PLD stops; the answer is always the pessimistic (upper) one.

    >>> from featuredp.accounting import compose_events, gaussian_event
    >>> round(compute_epsilon(gaussian_event(2.0), 1e-5), 3)
    1.993
    >>> two = compose_events(gaussian_event(2.0), gaussian_event(2.0))  # = one release at σ = √2
    >>> round(compute_epsilon(two, 1e-5), 3)
    2.943
    """
    event = _check_event(event)
    delta = check_open_unit("delta", delta)
    relation = check_relation(relation)
    accountant = check_accountant(accountant)
    rtol = check_positive("rtol", rtol)
    if contains_tuning(event):  # a tuned run (repeat and select) has an RDP bound only, whatever the backend
        return tuning_epsilon(event, delta, relation)
    if accountant == "rdp":
        return float(_rdp_accountant(event, relation).get_epsilon(delta))
    try:
        atoms = _flatten(event)
    except _NonPrivateError:
        return math.inf
    if atoms is None:
        acc = _generic_accountant(relation, accountant)
        _compose_generic(acc, event, accountant)
        return float(acc.get_epsilon(delta))
    inv_var, sub = _merge(atoms)
    if not sub:
        return gaussian_epsilon(delta, _SENSITIVITY[relation] * math.sqrt(inv_var))
    return float(_pld_epsilon(tuple(sub), inv_var, relation, delta, rtol))


def compute_delta(
    event: DpEvent,
    epsilon: float,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
    rtol: float = DEFAULT_RTOL,
) -> float:
    """The smallest δ such that ``event`` is (ε, δ)-DP under ``relation`` (an upper bound; 1 if non-private).

    >>> from featuredp.accounting import gaussian_event
    >>> round(compute_delta(gaussian_event(1.0), 1.0), 4)
    0.1269
    """
    event = _check_event(event)
    epsilon = check_nonnegative("epsilon", epsilon)
    relation = check_relation(relation)
    accountant = check_accountant(accountant)
    rtol = check_positive("rtol", rtol)
    if contains_tuning(event):
        return tuning_delta(event, epsilon, relation)
    if accountant == "rdp":
        return float(_rdp_accountant(event, relation).get_delta(epsilon))
    try:
        atoms = _flatten(event)
    except _NonPrivateError:
        return 1.0
    if atoms is None:
        acc = _generic_accountant(relation, accountant)
        _compose_generic(acc, event, accountant)
        return float(acc.get_delta(epsilon))
    inv_var, sub = _merge(atoms)
    if not sub:
        return gaussian_delta(epsilon, _SENSITIVITY[relation] * math.sqrt(inv_var))
    return float(min(1.0, _pld_delta(tuple(sub), inv_var, relation, epsilon, rtol)))


def privacy_profile(
    event: DpEvent,
    epsilons: Any,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
    rtol: float = DEFAULT_RTOL,
) -> np.ndarray:
    """δ(ε) of ``event`` at each ε in ``epsilons`` (a numpy array; upper bounds, like ``compute_delta``).

    With the PLD backend the composed PLD is built once (at the interval the adaptive
    accountant chooses for δ = 1e-6) and queried at every ε.

    >>> from featuredp.accounting import gaussian_event
    >>> privacy_profile(gaussian_event(1.0), [0.0, 1.0]).round(4).tolist()
    [0.3829, 0.1269]
    """
    event = _check_event(event)
    eps = np.asarray(epsilons, dtype=float)
    if eps.ndim != 1 or eps.size == 0 or not np.all(np.isfinite(eps)) or np.any(eps < 0):
        raise ValueError(f"epsilons must be a non-empty 1-d array of finite values >= 0, got {epsilons!r}")
    relation = check_relation(relation)
    accountant = check_accountant(accountant)
    if contains_tuning(event):
        return np.array([tuning_delta(event, float(e), relation) for e in eps])
    if accountant == "rdp":
        acc = _rdp_accountant(event, relation)
        return np.array([min(1.0, acc.get_delta(float(e))) for e in eps])
    try:
        atoms = _flatten(event)
    except _NonPrivateError:
        return np.ones_like(eps)
    if atoms is None:
        acc = _generic_accountant(relation, accountant)
        _compose_generic(acc, event, accountant)
        return np.array([min(1.0, acc.get_delta(float(e))) for e in eps])
    inv_var, sub = _merge(atoms)
    if not sub:
        mu = _SENSITIVITY[relation] * math.sqrt(inv_var)
        return np.array([gaussian_delta(float(e), mu) for e in eps])
    sub_t = tuple(sub)
    _check_pld(sub_t)
    scale = _rdp_guess(sub_t, inv_var, 1e-6)
    _, interval = _pld_adaptive(
        sub_t, inv_var, relation, scale, lambda pld: pld.get_epsilon_for_delta(1e-6), check_positive("rtol", rtol)
    )
    pld = _composed_pld(sub_t, inv_var, relation, interval)
    return np.minimum(1.0, np.asarray(pld.get_delta_for_epsilon(eps), dtype=float))


def epsilon_for(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
) -> float:
    """ε of ``steps`` DP-SGD / Algorithm 1 steps (Poisson rate ``sampling_rate``, noise ``noise_multiplier``).

    >>> round(epsilon_for(1.0, 1.0, 1, 1e-5), 2)  # one full-batch Gaussian release (closed form)
    4.38
    >>> round(epsilon_for(1.0, 0.01, 100, 1e-5), 1)  # 100 Poisson-subsampled steps (PLD)
    0.7
    """
    return compute_epsilon(
        dpsgd_event(noise_multiplier, sampling_rate, steps), delta, relation=relation, accountant=accountant
    )


def delta_for(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    epsilon: float,
    *,
    relation: str = "add-remove",
    accountant: str = "pld",
) -> float:
    """δ(ε) of ``steps`` DP-SGD / Algorithm 1 steps.

    >>> round(delta_for(1.0, 1.0, 1, 1.0), 4)
    0.1269
    """
    return compute_delta(
        dpsgd_event(noise_multiplier, sampling_rate, steps), epsilon, relation=relation, accountant=accountant
    )
