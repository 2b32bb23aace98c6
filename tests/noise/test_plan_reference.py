"""Each noise plan's ε against an INDEPENDENT reference written here by hand with dp-accounting.

The contract suite (test_plan_contract.py) compares a plan with its own terms, so a plan whose terms are wrong in
the privacy-losing direction (DP-SGD accounted at rate q/2, a sensitivity one participation short) passes it. Here
the mechanism's event is re-derived from the paper's definitions, from public numbers only (n, m, σ, T and the
strategy the plan chose), without calling featuredp's accounting:

* independent noise (DP-SGD): ``PoissonSampledDpEvent(m/n, GaussianDpEvent(σ))`` self-composed T times;
* BandMF (Choquette-Choo et al. 2023, Thm 4, amplified): the explicit T×T banded Toeplitz C of the plan's
  coefficients; with b-min-separated participation its columns b apart have disjoint supports, so one record's
  release is that of DP-SGD with multiplier σ / (largest column norm of C), the per-partition rate m·b/n (records
  split into b secret partitions, one sampled per step) and ⌈T/b⌉ rounds;
* BLT (McKenna 2024, single release, no amplification): the explicit T×T lower-triangular Toeplitz C with
  c_0 = 1, c_j = Σ_i ω_i θ_i^(j−1); Δ² = the largest Σ_{s,t∈P} (CᵀC)_{st} over EVERY participation pattern P whose
  steps are at least b = ⌊n/m⌋ apart (brute force; C ≥ 0 makes equal unit gradients the worst case), one
  ``GaussianDpEvent(σ/Δ)``.

ε comes from dp-accounting's own PLD accountant (add/remove neighbours). The tests after the comparison patch each
plan's terms the wrong way and show that the comparison then fails: the reference can fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import dp_accounting
import numpy as np
import pytest

import featuredp.noise.bandmf_plan as bandmf_plan
import featuredp.noise.blt_plan as blt_plan
from featuredp.noise import NOISE_PLANS, Independent, noise_plan
from featuredp.plan import PrivacyPlan

DELTA = 1e-5
#: relative agreement demanded: the two PLD discretisations differ by under 0.1 % here; a q/2 or a one-epoch
#: sensitivity error moves ε by far more (the tests below measure it)
RTOL = 0.005
#: (n, m, σ, T): a few regimes (small and large ε, several participations per record)
CASES = [(1000, 50.0, 1.0, 60), (2000, 100.0, 0.8, 45), (1000, 100.0, 2.0, 40)]


def _reference_epsilon(event: dp_accounting.DpEvent) -> float:
    acc = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                                          value_discretization_interval=1e-3)  # fmt: skip
    acc.compose(event)
    return float(acc.get_epsilon(DELTA))


def _plan(kind: str, n: int, m: float, sigma: float, steps: int) -> PrivacyPlan:
    noise = noise_plan(kind).planned(n, m, steps, target_epsilon=None, delta=DELTA, momentum=0.0,
                                     relation="add-remove", accountant="pld")  # fmt: skip
    return PrivacyPlan("dpsgd", n, m, m / n, steps, noise_multiplier=sigma, max_grad_norm=1.0, delta=DELTA,
                       noise=noise)  # fmt: skip


def _toeplitz(first_column: np.ndarray, size: int) -> np.ndarray:
    """The size×size lower-triangular Toeplitz matrix with this first column (cut or zero-padded)."""
    c = np.zeros(size)
    c[: min(size, first_column.size)] = first_column[:size]
    rows, cols = np.indices((size, size))
    return np.where(rows >= cols, c[np.clip(rows - cols, 0, size - 1)], 0.0)


def _dpsgd_reference(n: int, m: float, sigma: float, steps: int) -> dp_accounting.DpEvent:
    step = dp_accounting.PoissonSampledDpEvent(m / n, dp_accounting.GaussianDpEvent(sigma))
    return dp_accounting.SelfComposedDpEvent(step, steps)


def _bandmf_reference(plan: PrivacyPlan, steps: int) -> dp_accounting.DpEvent:
    bands, coeffs = plan.noise.bands, np.asarray(plan.noise.coeffs, dtype=np.float64)
    assert bands is not None and coeffs.size <= bands
    c = _toeplitz(coeffs, steps)
    # the amplification argument: columns b apart (one record's participations) touch disjoint rows
    for t in range(steps - bands):
        assert not np.any(c[:, t] * c[:, t + bands])
    sens = float(np.linalg.norm(c, axis=0).max())
    rate = min(1.0, plan.expected_batch_size * bands / plan.dataset_size)
    rounds = -(-steps // bands)
    step = dp_accounting.GaussianDpEvent(plan.noise_multiplier / sens)
    if rate < 1.0:
        step = dp_accounting.PoissonSampledDpEvent(rate, step)
    return dp_accounting.SelfComposedDpEvent(step, rounds)


def _patterns(steps: int, gap: int, start: int = 0) -> Iterator[tuple[int, ...]]:
    """Every non-empty set of steps in [start, steps) whose members are at least ``gap`` apart."""
    for t in range(start, steps):
        yield (t,)
        for rest in _patterns(steps, gap, t + gap):
            yield (t, *rest)


def _blt_reference(plan: PrivacyPlan, steps: int) -> dp_accounting.DpEvent:
    params = np.asarray(plan.noise.coeffs, dtype=np.float64)
    theta, omega = params[: params.size // 2], params[params.size // 2 :]
    first = np.array([1.0] + [float(np.sum(omega * theta ** (j - 1))) for j in range(1, steps)])
    c = _toeplitz(first, steps)
    assert np.all(c >= 0)  # so the worst gradients are one unit vector in every participation
    gram = c.T @ c
    gap = max(1, int(plan.dataset_size // plan.expected_batch_size))
    worst = max(float(gram[np.ix_(p, p)].sum()) for p in _patterns(steps, gap))
    return dp_accounting.GaussianDpEvent(plan.noise_multiplier / math.sqrt(worst))


def _independent_reference(plan: PrivacyPlan, steps: int) -> dp_accounting.DpEvent:
    return _dpsgd_reference(plan.dataset_size, plan.expected_batch_size, plan.noise_multiplier, steps)


REFERENCES: dict[str, Callable[[PrivacyPlan, int], dp_accounting.DpEvent]] = {
    Independent.kind: _independent_reference,
    "bandmf": _bandmf_reference,
    "blt": _blt_reference,
}


def _agrees(plan: PrivacyPlan, kind: str, steps: int) -> tuple[bool, float, float]:
    mine, ref = plan.epsilon(steps), _reference_epsilon(REFERENCES[kind](plan, steps))
    return abs(mine - ref) <= RTOL * ref, mine, ref


def test_every_registered_kind_has_an_independent_reference():
    # a new noise kind is not done until its event is re-derived here
    assert set(REFERENCES) == set(NOISE_PLANS)


@pytest.mark.parametrize("kind", list(REFERENCES))
@pytest.mark.parametrize(("n", "m", "sigma", "steps"), CASES)
def test_the_plan_epsilon_matches_an_independent_reference(kind, n, m, sigma, steps):
    plan = _plan(kind, n, m, sigma, steps)
    for t in (steps, steps // 2 + 1):  # the run, and a budget stop part-way
        ok, mine, ref = _agrees(plan, kind, t)
        assert ok, f"{kind} n={n} m={m} σ={sigma} T={t}: plan ε={mine:.5g}, independent reference ε={ref:.5g}"


# -- the reference can fail: each plan's terms patched the privacy-losing way ---------------------------------------


def test_the_reference_catches_dpsgd_accounted_at_half_the_rate(monkeypatch):
    real = Independent._terms
    monkeypatch.setattr(Independent, "_terms", staticmethod(
        lambda sigma, plan, steps: (real(sigma, plan, steps)[0], real(sigma, plan, steps)[1] / 2, steps)))
    assert not any(_agrees(_plan("independent", *case), "independent", case[-1])[0] for case in CASES)


def test_the_reference_catches_bandmf_accounted_at_half_the_rate(monkeypatch):
    real = bandmf_plan.bandmf_terms
    monkeypatch.setattr(bandmf_plan, "bandmf_terms", lambda *a: (real(*a)[0], real(*a)[1] / 2, real(*a)[2]))
    assert not any(_agrees(_plan("bandmf", *case), "bandmf", case[-1])[0] for case in CASES)


def test_the_reference_catches_blt_with_a_participation_left_out(monkeypatch):
    # Δ over ⌈T/b⌉ − 1 participations: the sensitivity of a run one epoch shorter
    real = blt_plan.blt_sensitivity

    def short(params, m, n, steps):
        gap = max(1, int(n // m))
        return real(params, m, n, max(1, steps - gap))

    def terms(sigma, params, m, n, steps):
        return sigma / short(params, m, n, steps), 1.0, 1

    monkeypatch.setattr(blt_plan, "blt_terms", terms)
    assert not any(_agrees(_plan("blt", *case), "blt", case[-1])[0] for case in CASES)
