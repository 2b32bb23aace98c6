"""Tests of featuredp.mechanisms.labeldp: RR keep probability, RR-with-prior's exact law and ε bound, LP-2ST."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer
from sklearn.utils.estimator_checks import parametrize_with_checks

from featuredp.errors import DataValidationError
from featuredp.mechanisms.labeldp import (
    LabelDPClassifier,
    optimal_top_k,
    randomized_response,
    rr_keep_probability,
    rr_with_prior,
    rr_with_prior_distribution,
)

# These tests exercise the estimators with classes=None on purpose; the warning itself is pinned in
# tests/erm/test_classes_ledger.py.
pytestmark = pytest.mark.filterwarnings("ignore:classes=None. the class set:featuredp.errors.PrivacyLeakWarning")



def test_rr_keep_probability_formula():
    assert rr_keep_probability(1.0, 2) == pytest.approx(math.e / (math.e + 1))
    assert rr_keep_probability(2.0, 10) == pytest.approx(math.exp(2) / (math.exp(2) + 9))
    with pytest.raises(ValueError, match="epsilon"):
        rr_keep_probability(0.0, 3)
    with pytest.raises(ValueError, match="n_classes"):
        rr_keep_probability(1.0, 1)


@pytest.mark.statistical
@pytest.mark.parametrize(("eps", "k"), [(0.5, 2), (1.0, 10), (3.0, 5)])
def test_rr_keeps_with_e_eps_over_e_eps_plus_k_minus_1_and_flips_uniformly(eps, k):
    n = 200_000
    y = np.random.default_rng(0).integers(0, k, n)
    z = randomized_response(y, eps, k, random_state=1)
    kept = int((z == y).sum())
    p = rr_keep_probability(eps, k)
    assert stats.binomtest(kept, n, p).pvalue > 1e-3
    # Power: the binary formula e^ε/(e^ε + 1) (a classic bug for k > 2) and a 1% error are rejected.
    wrong = math.exp(eps) / (math.exp(eps) + 1) if k > 2 else p * 1.02
    assert stats.binomtest(kept, n, wrong).pvalue < 1e-6
    # Among flipped labels, the offset (z − y) mod k is uniform on 1..k−1.
    offsets = ((z - y) % k)[z != y]
    if k > 2:
        counts = np.bincount(offsets, minlength=k)[1:]
        assert stats.chisquare(counts).pvalue > 1e-3


def test_optimal_top_k_maximises_keep_mass():
    prior = np.array([[0.7, 0.2, 0.05, 0.05], [0.3, 0.3, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25]])
    _, k = optimal_top_k(prior, 1.0)
    e = math.e
    for row, kk in zip(prior, k):
        s = np.sort(row)[::-1].cumsum()
        scores = [e / (e + j) * s[j] for j in range(4)]
        assert kk == int(np.argmax(scores)) + 1
    assert k[2] == 4  # a uniform prior gives plain RR


def test_rr_with_prior_distribution_is_eps_label_dp_for_any_prior():
    rng = np.random.default_rng(0)
    for eps in (0.3, 1.0, 4.0):
        for _ in range(50):
            K = int(rng.integers(2, 8))
            prior = rng.dirichlet(np.full(K, 0.3))
            dists = np.array([rr_with_prior_distribution(prior, y, eps) for y in range(K)])
            np.testing.assert_allclose(dists.sum(axis=1), 1.0)
            # For every output, the probabilities under any two labels differ by at most e^ε.
            hi, lo = dists.max(axis=0), dists.min(axis=0)
            support = hi > 0
            assert np.all(lo[support] > 0)
            assert np.all(hi[support] / lo[support] <= math.exp(eps) * (1 + 1e-12))


@pytest.mark.statistical
def test_rr_with_prior_samples_follow_the_exact_distribution():
    prior_row = np.array([0.45, 0.35, 0.1, 0.1])
    n = 100_000
    prior = np.tile(prior_row, (n, 1))
    for y_true in range(4):
        z = rr_with_prior(np.full(n, y_true), prior, 1.5, random_state=y_true)
        expected = rr_with_prior_distribution(prior_row, y_true, 1.5) * n
        observed = np.bincount(z, minlength=4)
        mask = expected > 0
        assert observed[~mask].sum() == 0
        assert stats.chisquare(observed[mask], expected[mask]).pvalue > 1e-3


def test_rr_with_prior_input_checks():
    with pytest.raises(DataValidationError, match="prior"):
        rr_with_prior(np.array([0, 1]), np.ones((2, 1)), 1.0)
    with pytest.raises(DataValidationError, match="rows"):
        rr_with_prior(np.array([0, 1, 1]), np.ones((2, 2)) / 2, 1.0)
    with pytest.raises(DataValidationError, match="class indices"):
        randomized_response(np.array([0, 5]), 1.0, n_classes=3)


def _digits():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    return X[:1200], y[:1200], X[1200:], y[1200:]


def test_lp_2st_second_stage_prior_ignores_second_stage_labels():
    # Changing labels of stage-2 rows must not change stage-1 outputs or the prior (fixed seed).
    X, y, _, _ = _digits()
    clf = LabelDPClassifier(LogisticRegression(max_iter=300), epsilon=2.0, method="lp-2st", random_state=0)
    clf.classes_ = np.arange(10)
    from featuredp.sampling import make_streams

    a = clf._lp_2st(X, y, 10, 2.0, 0.5, make_streams(7))
    perm = make_streams(7).draws.permutation(len(y))
    first, second = perm[:600], perm[600:]
    y2 = y.copy()
    y2[second] = (y2[second] + 3) % 10
    b = clf._lp_2st(X, y2, 10, 2.0, 0.5, make_streams(7))
    np.testing.assert_array_equal(a[first], b[first])
    assert (a[second] != b[second]).mean() > 0.3


def test_label_dp_classifier_methods_learn_and_report_epsilon():
    X, y, Xt, yt = _digits()
    for method in ("rr", "lp-2st"):
        clf = make_pipeline(Normalizer(), LabelDPClassifier(LogisticRegression(max_iter=500), epsilon=3.0,
                                                             method=method, random_state=0))
        clf.fit(X, y)
        assert clf[-1].epsilon_ == 3.0 and clf[-1].delta_ == 0.0
        assert clf.score(Xt, yt) > 0.6  # chance 0.1
    prior_model = LogisticRegression(max_iter=500).fit(Xt, yt)  # "public" model: other rows
    clf = LabelDPClassifier(epsilon=1.0, method="rr-prior", prior_model=prior_model, random_state=0).fit(X, y)
    assert clf.predict_proba(Xt).shape == (len(Xt), 10)


def test_label_dp_classifier_errors():
    X, y, _, _ = _digits()
    with pytest.raises(ValueError, match="epsilon"):
        LabelDPClassifier(epsilon=0).fit(X, y)
    with pytest.raises(ValueError, match="method"):
        LabelDPClassifier(method="pate").fit(X, y)
    with pytest.raises(ValueError, match="prior_model"):
        LabelDPClassifier(method="rr-prior").fit(X, y)
    with pytest.raises(DataValidationError, match="2 classes"):
        LabelDPClassifier().fit(X, np.zeros(len(X), dtype=int))


@parametrize_with_checks([LabelDPClassifier(epsilon=10.0, random_state=0)])
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)


def test_all_noisy_labels_one_class_gives_a_constant_predictor():
    # A very skewed class prior at small ε: RR-with-prior releases the top class for every row.
    class Prior:
        classes_ = np.arange(2)

        def predict_proba(self, X):
            return np.tile([0.9, 0.1], (len(X), 1))

    X, y, Xt, _ = _digits()
    yb = (y == 3).astype(int)
    with pytest.warns(UserWarning, match="constant predictor"):
        clf = LabelDPClassifier(epsilon=0.5, method="rr-prior", prior_model=Prior(), random_state=0).fit(X, yb)
    assert np.all(clf.predict(Xt) == 0)
    assert clf.predict_proba(Xt).shape == (len(Xt), 2)
