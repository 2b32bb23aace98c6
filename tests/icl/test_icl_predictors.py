"""The in-context predictors: the protocol, the offline learners, and what a prompt may read."""

from __future__ import annotations

import numpy as np
import pytest

from featuredp.errors import DataValidationError
from featuredp.icl import BatchPredictor, KNNPredictor, LogisticPredictor, Predictor, predict_many


def _blobs(n=60, k=3, d=5, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 5, (k, d))
    y = np.arange(n) % k
    X = centres[y] + rng.normal(0, 0.5, (n, d))
    return X, y


def test_one_nn_memorises_its_demonstrations():
    # The property the membership attack relies on: a demonstration queried by itself gets its own label,
    # even when that label disagrees with all its neighbours (a "mislabelled" record).
    X, y = _blobs()
    y = y.copy()
    y[7] = (y[7] + 1) % 3
    demos = list(zip(X, y))
    knn = KNNPredictor(3)
    assert knn.predict_batch(demos, X).tolist() == y.tolist()
    assert knn.predict(demos, X[7]) == y[7]
    # a fresh point near record 7 follows its cluster, not the flipped label, under 3-NN
    assert KNNPredictor(3, k=3).predict(demos, X[7] + 0.01) != y[7]


def test_knn_scores_and_batch_match_one_by_one():
    X, y = _blobs(seed=1)
    demos = list(zip(X[:12], y[:12]))
    knn = KNNPredictor(3, k=3)
    S = knn.scores_batch(demos, X[12:])
    assert S.shape == (48, 3) and np.allclose(S.sum(1), 1.0)
    assert [knn.predict(demos, q) for q in X[12:]] == knn.predict_batch(demos, X[12:]).tolist()
    assert np.allclose([knn.scores(demos, q) for q in X[12:]], S)
    assert np.all(S[np.arange(48), knn.predict_batch(demos, X[12:])] == S.max(1))


def test_knn_ties_go_to_the_nearest_tied_class():
    demos = [([0.0], 0), ([1.0], 1), ([10.0], 1), ([-10.0], 0)]
    # k=2 around 0.9: neighbours 1.0 (class 1) and 0.0 (class 0) tie; the nearer, class 1, wins
    assert KNNPredictor(2, k=2).predict(demos, [0.9]) == 1
    assert KNNPredictor(2, k=2).predict(demos, [0.1]) == 0


def test_zero_shot_knows_nothing():
    knn = KNNPredictor(4)
    assert knn.scores([], [1.0, 2.0]).tolist() == [0.25] * 4
    assert knn.predict([], [1.0, 2.0]) == 0
    assert LogisticPredictor(4).scores([], [0.0]).tolist() == [0.25] * 4


def test_logistic_predictor_fits_the_prompt_only():
    X, y = _blobs(n=30, seed=2)
    lr = LogisticPredictor(3)
    demos = list(zip(X[:15], y[:15]))
    assert np.mean(lr.predict_batch(demos, X[15:]) == y[15:]) > 0.9
    # classes absent from the prompt score 0; a one-class prompt answers that class
    two = [(x, c) for x, c in demos if c != 2]
    assert np.all(lr.scores_batch(two, X)[:, 2] == 0)
    assert lr.predict_batch([(X[0], 2), (X[1], 2)], X[:5]).tolist() == [2] * 5


def test_protocols_and_labels_outside_the_declared_classes():
    knn = KNNPredictor(2)
    assert isinstance(knn, Predictor) and isinstance(knn, BatchPredictor)
    with pytest.raises(DataValidationError, match=r"outside the declared classes 0\.\.1"):
        knn.predict([([0.0], 0), ([1.0], 5)], [0.0])
    with pytest.raises(DataValidationError, match="features"):
        knn.predict([([0.0, 1.0], 0)], [0.0])


class _OneByOne:
    """A predictor without batch methods (what a user might write)."""

    n_classes = 3

    def __init__(self, answer=1):
        self.answer = answer

    def predict(self, demonstrations, query):
        return self.answer

    def scores(self, demonstrations, query):
        return np.eye(3)[self.answer]


def test_predict_many_uses_the_plain_protocol_and_checks_answers():
    p = _OneByOne()
    assert isinstance(p, Predictor) and not isinstance(p, BatchPredictor)
    assert predict_many(p, [], [0, 1, 2]).tolist() == [1, 1, 1]
    with pytest.raises(DataValidationError, match="returned label 7"):
        predict_many(_OneByOne(7), [], [0])
