"""The vote histogram and its noisy argmax, attacked: sensitivity, noise scale, secret randomness."""

from __future__ import annotations

import itertools
import json
import math
import warnings

import numpy as np
import pytest
from scipy import stats

from featuredp.aggregation import (
    VoteAggregator,
    gnmax,
    lnmax,
    noisy_histogram,
    noisy_max_passes,
    resolve_rng,
    vote_histogram,
)
from featuredp.errors import DataValidationError, PrivacyRiskWarning
from featuredp.noise import ChaCha20Generator

# ----------------------------------------------------------------------------- the histogram


def test_vote_histogram_counts_votes_and_ignores_abstentions():
    assert vote_histogram([0, 2, 2, -1, 1], 3).tolist() == [1.0, 1.0, 2.0]
    h = vote_histogram(np.array([[0, 0, 1], [-1, -1, -1]]), 2)
    assert h.dtype == np.float64 and h.tolist() == [[2.0, 1.0], [0.0, 0.0]]
    # a declared class nobody votes for still has its (zero) count: the shape never depends on the votes
    assert vote_histogram([0, 0], 5).shape == (5,)


@pytest.mark.parametrize("bad", [[0, 3], [0, -2], [[0, 1], [1, 7]]])
def test_vote_outside_the_declared_classes_is_a_named_error(bad):
    with pytest.raises(DataValidationError, match=r"votes must be class indices in 0\.\.2 or -1"):
        vote_histogram(bad, 3)


def test_votes_must_be_integers_and_classes_declared():
    with pytest.raises(DataValidationError, match="integer class indices"):
        vote_histogram([0.0, 1.5], 2)
    with pytest.raises(DataValidationError, match="shape"):
        vote_histogram(np.zeros((2, 2, 2), dtype=int), 2)
    with pytest.raises(ValueError, match="n_classes must be >= 2, got 1"):
        vote_histogram([0], 1)


def test_one_members_vote_moves_the_histogram_by_at_most_the_stated_sensitivity():
    """Exhaustive over 4 members, 3 classes and abstention: every change of one member's vote."""
    k, members = 3, 4
    worst = np.zeros(4)  # L1, L2, Linf, |Δ max count|
    for votes in itertools.product(range(-1, k), repeat=members):
        h = vote_histogram(list(votes), k)
        for member, new in itertools.product(range(members), range(-1, k)):
            changed = list(votes)
            changed[member] = new
            d = vote_histogram(changed, k) - h
            top = abs(vote_histogram(changed, k).max() - h.max())
            worst = np.maximum(worst, [np.abs(d).sum(), np.sqrt((d**2).sum()), np.abs(d).max(), top])
    # the bounds the accounting uses (L1 = 2 for LNMax, L2 = √2 for GNMax, 1 for the threshold test) — and tight
    np.testing.assert_allclose(worst, [2.0, math.sqrt(2.0), 1.0, 1.0])


# ----------------------------------------------------------------------------- the noise scale


def _std_matches(samples: np.ndarray, claimed: float, rtol: float = 0.03) -> bool:
    """Whether the sample std is within rtol of ``claimed`` (n = 40,000: the std's own error is ~0.35%)."""
    return abs(float(np.std(samples)) / claimed - 1.0) < rtol


@pytest.mark.statistical
@pytest.mark.parametrize("secure", [False, True])
def test_gnmax_noise_has_the_stated_std(secure):
    sigma = 7.0
    rng = ChaCha20Generator(b"k" * 32) if secure else np.random.default_rng(11)
    h = np.array([3.0, 0.0, 5.0, 1.0])
    noise = (noisy_histogram(np.tile(h, (10_000, 1)), sigma=sigma, rng=rng) - h).ravel()
    assert _std_matches(noise, sigma) and not _std_matches(noise, 2 / 3 * sigma)
    assert abs(float(noise.mean())) < 0.05 * sigma
    # the aggregator draws its noise through the same path (its internal noisy counts)
    agg = VoteAggregator(4, sigma=sigma, secure_rng=secure, seed=5)
    noise = (agg._noisy_counts(np.tile(h, (10_000, 1))) - h).ravel()
    assert _std_matches(noise, sigma) and not _std_matches(noise, 2 / 3 * sigma)


@pytest.mark.statistical
@pytest.mark.parametrize("secure", [False, True])
def test_lnmax_noise_is_laplace_with_the_stated_scale(secure):
    b = 3.0
    agg = VoteAggregator(4, mechanism="lnmax", scale=b, secure_rng=secure, seed=6)
    noise = agg._noisy_counts(np.zeros((10_000, 4))).ravel()
    # Laplace(b): std b·√2, mean |x| = b (a Gaussian of that std would have mean |x| = 1.128·b)
    assert _std_matches(noise, b * math.sqrt(2)) and not _std_matches(noise, 2 / 3 * b * math.sqrt(2))
    assert abs(float(np.mean(np.abs(noise))) / b - 1) < 0.03
    assert stats.kstest(noise[:5000], stats.laplace(scale=b).cdf).pvalue > 1e-3


@pytest.mark.statistical
def test_released_answers_flip_as_often_as_the_stated_sigma_predicts():
    """The released argmax itself: for h = (0, g), P(answer 0) = Φ(−g/(σ√2)); 2/3·σ predicts far fewer flips."""
    sigma, gap, n = 10.0, 12.0, 20_000
    votes = np.tile(np.array([1] * int(gap)), (n, 1))  # every member votes class 1: h = (0, 12)
    agg = VoteAggregator(2, sigma=sigma, seed=3)
    flips = float(np.mean(agg.answer_all(votes) == 0))
    p_true = stats.norm.cdf(-gap / (sigma * math.sqrt(2)))
    p_weak = stats.norm.cdf(-gap / (2 / 3 * sigma * math.sqrt(2)))
    se = math.sqrt(p_true * (1 - p_true) / n)
    assert abs(flips - p_true) < 4 * se  # 0.198 ± 0.011
    assert abs(flips - p_weak) > 10 * se  # 0.115 is rejected
    assert agg.queries_asked == n == agg.queries_answered


@pytest.mark.statistical
def test_threshold_test_noise_has_the_stated_std():
    """Confident-GNMax's test: P(max + N(0, σ₁²) >= T) = Φ((max − T)/σ₁), checked at one point."""
    s1, n = 8.0, 20_000
    h = np.tile([2.0, 10.0], (n, 1))  # max 10, T = 14: pass probability Φ(−0.5)
    passed = noisy_max_passes(h, threshold=14.0, sigma_threshold=s1, rng=np.random.default_rng(2))
    p, p_weak = stats.norm.cdf(-4 / s1), stats.norm.cdf(-4 / (2 / 3 * s1))
    se = math.sqrt(p * (1 - p) / n)
    assert abs(passed.mean() - p) < 4 * se and abs(passed.mean() - p_weak) > 10 * se


def test_gnmax_and_lnmax_return_the_argmax_of_an_overwhelming_vote():
    assert gnmax([0.0, 1000.0, 0.0], 1.0, np.random.default_rng(0)) == 1
    assert lnmax([1000.0, 0.0], 1.0, np.random.default_rng(0)) == 0
    with pytest.raises(ValueError, match="sigma must be > 0, got 0"):
        gnmax([0.0, 1.0], 0.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="scale must be > 0, got -1"):
        lnmax([0.0, 1.0], -1, np.random.default_rng(0))


# ----------------------------------------------------------------------------- secret randomness


def test_default_aggregators_draw_different_noise():
    h = np.zeros((1, 50))
    for secure in (False, True):
        a, b = VoteAggregator(50, sigma=1.0, secure_rng=secure), VoteAggregator(50, sigma=1.0, secure_rng=secure)
        assert not np.allclose(a._noisy_counts(h), b._noisy_counts(h))
    # the module functions without rng draw fresh OS entropy too
    assert not np.allclose(noisy_histogram(np.zeros(50), sigma=1.0), noisy_histogram(np.zeros(50), sigma=1.0))


def test_a_seed_warns_reproduces_and_is_never_stored():
    seed = 987_654_321
    with pytest.warns(PrivacyRiskWarning, match="seed=987654321 makes the private randomness"):
        a = VoteAggregator(50, sigma=1.0, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyRiskWarning)
        b = VoteAggregator(50, sigma=1.0, seed=seed)
    h = np.zeros((1, 50))
    assert np.array_equal(a._noisy_counts(h), b._noisy_counts(h))  # research reproducibility
    a.answer([0, 1, 1])
    described = json.dumps(a.describe())
    assert str(seed) not in described and str(seed) not in repr(a) and a.describe()["seeded"] is True
    assert not any(isinstance(v, int) and v == seed for v in vars(a).values())
    with pytest.warns(PrivacyRiskWarning, match="rng=3 makes the private randomness"):
        resolve_rng(3)


def test_resolve_rng_refuses_other_things():
    with pytest.raises(TypeError, match=r"rng must be None, a numpy\.random\.Generator"):
        resolve_rng(np.random.RandomState(0))
