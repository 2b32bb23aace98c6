"""VoteAggregator's accounting and budget stop, attacked: ε against independent closed forms, refusals
before release, the ledger holding every query."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import optimize, stats

from featuredp.accounting import BudgetLedger, compute_epsilon, event_from_dict
from featuredp.aggregation import (
    VoteAggregator,
    calibrate_scale,
    calibrate_sigma,
    epsilon_for_queries,
    query_event,
)
from featuredp.errors import BudgetExceededError


def _balle_wang_epsilon(mu: float, delta: float) -> float:
    """ε(δ) of μ-GDP from δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), solved here with scipy.stats (no featuredp)."""

    def d(eps: float) -> float:
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta

    return optimize.brentq(d, 0.0, 200.0, xtol=1e-12)


@pytest.mark.parametrize(("sigma", "queries"), [(40.0, 1), (40.0, 100), (12.5, 37), (150.0, 2000)])
def test_gnmax_epsilon_is_the_gaussian_composition(sigma, queries):
    delta = 1e-5
    agg = VoteAggregator(10, sigma=sigma, delta=delta)
    agg.answer_all(np.zeros((queries, 5), dtype=int))
    eps = agg.epsilon
    # (1) dp-accounting's own event for Q Gaussians with noise multiplier σ/√2 (sensitivity √2)
    reference = compute_epsilon(
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / math.sqrt(2)), queries), delta
    )
    # (2) the closed form: Q-fold composition is μ-GDP with μ = √Q·√2/σ
    closed = _balle_wang_epsilon(math.sqrt(queries) * math.sqrt(2) / sigma, delta)
    assert eps == pytest.approx(reference, rel=1e-3) and eps == pytest.approx(closed, rel=1e-3)
    # a sensitivity-1 accounting (σ instead of σ/√2) would claim less: it is not what we report
    assert eps > 1.2 * _balle_wang_epsilon(math.sqrt(queries) / sigma, delta)
    assert agg.queries_asked == queries and compute_epsilon(agg.event(), delta) == eps


def test_confident_gnmax_charges_every_query_threshold_and_argmax():
    delta, s1, s2, q = 1e-5, 100.0, 30.0, 50
    agg = VoteAggregator(2, sigma=s2, threshold=1e9, sigma_threshold=s1, delta=delta)  # nothing passes
    out = agg.answer_all(np.ones((q, 20), dtype=int))
    assert (out == -1).all() and agg.queries_answered == 0 and agg.queries_asked == q
    # unanswered queries are charged in full: μ² = Q·(1/σ₁² + 2/σ₂²)
    mu = math.sqrt(q * (1 / s1**2 + 2 / s2**2))
    assert agg.epsilon == pytest.approx(_balle_wang_epsilon(mu, delta), rel=1e-3)
    assert agg.answer([1] * 20) is None


def test_lnmax_epsilon_is_pure_two_over_b_per_query():
    b = 4.0
    one = epsilon_for_queries(1, 1e-12, mechanism="lnmax", scale=b)
    assert one == pytest.approx(2 / b, rel=1e-3)  # L1 sensitivity 2: not 1/b
    many = epsilon_for_queries(30, 1e-5, mechanism="lnmax", scale=b)
    assert many <= 30 * 2 / b + 1e-9  # never worse than basic composition
    assert query_event("lnmax", scale=b) == dp_accounting.LaplaceDpEvent(2.0)


@pytest.mark.parametrize(("mechanism", "threshold"), [("gnmax", None), ("gnmax", 150.0), ("lnmax", None)])
def test_calibrate_meets_the_target_and_refuses_the_next_query(mechanism, threshold):
    agg = VoteAggregator.calibrate(3, epsilon=1.0, delta=1e-5, queries=40, mechanism=mechanism, threshold=threshold)
    assert 0.99 <= agg.epsilon_after(40) <= 1.0 < agg.epsilon_after(41)
    assert agg.max_queries == 40
    assert (agg.answer_all(np.zeros((60, 9), dtype=int)) >= -1).all()
    assert agg.queries_asked == 40 and agg.epsilon <= 1.0
    with pytest.raises(BudgetExceededError, match="nothing was released"):
        agg.answer([0] * 9)


def test_calibration_helpers_match_their_closed_forms():
    sigma, s1 = calibrate_sigma(2.0, 1e-6, 300, sigma_threshold_ratio=4.0)
    assert s1 == pytest.approx(4 * sigma)
    mu = math.sqrt(300 * (2 + 1 / 16)) / sigma
    assert _balle_wang_epsilon(mu, 1e-6) == pytest.approx(2.0, rel=2e-3)
    b = calibrate_scale(0.5, 1e-5, 1)
    assert b == pytest.approx(4.0, rel=2e-3)


class _CountingRng:
    """A generator that counts draws (the refused query must draw nothing)."""

    def __init__(self) -> None:
        self.inner = np.random.default_rng(0)
        self.draws = 0

    def standard_normal(self, size):
        self.draws += 1
        return self.inner.standard_normal(size)


def test_the_query_that_would_overspend_is_refused_before_any_noise():
    agg = VoteAggregator(2, sigma=10.0, delta=1e-5, max_epsilon=1.0)
    agg._rng = _CountingRng()
    cap = agg.max_queries
    assert agg.epsilon_after(cap) <= 1.0 < agg.epsilon_after(cap + 1)
    for _ in range(cap):
        agg.answer([1, 1, 0])
    draws = agg._rng.draws
    with pytest.raises(BudgetExceededError, match=r"above max_epsilon=1 .*nothing was released"):
        agg.answer([1, 1, 0])
    assert agg._rng.draws == draws and agg.queries_asked == cap == agg.queries_answered
    assert agg.epsilon <= 1.0
    # answer_all: the budget's queries are answered, the rest marked -1 and not asked; no error by default
    agg2 = VoteAggregator(2, sigma=10.0, delta=1e-5, max_epsilon=1.0)
    out = agg2.answer_all(np.ones((cap + 7, 3), dtype=int))
    assert (out[:cap] >= 0).all() and (out[cap:] == -1).all() and agg2.queries_asked == cap
    assert (agg2.answer_all(np.ones((3, 3), dtype=int)) == -1).all() and agg2.queries_asked == cap
    # stop_at_budget=False: the whole batch is refused up front, nothing drawn
    agg3 = VoteAggregator(2, sigma=10.0, delta=1e-5, max_epsilon=1.0)
    agg3._rng = _CountingRng()
    with pytest.raises(BudgetExceededError):
        agg3.answer_all(np.ones((cap + 1, 3), dtype=int), stop_at_budget=False)
    assert agg3._rng.draws == 0 and agg3.queries_asked == 0


def test_the_ledger_holds_every_query_and_refuses_before_release(tmp_path):
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, total_epsilon=1.0, delta=1e-5)
    agg = VoteAggregator(2, sigma=20.0, delta=1e-5, ledger=ledger)
    agg._rng = _CountingRng()
    cap = 0
    while True:
        before = path.read_bytes()
        draws = agg._rng.draws
        try:
            agg.answer([0, 0, 1])
        except BudgetExceededError:
            break
        cap += 1
    assert path.read_bytes() == before and agg._rng.draws == draws  # refused: ledger untouched, no noise
    spends = BudgetLedger(path).records
    assert len(spends) == cap == agg.queries_asked > 0
    assert all(s["status"] == "settled" for s in spends)
    assert all(event_from_dict(s["event"]) == agg.query_event for s in spends)
    # the ledger composes the queries tightly: its total is the aggregator's ε (same δ)
    assert BudgetLedger(path).spent() == pytest.approx(agg.epsilon, rel=1e-6) and agg.epsilon <= 1.0


def test_answer_all_reserves_one_batch_and_stops_at_the_ledger(tmp_path):
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, total_epsilon=1.0, delta=1e-5)
    ledger.spend("earlier", event=query_event("gnmax", sigma=20.0))
    agg = VoteAggregator(2, sigma=20.0, delta=1e-5, ledger=ledger)
    out = agg.answer_all(np.ones((100, 3), dtype=int))
    k = agg.queries_asked
    assert 0 < k < 100 and (out[k:] == -1).all() and (out[:k] >= 0).all()
    spends = BudgetLedger(path).records
    assert len(spends) == 2 and spends[1]["status"] == "settled"
    assert event_from_dict(spends[1]["event"]) == dp_accounting.SelfComposedDpEvent(agg.query_event, k)
    assert BudgetLedger(path).spent() <= 1.0
    # one more query does not fit: refused by the ledger with nothing released
    with pytest.raises(BudgetExceededError):
        agg.answer([1, 1, 1])
    assert agg.queries_asked == k


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sigma": None}, "needs sigma"),
        ({"sigma": 1.0, "scale": 1.0}, "takes sigma, not scale"),
        ({"mechanism": "lnmax", "sigma": 1.0}, "takes scale"),
        ({"mechanism": "max", "sigma": 1.0}, "mechanism must be one of 'gnmax', 'lnmax'; got 'max'"),
        ({"sigma": 1.0, "threshold": 5.0}, "both threshold and sigma_threshold"),
        ({"sigma": 1.0, "delta": 0.0}, "delta must be in"),
        ({"sigma": 1.0, "max_epsilon": -1.0}, "max_epsilon must be > 0, got -1.0"),
        ({"sigma": -2.0}, "sigma must be > 0, got -2.0"),
    ],
)
def test_bad_settings_are_named_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VoteAggregator(3, **kwargs)


def test_missing_ledger_file_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        VoteAggregator(3, sigma=1.0, ledger=tmp_path / "nope.json")


def test_answer_shapes():
    agg = VoteAggregator(3, sigma=1.0)
    with pytest.raises(ValueError, match="use answer_all"):
        agg.answer([[0, 1]])
    with pytest.raises(ValueError, match="use answer for one query"):
        agg.answer_all([0, 1])
    assert agg.queries_asked == 0 and agg.epsilon == 0.0
    assert isinstance(agg.event(), dp_accounting.NoOpDpEvent)
