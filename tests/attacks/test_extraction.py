"""Model extraction of logistic regression from d + 1 queries."""

from __future__ import annotations

import numpy as np
import pytest

from featuredp.attacks import extract_logistic_regression


def test_binary_extraction_exact_with_d_plus_one_queries():
    rng = np.random.default_rng(0)
    d = 12
    w, b = rng.normal(size=d), 0.7
    calls = []

    def query(X):
        calls.append(len(X))
        return 1 / (1 + np.exp(-(X @ w + b)))

    w_hat, b_hat = extract_logistic_regression(query, d, rng)
    assert sum(calls) == d + 1
    np.testing.assert_allclose(w_hat, w, atol=1e-8)
    assert float(b_hat) == pytest.approx(b, abs=1e-8)


def test_softmax_extraction_gives_same_predictions():
    rng = np.random.default_rng(1)
    d, k = 6, 4
    W, b = rng.normal(size=(k, d)), rng.normal(size=k)

    def query(X):
        z = X @ W.T + b
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    W_hat, b_hat = extract_logistic_regression(query, d, rng)
    np.testing.assert_allclose(W_hat, W - W[0], atol=1e-8)
    X = rng.normal(size=(200, d))
    z_hat = X @ W_hat.T + b_hat
    np.testing.assert_array_equal(np.argmax(z_hat, 1), np.argmax(query(X), 1))


def test_extraction_checks_query_output():
    with pytest.raises(ValueError, match="one row per query"):
        extract_logistic_regression(lambda X: np.zeros(2), 3, np.random.default_rng(0))
