"""Model extraction of a logistic regression from d + 1 queries (the equation-solving attack of Tramèr et al. 2016).

For binary logistic regression f(x) = 1/(1 + e^{−(w·x + b)}), the log-odds
log(f/(1 − f)) = w·x + b is linear in x: d + 1 queries at points in general position give
d + 1 linear equations in the d + 1 unknowns. For K-class softmax regression the log-ratios
log(p_k/p_0) = (w_k − w_0)·x + (b_k − b_0) give the parameters up to the usual shift
(class 0's row set to zero); the extracted model makes the same predictions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from featuredp._validate import check_int


def extract_logistic_regression(
    query: Callable[[np.ndarray], np.ndarray],
    d: int,
    rng: np.random.Generator,
    *,
    n_queries: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Recover (W, b) of a logistic/softmax regression from its probability outputs.

    ``query(X)`` returns probabilities: shape (n,) for binary models (P[y = 1]) or (n, K).
    Uses ``n_queries`` random Gaussian points (default d + 1, the minimum; more gives a
    least-squares fit robust to rounding). Returns ``W`` of shape (d,) and ``b`` scalar
    for binary models, (K, d) and (K,) with row 0 zero for softmax models.
    """
    d = check_int("d", d, minimum=1)
    n = d + 1 if n_queries is None else check_int("n_queries", n_queries, minimum=d + 1)
    X = rng.normal(size=(n, d))
    P = np.asarray(query(X), dtype=float)
    if P.shape[0] != n:
        raise ValueError(f"query must return one row per query point ({n}), got shape {P.shape}")
    P = np.clip(P, 1e-300, None)
    A = np.hstack([X, np.ones((n, 1))])
    if P.ndim == 1:
        logit = np.log(P) - np.log(np.clip(1.0 - P, 1e-300, None))
        sol, *_ = np.linalg.lstsq(A, logit, rcond=None)
        return sol[:d], np.asarray(sol[d])
    logratio = np.log(P) - np.log(P[:, :1])
    sol, *_ = np.linalg.lstsq(A, logratio, rcond=None)  # (d + 1, K)
    return sol[:d].T, sol[d]
