"""Record-level accounting of a run with a backstop (``--record-epsilon E``): every step that reads a record.

FDP covers what Ψ hides; what Ψ misses is public, and the public steps (pre-training, the ``public`` method's
steps, Algorithm 1's public batches) read it with no noise. With a backstop every one of those steps is a
Poisson-subsampled Gaussian at record level too (clipped at C, noise σ_pub·C), and the private steps already are
(removing a whole record moves their clipped sum by at most C, whatever loss is clipped). So the whole run is::

    PoissonSampled(q, Gaussian(σ))^T  ∘  PoissonSampled(q_pre, Gaussian(σ_pub))^T_pre
                                      ∘  PoissonSampled(q_pub, Gaussian(σ_pub))^T_pub

composed with the PLD accountant. :func:`calibrate_record_noise` finds the smallest σ_pub (to 1%) whose
composition meets E. numpy / dp-accounting only (no torch).

>>> sigma = calibrate_record_noise(8.0, 1e-5, private=(1.0, 0.05, 100), pretrain=(0.1, 20), public=(0.2, 100))
>>> 0.99 * 8.0 <= record_epsilon(1e-5, private=(1.0, 0.05, 100), pretrain=(0.1, 20), public=(0.2, 100),
...                              noise_multiplier=sigma) <= 8.0
True
"""

from __future__ import annotations

import math
from typing import Any

from featuredp._validate import check_open_unit, check_positive
from featuredp.accounting.accountant import compute_epsilon
from featuredp.accounting.events import DpEvent, compose_events, dpsgd_event
from featuredp.errors import UnreachableTargetError

__all__ = ["calibrate_record_noise", "record_epsilon", "record_event"]

#: (σ, q, T) of the private steps, as accounted at record level; None or T = 0: none
PrivateTerms = tuple[float, float, int] | None
#: (q, T) of a group of public steps; T = 0: none
PublicTerms = tuple[float, int]

_SIGMA_MAX = 1e4
_MAX_EVALS = 80


def record_event(
    *, private: PrivateTerms, pretrain: PublicTerms, public: PublicTerms, noise_multiplier: float | None
) -> DpEvent | None:
    """The record-level event of a run: the private steps' and the noised public steps' Poisson Gaussians composed.

    ``noise_multiplier`` is σ_pub (None: the public steps are not noised, so when there are any the event is
    None: no record-level guarantee). Groups with no steps add nothing.

    >>> type(record_event(private=(1.0, 0.1, 10), pretrain=(0.1, 0), public=(0.1, 0), noise_multiplier=None))
    <class 'dp_accounting.dp_event.SelfComposedDpEvent'>
    """
    events = []
    if private is not None and private[2] > 0:
        events.append(dpsgd_event(*private))
    for q, t in (pretrain, public):
        if t <= 0:
            continue
        if noise_multiplier is None:
            return None
        events.append(dpsgd_event(noise_multiplier, q, t))
    if not events:
        return None
    return events[0] if len(events) == 1 else compose_events(*events)


def record_epsilon(
    delta: float,
    *,
    private: PrivateTerms,
    pretrain: PublicTerms,
    public: PublicTerms,
    noise_multiplier: float | None,
    relation: str = "add-remove",
    accountant: str = "pld",
) -> float | None:
    """ε(δ) of :func:`record_event` (None where the public view was read without noise; 0 for no step)."""
    if not any(t > 0 for t in (0 if private is None else private[2], pretrain[1], public[1])):
        return 0.0
    event = record_event(private=private, pretrain=pretrain, public=public, noise_multiplier=noise_multiplier)
    if event is None:
        return None
    return float(compute_epsilon(event, delta, relation=relation, accountant=accountant))


def calibrate_record_noise(
    target: float,
    delta: float,
    *,
    private: PrivateTerms,
    pretrain: PublicTerms,
    public: PublicTerms,
    relation: str = "add-remove",
    accountant: str = "pld",
    tolerance: float = 0.01,
) -> float | None:
    """σ_pub such that the record-level ε of the run is at most ``target`` and at least (1 − tolerance)·target.

    Bisection in log σ over the same accountant :func:`record_epsilon` uses, keeping the feasible end: the
    answer never overshoots. None when there is no public step to noise. Raises
    :class:`~featuredp.errors.UnreachableTargetError` (naming ``--record-epsilon``) when the private steps alone
    already spend more than ``target``, or so nearly all of it that σ_pub would exceed 10⁴.
    """
    target = check_positive("record_epsilon", target)
    delta = check_open_unit("delta", delta)
    if pretrain[1] <= 0 and public[1] <= 0:
        return None
    acct: dict[str, Any] = {"relation": relation, "accountant": accountant}
    if private is not None and private[2] > 0:
        alone = compute_epsilon(dpsgd_event(*private), delta, **acct)
        if alone >= target:
            raise UnreachableTargetError(
                f"--record-epsilon {target:g} cannot be met: the private steps alone are ({alone:.4g}, {delta:g})-DP "
                "at record level; give a larger --record-epsilon (or more noise to the private steps)"
            )

    def eps(sigma: float) -> float:
        value = record_epsilon(delta, private=private, pretrain=pretrain, public=public, noise_multiplier=sigma,
                               **acct)  # fmt: skip
        assert value is not None
        return value

    hi = 1.0  # feasible end (ε <= target)
    at_hi = eps(hi)
    while at_hi > target:
        hi *= 2.0
        at_hi = eps(hi)
        if hi > _SIGMA_MAX:
            raise UnreachableTargetError(
                f"--record-epsilon {target:g} cannot be met: the private steps spend nearly all of it (the public "
                f"steps would need noise multiplier > {_SIGMA_MAX:g}); give a larger --record-epsilon"
            )
    lo = hi / 2.0  # infeasible end, or a small σ
    while lo > 1e-3:
        at_lo = eps(lo)
        if at_lo > target:
            break
        hi, at_hi, lo = lo, at_lo, lo / 2.0
    for _ in range(_MAX_EVALS):
        if at_hi >= (1.0 - tolerance) * target or hi / lo < 1 + 1e-9:
            break
        mid = math.sqrt(lo * hi)
        at_mid = eps(mid)
        if at_mid <= target:
            hi, at_hi = mid, at_mid
        else:
            lo = mid
    return hi
