"""In-context predictors: what one prompt answers, given its demonstrations and a query.

A *predictor* is the public, fixed learner of in-context learning (an LLM, or an offline
stand-in): it reads a prompt's demonstrations ``[(x, label), ...]`` and a query ``x`` and returns
a label, with no weight update. Labels are class indices ``0 .. n_classes-1`` of a declared,
public class list. Predictors are deterministic: the only randomness of DP-ICL (which
demonstrations go into which prompt, the vote noise) lives in :mod:`featuredp.icl.mechanism`.

* :class:`Predictor` — the protocol: ``n_classes``, ``predict(demos, query)``, ``scores(demos, query)``.
* :class:`BatchPredictor` — optional batch forms ``predict_batch`` / ``scores_batch`` (one prompt,
  many queries), which :func:`predict_many` uses when present.
* :class:`KNNPredictor` — k nearest demonstrations (Euclidean); ``k=1`` memorises its demonstrations.
* :class:`LogisticPredictor` — a logistic regression fitted on the prompt's demonstrations.

The transformers adapter, :class:`featuredp.icl.hf.HFCausalLMPredictor`, implements the same protocol.

>>> knn = KNNPredictor(n_classes=2)
>>> demos = [([0.0, 0.0], 0), ([1.0, 1.0], 1)]
>>> knn.predict(demos, [0.9, 0.8]), knn.scores(demos, [0.1, 0.0]).tolist()
(1, [1.0, 0.0])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from featuredp._validate import check_int, check_positive
from featuredp.errors import DataValidationError

__all__ = [
    "BatchPredictor",
    "Demonstration",
    "KNNPredictor",
    "LogisticPredictor",
    "Predictor",
    "check_labels",
    "predict_many",
]

#: one demonstration: an input (a feature vector, a text, ...) and its class index
Demonstration = tuple[Any, int]


@runtime_checkable
class Predictor(Protocol):
    """The learner inside one prompt: deterministic, public, and reads only its own demonstrations."""

    n_classes: int

    def predict(self, demonstrations: Sequence[Demonstration], query: Any) -> int:
        """The label (class index) the prompt ``demonstrations`` + ``query`` answers."""
        ...

    def scores(self, demonstrations: Sequence[Demonstration], query: Any) -> np.ndarray:
        """A score per class, shape ``(n_classes,)`` (larger = more likely; ``predict`` is its argmax)."""
        ...


@runtime_checkable
class BatchPredictor(Predictor, Protocol):
    """A predictor that answers many queries with one prompt at once (for speed)."""

    def predict_batch(self, demonstrations: Sequence[Demonstration], queries: Sequence[Any]) -> np.ndarray:
        """Labels of every query, shape ``(n_queries,)``, int64."""
        ...

    def scores_batch(self, demonstrations: Sequence[Demonstration], queries: Sequence[Any]) -> np.ndarray:
        """Scores of every query, shape ``(n_queries, n_classes)``."""
        ...


def predict_many(predictor: Predictor, demonstrations: Sequence[Demonstration], queries: Sequence[Any]) -> np.ndarray:
    """Labels of ``queries`` under one prompt: the batch form when the predictor has one, else one by one.

    >>> predict_many(KNNPredictor(2), [([0.0], 0), ([1.0], 1)], [[0.2], [0.7]]).tolist()
    [0, 1]
    """
    if isinstance(predictor, BatchPredictor):
        out = np.asarray(predictor.predict_batch(demonstrations, queries), dtype=np.int64)
    else:
        out = np.asarray([predictor.predict(demonstrations, q) for q in queries], dtype=np.int64).reshape(-1)
    if out.shape != (len(queries),):
        raise DataValidationError(f"{type(predictor).__name__} returned {out.shape} labels for {len(queries)} queries")
    if out.size and (out.min() < 0 or out.max() >= predictor.n_classes):
        bad = out[(out < 0) | (out >= predictor.n_classes)][0]
        raise DataValidationError(f"{type(predictor).__name__} returned label {int(bad)}, outside the declared "
                                  f"classes 0..{predictor.n_classes - 1}")  # fmt: skip
    return out


def check_labels(name: str, labels: Any, n_classes: int) -> np.ndarray:
    """Labels as int64 class indices in ``[0, n_classes)``; anything else is a ``DataValidationError``.

    The class count is declared (public): a label outside it is refused, never used to widen the class list.

    >>> check_labels("y", [0, 2, 1], 3).tolist()
    [0, 2, 1]
    """
    y = np.asarray(labels)
    whole = np.issubdtype(y.dtype, np.floating) and bool(np.all(np.isfinite(y)) and np.all(y == np.round(y)))
    if y.size and not np.issubdtype(y.dtype, np.integer) and not whole:
        raise DataValidationError(f"{name} must be integer class indices, got dtype {y.dtype}")
    y = y.astype(np.int64).reshape(-1)
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        bad = y[(y < 0) | (y >= n_classes)][0]
        raise DataValidationError(f"{name} holds label {int(bad)}, outside the declared classes 0..{n_classes - 1}")
    return y


def _split(demonstrations: Sequence[Demonstration], n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) of numeric demonstrations: X float64 of shape (n, d), y int64 class indices."""
    if len(demonstrations) == 0:
        return np.zeros((0, 0)), np.zeros(0, dtype=np.int64)
    X = np.asarray([np.asarray(x, dtype=np.float64).reshape(-1) for x, _ in demonstrations])
    y = check_labels("demonstration labels", [label for _, label in demonstrations], n_classes)
    return X, y


def _queries(queries: Sequence[Any], d: int | None) -> np.ndarray:
    Q = np.asarray([np.asarray(q, dtype=np.float64).reshape(-1) for q in queries]).reshape(len(queries), -1)
    if d is not None and len(queries) and Q.shape[1] != d:
        raise DataValidationError(f"queries have {Q.shape[1]} features, the demonstrations {d}")
    return Q


class KNNPredictor:
    """k nearest demonstrations (Euclidean) vote; ``scores`` are the vote shares of the k neighbours.

    The offline stand-in for an LLM's in-context learning: it reads nothing but the prompt.
    With ``k=1`` it *memorises* its demonstrations — a demonstration queried by itself is answered with
    its own label — which is what makes membership inference against plain ICL easy.
    Ties between classes go to the class of the nearest tied neighbour (deterministic). With no
    demonstrations (zero-shot) every class scores equally and ``predict`` returns class 0: the
    offline learner knows nothing without examples.
    """

    def __init__(self, n_classes: int, k: int = 1) -> None:
        self.n_classes = check_int("n_classes", n_classes, minimum=2)
        self.k = check_int("k", k, minimum=1)

    def __repr__(self) -> str:
        return f"KNNPredictor(n_classes={self.n_classes}, k={self.k})"

    def _neighbours(self, demonstrations: Sequence[Demonstration], queries: Sequence[Any]
                    ) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
        X, y = _split(demonstrations, self.n_classes)
        if X.shape[0] == 0:
            return None
        Q = _queries(queries, X.shape[1])
        # squared distances without forming (q, n, d): |q|² − 2 q·x + |x|²
        d2 = (Q**2).sum(1)[:, None] - 2.0 * Q @ X.T + (X**2).sum(1)[None, :]
        k = min(self.k, X.shape[0])
        # stable sort: equal distances keep demonstration order, so the answer never depends on chance
        order = np.argsort(d2, axis=1, kind="stable")[:, :k]
        return order, y[order]

    def scores_batch(self, demonstrations: Sequence[Demonstration], queries: Sequence[Any]) -> np.ndarray:
        """Vote shares of the k nearest demonstrations, shape ``(n_queries, n_classes)``."""
        nb = self._neighbours(demonstrations, queries)
        if nb is None:
            return np.full((len(queries), self.n_classes), 1.0 / self.n_classes)
        _, labels = nb
        out = np.zeros((labels.shape[0], self.n_classes))
        np.add.at(out, (np.arange(labels.shape[0])[:, None], labels), 1.0)
        return out / labels.shape[1]

    def predict_batch(self, demonstrations: Sequence[Demonstration], queries: Sequence[Any]) -> np.ndarray:
        """The majority label of the k nearest demonstrations per query (ties: the nearest tied class)."""
        nb = self._neighbours(demonstrations, queries)
        if nb is None:
            return np.zeros(len(queries), dtype=np.int64)
        _, labels = nb
        counts = np.zeros((labels.shape[0], self.n_classes))
        np.add.at(counts, (np.arange(labels.shape[0])[:, None], labels), 1.0)
        top = counts.max(axis=1, keepdims=True)
        tied = counts[np.arange(labels.shape[0])[:, None], labels] == top  # neighbour's class is a top class
        first = np.argmax(tied, axis=1)  # the nearest neighbour whose class is tied for the top
        return labels[np.arange(labels.shape[0]), first].astype(np.int64)

    def scores(self, demonstrations: Sequence[Demonstration], query: Any) -> np.ndarray:
        """Vote shares for one query, shape ``(n_classes,)``."""
        return self.scores_batch(demonstrations, [query])[0]

    def predict(self, demonstrations: Sequence[Demonstration], query: Any) -> int:
        """The label for one query."""
        return int(self.predict_batch(demonstrations, [query])[0])


class LogisticPredictor:
    """A multinomial logistic regression fitted on the prompt's demonstrations alone (L2, strength ``C``).

    A "small fitted model" stand-in for in-context learning: refitted for every prompt, reading
    nothing else. Classes absent from the prompt score 0; a prompt with a single class answers it;
    with no demonstrations every class scores equally and ``predict`` returns class 0.
    """

    def __init__(self, n_classes: int, C: float = 1.0, max_iter: int = 200) -> None:
        self.n_classes = check_int("n_classes", n_classes, minimum=2)
        self.C = check_positive("C", C)
        self.max_iter = check_int("max_iter", max_iter, minimum=1)

    def __repr__(self) -> str:
        return f"LogisticPredictor(n_classes={self.n_classes}, C={self.C:g})"

    def scores_batch(self, demonstrations: Sequence[Demonstration], queries: Sequence[Any]) -> np.ndarray:
        """Class probabilities, shape ``(n_queries, n_classes)`` (0 for classes the prompt lacks)."""
        from sklearn.linear_model import LogisticRegression

        X, y = _split(demonstrations, self.n_classes)
        if X.shape[0] == 0:
            return np.full((len(queries), self.n_classes), 1.0 / self.n_classes)
        Q = _queries(queries, X.shape[1])
        out = np.zeros((Q.shape[0], self.n_classes))
        present = np.unique(y)
        if present.size == 1:
            out[:, present[0]] = 1.0
            return out
        # lbfgs on a handful of points converges fast; a fixed solver keeps the learner deterministic
        clf = LogisticRegression(C=self.C, max_iter=self.max_iter, solver="lbfgs")
        clf.fit(X, y)
        out[:, clf.classes_] = clf.predict_proba(Q)
        return out

    def predict_batch(self, demonstrations: Sequence[Demonstration], queries: Sequence[Any]) -> np.ndarray:
        """The most probable class per query (ties: the smallest class index)."""
        return np.argmax(self.scores_batch(demonstrations, queries), axis=1).astype(np.int64)

    def scores(self, demonstrations: Sequence[Demonstration], query: Any) -> np.ndarray:
        """Class probabilities for one query, shape ``(n_classes,)``."""
        return self.scores_batch(demonstrations, [query])[0]

    def predict(self, demonstrations: Sequence[Demonstration], query: Any) -> int:
        """The label for one query."""
        return int(self.predict_batch(demonstrations, [query])[0])
