"""PATE: Private Aggregation of Teacher Ensembles (Papernot et al. 2017, 2018), sklearn-style.

1. The private records are split into ``n_teachers`` disjoint parts: each record is assigned to
   a teacher uniformly at random and **independently of the other records**, from secret
   randomness (OS entropy). Independent assignment matters for add/remove neighbours: adding or
   removing one record never moves another record to a different teacher (splitting a shuffled
   list into equal chunks would), so exactly one teacher's data changes.
2. One teacher is trained per part — any scikit-learn-style estimator (cloned per part), or a
   plain function ``teacher(X_part, y_part, X_query) -> labels`` (torch models fit behind it).
3. Each teacher votes on the public, unlabelled query inputs; the votes are aggregated by a
   :class:`featuredp.aggregation.VoteAggregator` (GNMax, LNMax or Confident-GNMax), which
   charges every query and refuses queries beyond the budget before releasing anything.
4. A student (scikit-learn style) is trained on (public query inputs, aggregated labels) only.

Guarantee: the aggregated labels — and so the student, their post-processing — are (ε, δ)-DP
for the private records (features *and* label; add/remove or replacement of one record), because
one record changes one teacher's vote: the histogram moves by L2 <= √2, L1 <= 2. The public
query inputs are not protected (they are public), and their number is public. The teachers, their
votes and the partition are *not* private outputs: keep them like the private data.

Edge cases, each a function of one teacher's own part (so the guarantee is unaffected): a
teacher with no records abstains (vote −1) on every query; a teacher whose part holds one class
votes that class; an estimator that fails to fit raises.
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sklearn.base import clone

from featuredp._validate import check_choice, check_delta, check_int, check_positive
from featuredp.aggregation import MECHANISMS, VoteAggregator, aggregation_event, vote_histogram
from featuredp.aggregation.aggregator import DEFAULT_SIGMA_THRESHOLD_RATIO
from featuredp.errors import BudgetExceededError, DataValidationError, PrivacyRiskWarning
from featuredp.sampling import make_streams, warn_private_seed

__all__ = ["PATE", "assign_teachers", "collect_votes", "fit_student", "teacher_parts"]

TeacherFn = Callable[[Any, np.ndarray, Any], Any]


def assign_teachers(n_records: int, n_teachers: int, rng: np.random.Generator) -> np.ndarray:
    """The teacher of each record: i.i.d. uniform over ``range(n_teachers)`` (int64, shape ``(n_records,)``).

    Independent per record, so adding or removing one record leaves every other assignment as it
    was. ``rng`` must be secret (the private stream) when the records are private.

    >>> assign_teachers(6, 3, np.random.default_rng(0)).tolist()
    [2, 1, 1, 0, 0, 0]
    """
    n = check_int("n_records", n_records, minimum=0)
    k = check_int("n_teachers", n_teachers, minimum=1)
    return rng.integers(0, k, size=n, dtype=np.int64)


def teacher_parts(assignment: np.ndarray, n_teachers: int) -> list[np.ndarray]:
    """Record indices of each teacher's part (disjoint, covering every record; a part may be empty).

    >>> [p.tolist() for p in teacher_parts(np.array([2, 1, 1, 0]), 3)]
    [[3], [1, 2], [0]]
    """
    k = check_int("n_teachers", n_teachers, minimum=1)
    a = np.asarray(assignment, dtype=np.int64)
    order = np.argsort(a, kind="stable")
    bounds = np.searchsorted(a[order], np.arange(k + 1))
    return [order[bounds[t]: bounds[t + 1]] for t in range(k)]


def _rows(X: Any, idx: np.ndarray) -> Any:
    return X[idx]


def _fit_one(teacher: Any, X: Any, y: np.ndarray, X_query: Any, n_classes: int) -> tuple[Any, np.ndarray]:
    """(fitted teacher or None, its votes on ``X_query``) for one part."""
    n_query = len(X_query) if not hasattr(X_query, "shape") else X_query.shape[0]
    if len(y) == 0:
        return None, np.full(n_query, -1, dtype=np.int64)  # no records: abstain everywhere
    if hasattr(teacher, "fit"):
        present = np.unique(y)
        if len(present) == 1:  # most estimators refuse one class; the vote it would give is that class
            return None, np.full(n_query, int(present[0]), dtype=np.int64)
        try:
            model = clone(teacher)
        except TypeError:  # not a scikit-learn estimator (no get_params): a fresh deep copy per part
            model = copy.deepcopy(teacher)
        model.fit(X, y)
        votes = model.predict(X_query)
    else:
        model, votes = None, teacher(X, y, X_query)
    votes = np.asarray(votes)
    if votes.shape != (n_query,):
        raise DataValidationError(f"a teacher returned votes of shape {votes.shape}; expected ({n_query},)")
    if votes.size and not np.issubdtype(votes.dtype, np.integer):
        if not np.all(np.mod(votes, 1) == 0):
            raise DataValidationError(f"a teacher returned non-integer votes (dtype {votes.dtype}); votes are class "
                                      f"indices 0..{n_classes - 1} or -1")  # fmt: skip
        votes = votes.astype(np.int64)
    return model, votes.astype(np.int64)


def collect_votes(
    teacher: Any,
    X: Any,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    X_query: Any,
    n_classes: int,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[Any], np.ndarray]:
    """Fit one teacher per part and collect its votes on ``X_query``: (teachers, votes ``(n_query, n_teachers)``).

    ``teacher`` is an unfitted scikit-learn-style estimator (cloned per part) or a function
    ``teacher(X_part, y_part, X_query) -> labels``. Votes are checked against the declared classes
    (``DataValidationError`` naming the teacher for a label outside 0..K−1 or −1).
    """
    k = check_int("n_classes", n_classes, minimum=2)
    teachers: list[Any] = []
    columns = []
    for t, idx in enumerate(parts):
        model, votes = _fit_one(teacher, _rows(X, idx), y[idx], X_query, k)
        try:
            vote_histogram(votes, k)
        except DataValidationError as exc:
            raise DataValidationError(f"teacher {t}: {exc}") from None
        teachers.append(model)
        columns.append(votes)
        if progress is not None:
            progress(t + 1, len(parts))
    return teachers, np.stack(columns, axis=1) if columns else np.zeros((0, 0), dtype=np.int64)


def _n_rows(X: Any, name: str) -> int:
    if X is None:
        raise DataValidationError(f"{name} must be an array of rows, got None")
    n = X.shape[0] if hasattr(X, "shape") else len(X)
    return int(n)


def fit_student(student: Any, X_query: Any, labels: np.ndarray) -> Any:
    """Fit a clone of ``student`` on the answered queries only: (X_query[answered], labels[answered]).

    Reads nothing private: the public inputs and the released labels (−1 = not answered, skipped).
    One released class only → a constant ``DummyClassifier``; no answered query → None (and a warning).
    """
    labels = np.asarray(labels)
    answered = np.flatnonzero(labels >= 0)
    if answered.size == 0:
        warnings.warn("no query was answered (threshold too high, or no budget): no student was trained",
                      UserWarning, stacklevel=3)  # fmt: skip
        return None
    X_train, y_train = _rows(X_query, answered), labels[answered]
    if len(np.unique(y_train)) < 2:
        from sklearn.dummy import DummyClassifier

        return DummyClassifier(strategy="most_frequent").fit(X_train, y_train)
    return clone(student).fit(X_train, y_train)


class _Progress:
    """'featuredp pate: teachers 50/250' on stderr, about every 10% (only when asked)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.last = -1

    def __call__(self, done: int, total: int) -> None:
        step = max(1, total // 10)
        if done == total or done // step != self.last:
            self.last = done // step
            print(f"{self.prefix}teachers fitted {done}/{total}", file=sys.stderr, flush=True)


class PATE:
    """PATE with a budgeted vote aggregator; scikit-learn-style ``fit`` / ``predict`` / ``score``.

    Args:
        teacher: an unfitted scikit-learn-style classifier (cloned per part; default
            ``LogisticRegression(max_iter=1000)``) or a function ``teacher(X_part, y_part, X_query)
            -> labels`` returning class indices (−1 = abstain).
        n_teachers: the number of disjoint parts (<= the number of private records).
        n_classes: the declared class count K (public; labels are indices 0..K−1).
        student: the unfitted student classifier (cloned; default ``LogisticRegression(max_iter=1000)``).
        aggregator: a :class:`~featuredp.aggregation.VoteAggregator`; or give ``epsilon`` (and
            ``delta``, ``mechanism``, ``threshold``) and one is calibrated so that the queries cost at
            most ε (:meth:`VoteAggregator.calibrate`).
        queries: how many public inputs to ask (the first ``queries`` rows of ``X_public``; default all).
        ledger, secure_rng: passed to the calibrated aggregator (``ledger``: reserve before each batch).
        seed: research only: seeds the partition and the noise, warns (``PrivacyRiskWarning``), never stored.
        progress: print teacher-fitting progress on stderr.

    Attributes (after ``fit``):
        labels_: the released aggregated label of each asked query (−1: not answered or not asked).
        student_: the student, fitted on (X_public[answered], labels_[answered]) only (None if no
            query was answered).
        aggregator_, epsilon_, delta_, queries_asked_, queries_answered_.
        teachers_, votes_, partition_: **private** (they depend on the private records): the fitted
            teachers (None for function teachers, abstaining or one-class parts), their votes
            ``(n_queries, n_teachers)`` and the teacher of each private record. Never release them.
    """

    def __init__(
        self,
        teacher: Any = None,
        n_teachers: int = 250,
        *,
        n_classes: int,
        student: Any = None,
        aggregator: VoteAggregator | None = None,
        epsilon: float | None = None,
        delta: float = 1e-5,
        queries: int | None = None,
        mechanism: str = "gnmax",
        threshold: float | None = None,
        sigma_threshold_ratio: float = DEFAULT_SIGMA_THRESHOLD_RATIO,
        ledger: Any = None,
        secure_rng: bool = False,
        seed: int | None = None,
        progress: bool = False,
    ) -> None:
        self.teacher = teacher
        self.n_teachers = n_teachers
        self.n_classes = n_classes
        self.student = student
        self.aggregator = aggregator
        self.epsilon = epsilon
        self.delta = delta
        self.queries = queries
        self.mechanism = mechanism
        self.threshold = threshold
        self.sigma_threshold_ratio = sigma_threshold_ratio
        self.ledger = ledger
        self.secure_rng = secure_rng
        self.seed = seed
        self.progress = progress

    @staticmethod
    def _default_classifier() -> Any:
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(max_iter=1000)

    def _check(self, X_private: Any, y_private: Any, X_public: Any) -> tuple[np.ndarray, int, int, int | None]:
        k = check_int("n_classes", self.n_classes, minimum=2)
        n_teachers = check_int("n_teachers", self.n_teachers, minimum=1)
        n = _n_rows(X_private, "X_private")
        y = np.asarray(y_private)
        if y.ndim != 1 or len(y) != n:
            raise DataValidationError(f"y_private must have shape ({n},) like X_private's rows, got {y.shape}")
        if len(y) and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= k):
            raise DataValidationError(f"y_private must hold class indices 0..{k - 1} (n_classes={k}); got dtype "
                                      f"{y.dtype}, values in [{y.min()}, {y.max()}]")  # fmt: skip
        if n_teachers > n:
            raise ValueError(f"n_teachers must be <= the number of private records ({n}), got {n_teachers}")
        n_public = _n_rows(X_public, "X_public")
        if n_public == 0:
            raise DataValidationError("X_public must hold at least one query input")
        q = n_public if self.queries is None else check_int("queries", self.queries, minimum=1)
        if q > n_public:
            raise ValueError(f"queries must be <= the number of public inputs ({n_public}), got {q}")
        if (self.aggregator is None) == (self.epsilon is None):
            raise ValueError("give exactly one of aggregator (a VoteAggregator) or epsilon (to calibrate one); got "
                             f"aggregator={self.aggregator!r}, epsilon={self.epsilon!r}")  # fmt: skip
        if self.aggregator is not None and self.aggregator.n_classes != k:
            raise ValueError(f"the aggregator's n_classes={self.aggregator.n_classes} differs from n_classes={k}")
        seed = None if self.seed is None else check_int("seed", self.seed, minimum=0)
        return y.astype(np.int64), n_teachers, q, seed

    def _make_aggregator(self, n_private: int, q: int, seed: int | None) -> VoteAggregator:
        if self.aggregator is not None:
            return self.aggregator
        eps = check_positive("epsilon", self.epsilon)
        delta = check_delta(self.delta, n_private)
        mechanism = check_choice("mechanism", self.mechanism, MECHANISMS)
        with warnings.catch_warnings():
            # the seed's PrivacyRiskWarning was given once by fit; the aggregator gets a derived seed
            warnings.simplefilter("ignore", PrivacyRiskWarning)
            noise_seed = None if seed is None else int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])
            return VoteAggregator.calibrate(
                self.n_classes, epsilon=eps, delta=delta, queries=q, mechanism=mechanism, threshold=self.threshold,
                sigma_threshold_ratio=self.sigma_threshold_ratio, ledger=self.ledger, secure_rng=self.secure_rng,
                seed=noise_seed,
            )  # fmt: skip

    def fit(self, X_private: Any, y_private: Any, X_public: Any) -> PATE:
        """Partition, fit the teachers, aggregate their votes on ``X_public``, fit the student; returns self.

        Order: validate everything and build (or check) the aggregator; refuse with
        ``BudgetExceededError`` — before any teacher is trained — if not even one query fits its
        ``max_epsilon``, or if the planned queries do not fit the ledger; then partition and train,
        then aggregate (queries beyond ``max_epsilon`` are not asked: ``labels_`` −1 there).
        """
        y, n_teachers, q, seed = self._check(X_private, y_private, X_public)
        if seed is not None:
            warn_private_seed("seed", seed)
        aggregator = self._make_aggregator(len(y), q, seed)
        aggregator.check_process()  # a forked copy of a given aggregator without a ledger: refused before training
        if aggregator.remaining_queries == 0:
            raise BudgetExceededError(f"the aggregator has no budget left for a query (epsilon {aggregator.epsilon:.4g}"
                                      f" of max_epsilon={aggregator.max_epsilon}); no teacher was trained")  # fmt: skip
        ledger = aggregator.ledger
        if ledger is not None:
            # like the Trainer, check the planned spend before the private data is used (the aggregator reserves
            # it for real, query batch by query batch, just before answering)
            planned = q if aggregator.remaining_queries is None else min(q, aggregator.remaining_queries)
            total = ledger.projected(event=aggregation_event(aggregator.query_event, planned))
            if total > ledger.total_epsilon:
                raise BudgetExceededError(f"{planned} queries would take the ledger {ledger.path} to epsilon "
                                          f"{total:.4g}, above its total {ledger.total_epsilon:g}; no teacher was "
                                          "trained")  # fmt: skip
        # the partition touches the private records: secret stream (OS entropy unless seeded)
        assignment = assign_teachers(len(y), n_teachers, make_streams(seed).private_sampling)
        parts = teacher_parts(assignment, n_teachers)
        X_query = _rows(X_public, np.arange(q))
        teacher = self.teacher if self.teacher is not None else self._default_classifier()
        teachers, votes = collect_votes(teacher, X_private, y, parts, X_query, self.n_classes,
                                        progress=_Progress("featuredp pate: ") if self.progress else None)  # fmt: skip
        asked_before = aggregator.queries_asked
        labels = aggregator.answer_all(votes, stop_at_budget=True)
        # ---- everything below reads only the public inputs and the released labels (post-processing)
        self.partition_, self.teachers_, self.votes_ = assignment, teachers, votes
        self.aggregator_ = aggregator
        self.labels_ = labels
        self.queries_asked_ = aggregator.queries_asked - asked_before
        self.queries_answered_ = int(np.count_nonzero(labels >= 0))
        self.epsilon_, self.delta_ = aggregator.epsilon, aggregator.delta
        base = self.student if self.student is not None else self._default_classifier()
        self.student_ = fit_student(base, X_query, labels)
        return self

    def predict(self, X: Any) -> np.ndarray:
        """The student's predictions (post-processing of the aggregated labels)."""
        student = getattr(self, "student_", None)
        if student is None:
            raise ValueError("PATE has no student: call fit first (or no query was answered)")
        return np.asarray(student.predict(X))

    def score(self, X: Any, y: Any) -> float:
        """The student's accuracy on (X, y)."""
        return float(np.mean(self.predict(X) == np.asarray(y)))

    def label_accuracy(self, y_public: Any) -> float | None:
        """Accuracy of the answered aggregated labels against the true labels of those queries (evaluation only)."""
        y = np.asarray(y_public)[: len(self.labels_)]
        answered = self.labels_ >= 0
        return float(np.mean(self.labels_[answered] == y[answered])) if answered.any() else None

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts of the fit: no seed, no teacher, no vote, no part size (those depend on private data).

        ``queries_asked``/``queries_answered`` are this fit's; ``epsilon`` is the aggregator's total.
        """
        return {**self.aggregator_.describe(), "teachers": len(self.teachers_), "n_private": len(self.partition_),
                "queries": len(self.labels_), "queries_asked": self.queries_asked_,
                "queries_answered": self.queries_answered_, "seeded": self.seed is not None}  # fmt: skip
