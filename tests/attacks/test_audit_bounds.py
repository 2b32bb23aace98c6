"""Canary-audit bounds: hand-computed values, ceilings, validity (type-I error) and power."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from featuredp.accounting import epsilon_for
from featuredp.attacks import (
    clopper_pearson,
    multi_run_ceiling,
    multi_run_epsilon_lower_bound,
    one_run_audit,
    one_run_ceiling,
    one_run_epsilon_lower_bound,
    one_run_p_value,
    simulate_dpsgd_gradient_canaries,
)


def test_clopper_pearson_hand_values():
    # zero successes: upper = 1 − (α/2)^(1/n); all successes: lower = (α/2)^(1/n)
    assert clopper_pearson(0, 10)[1] == pytest.approx(1 - 0.025 ** 0.1, rel=1e-9)
    assert clopper_pearson(10, 10)[0] == pytest.approx(0.025 ** 0.1, rel=1e-9)
    lo, hi = clopper_pearson(3, 10)
    # textbook values for 3/10 at 95%: (0.0667, 0.6525)
    assert lo == pytest.approx(0.06674, abs=1e-4)
    assert hi == pytest.approx(0.65245, abs=1e-4)


def test_clopper_pearson_rejects_bad_input():
    with pytest.raises(ValueError, match="successes"):
        clopper_pearson(11, 10)
    with pytest.raises(ValueError, match="confidence"):
        clopper_pearson(1, 10, confidence=1.5)


def test_multi_run_hand_value():
    # a perfect split of 1000 in / 1000 out: FPR_ub = FNR_ub = 1 − 0.025^(1/1000)
    ub = 1 - 0.025 ** (1 / 1000)
    assert multi_run_ceiling(1000, 1000, 0.0) == pytest.approx(math.log((1 - ub) / ub), rel=1e-9)
    assert multi_run_ceiling(1000, 1000, 0.0) == pytest.approx(5.60, abs=0.01)
    # fixed threshold, δ > 0, both tails: 20 false negatives, 0 false positives out of 100 each
    s_in = np.r_[np.ones(80), -np.ones(20)]
    s_out = -np.ones(100)
    res = multi_run_epsilon_lower_bound(s_in, s_out, 1e-3, selection="0.0")
    fnr_ub = stats.beta.ppf(0.975, 21, 80)
    fpr_ub = 1 - 0.025 ** (1 / 100)
    assert res.epsilon_lower_bound == pytest.approx(math.log((1 - 1e-3 - fnr_ub) / fpr_ub), rel=1e-9)


def test_one_run_hand_values():
    # δ = 0, all 10 guesses right: q^10 = 0.05 -> ε = log(q/(1 − q))
    q = 0.05 ** 0.1
    assert one_run_epsilon_lower_bound(10, 10, 10, 0.0, 0.05) == pytest.approx(math.log(q / (1 - q)), rel=1e-6)
    # δ term by hand: m = r = v = 2, ε = 0: f(2) = 1/4; max_i P[2−i <= W < 2]/i = max(1/2, 3/8) = 1/2
    assert one_run_p_value(2, 2, 2, 0.0, 0.01) == pytest.approx(0.25 + 2 * 2 * 0.01 * 0.5)
    # δ only makes the bound smaller
    assert one_run_epsilon_lower_bound(1000, 100, 95, 1e-5) < one_run_epsilon_lower_bound(1000, 100, 95, 0.0)


def test_ceilings_match_field_notes():
    # NOTES.md: 1,000 trials cannot certify more than ≈ 5.6–5.8; ≈ 10^4 needed near ε = 8
    assert 5.6 <= one_run_ceiling(1000) <= 5.85
    assert one_run_ceiling(10_000) == pytest.approx(8.1, abs=0.1)


@pytest.mark.statistical
def test_one_run_bound_is_valid_for_randomized_response():
    # An exactly ε-DP mechanism (randomized response on each bit): the bound may exceed ε
    # with probability at most β. Would fail if the binomial tail or the search were off.
    eps, beta, reps, m = 1.0, 0.05, 300, 500
    rng = np.random.default_rng(7)
    q = math.exp(eps) / (1 + math.exp(eps))
    exceed = 0
    lbs = []
    for _ in range(reps):
        bits = rng.random(m) < 0.5
        v = int(np.sum(rng.random(m) < q))
        lb = one_run_epsilon_lower_bound(m, m, v, 0.0, beta)
        lbs.append(lb)
        exceed += lb > eps
        _ = bits
    assert exceed / reps <= beta + 3 * math.sqrt(beta * (1 - beta) / reps)
    # ... and it has power: the median bound is a good fraction of ε
    assert np.median(lbs) > 0.6 * eps


@pytest.mark.statistical
def test_gaussian_mechanism_multi_run_passes_and_is_close():
    # μ-GDP Gaussian scores: the audit must stay below the true ε and get reasonably close.
    mu, delta, n = 2.0, 1e-5, 20_000
    rng = np.random.default_rng(1)
    s_in, s_out = rng.normal(mu, 1, n), rng.normal(0, 1, n)
    eps_true = epsilon_for(1 / mu, 1.0, 1, delta)
    res = multi_run_epsilon_lower_bound(s_in, s_out, delta, selection="split")
    assert res.epsilon_lower_bound <= eps_true
    assert res.epsilon_lower_bound > 0.3 * eps_true
    assert res.ceiling > res.epsilon_lower_bound


@pytest.mark.statistical
def test_nonprivate_mechanism_is_caught():
    rng = np.random.default_rng(2)
    s_in, s_out = rng.normal(8, 1, 1000), rng.normal(0, 1, 1000)
    res = multi_run_epsilon_lower_bound(s_in, s_out, 1e-5)
    assert res.epsilon_lower_bound > 3.0
    scores = np.r_[s_in, s_out]
    bits = np.r_[np.ones(1000, bool), np.zeros(1000, bool)]
    assert one_run_audit(scores, bits, 1e-5).epsilon_lower_bound > 4.0


@pytest.mark.statistical
def test_dpsgd_gradient_canaries_pass_true_claim_and_catch_false_claim():
    rng = np.random.default_rng(3)
    sigma, p, steps, delta = 0.6, 1.0, 1, 1e-5
    scores, bits = simulate_dpsgd_gradient_canaries(2000, sigma, p, steps, rng)
    lb = one_run_audit(scores, bits, delta).epsilon_lower_bound
    eps_claim = epsilon_for(sigma, p, steps, delta)
    assert 0.5 < lb <= eps_claim
    # the same noise but claiming 3× more noise than used: the audit must refute the claim
    eps_false = epsilon_for(3 * sigma, p, steps, delta)
    assert lb > eps_false


def test_one_run_audit_input_checks():
    with pytest.raises(ValueError, match="included"):
        one_run_audit(np.zeros(5), np.zeros(4))
    with pytest.raises(ValueError, match="guess"):
        one_run_audit(np.arange(10.0), np.arange(10) % 2 == 0, guesses=(20,))
