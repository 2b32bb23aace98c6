"""Attribute inference on arrays: metrics, imputation baseline, Ball and Theorem 4's bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from featuredp.attacks import (
    ImputationBaseline,
    balanced_accuracy,
    estimate_ball,
    loss_attack,
    map_attack,
    matthews_corrcoef,
    score_attack,
    theorem4_bound,
)


def test_classification_metrics_against_sklearn():
    from sklearn import metrics

    rng = np.random.default_rng(0)
    t = rng.integers(0, 3, 500)
    p = np.where(rng.random(500) < 0.6, t, rng.integers(0, 3, 500))
    assert balanced_accuracy(t, p) == pytest.approx(metrics.balanced_accuracy_score(t, p))
    assert matthews_corrcoef(t, p) == pytest.approx(metrics.matthews_corrcoef(t, p))


def test_attacks_pick_expected_candidates():
    losses = np.array([[0.3, 0.1], [2.0, 5.0]])
    assert loss_attack(losses).tolist() == [1, 0]
    # a strong prior overrides a small loss difference
    assert map_attack(losses, np.array([[0.99, 0.01], [0.5, 0.5]])).tolist() == [0, 0]


def test_theorem4_bound_forms():
    assert theorem4_bound(0.1, epsilon=1.0, delta=1e-5) == pytest.approx(math.e * 0.1 + 1e-5)
    assert theorem4_bound(0.5, epsilon=0.0) == pytest.approx(0.5)
    # the second branch of f_{ε,δ}: 1 − e^{−ε}(1 − δ − Ball) < 1 for a majority attribute
    assert theorem4_bound(0.9, epsilon=1.0, delta=1e-5) == pytest.approx(1 - math.exp(-1) * (0.1 - 1e-5))
    assert theorem4_bound(0.9, epsilon=20.0) == pytest.approx(1.0, abs=1e-8)
    assert theorem4_bound(0.3, epsilon=math.inf) == 1.0
    # μ-GDP trade-off f(α) = Φ(Φ⁻¹(1 − α) − μ): 1 − f(0.5) = Φ(μ)
    mu = 1.0
    f = lambda a: special.ndtr(special.ndtri(1 - a) - mu)  # noqa: E731
    assert theorem4_bound(0.5, tradeoff=f) == pytest.approx(special.ndtr(mu))
    with pytest.raises(ValueError, match="ball"):
        theorem4_bound(1.5, epsilon=1.0)
    with pytest.raises(ValueError, match="epsilon or tradeoff"):
        theorem4_bound(0.5)


def _population(n, rng):
    # attribute a ∈ {0,1,2} depends on public u; label y independent of a given u
    u = rng.normal(size=(n, 3))
    logits = np.c_[u[:, 0], -u[:, 0], 0.5 * u[:, 1]]
    p = np.exp(logits)
    p /= p.sum(1, keepdims=True)
    a = (rng.random(n)[:, None] > np.cumsum(p, 1)).sum(1)
    return u, a, p


@pytest.mark.statistical
def test_imputation_and_ball_estimate():
    rng = np.random.default_rng(1)
    u, a, p_true = _population(6000, rng)
    base = ImputationBaseline().fit(u[:3000], a[:3000], 3)
    probs = base.predict_proba(u[3000:])
    ball = estimate_ball(probs, a[3000:])
    true_ball = p_true[3000:].max(1).mean()
    assert ball.lower - 0.02 <= true_ball <= ball.upper + 0.02
    assert ball.imputation_accuracy == pytest.approx(true_ball, abs=0.03)


@pytest.mark.statistical
def test_model_free_attack_stays_within_epsilon_zero_bound_and_leaky_attack_exceeds_it():
    rng = np.random.default_rng(2)
    u, a, _ = _population(6000, rng)
    base = ImputationBaseline().fit(u[:3000], a[:3000], 3)
    probs = base.predict_proba(u[3000:])
    t = a[3000:]
    ball = estimate_ball(probs, t)
    # a "model" that reads only public data (ε = 0): its loss carries no information on a
    public_losses = rng.normal(size=(3000, 3)) * 0.01
    s = score_attack("map", "members", t, map_attack(public_losses, probs), np.argmax(probs, 1))
    assert s.accuracy_ci[0] <= theorem4_bound(ball.upper, epsilon=0.0)
    assert abs(s.advantage) < 0.02
    # a model that memorised the attribute (loss low at the true value): far above the ε=0 bound
    leaky = np.ones((3000, 3))
    leaky[np.arange(3000), t] = 0.0
    s2 = score_attack("loss", "members", t, loss_attack(leaky), np.argmax(probs, 1))
    assert s2.accuracy == 1.0 and s2.advantage_ci[0] > 0.2
    assert s2.accuracy_ci[0] > theorem4_bound(ball.upper, epsilon=0.0)
