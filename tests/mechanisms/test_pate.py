"""PATE, attacked: disjoint secret partitions, a student that never sees private data, budget refusals
before any teacher is trained, the ledger, secret seeds."""

from __future__ import annotations

import json
import warnings
from typing import ClassVar

import numpy as np
import pytest

from featuredp.accounting import BudgetLedger
from featuredp.aggregation import VoteAggregator
from featuredp.errors import BudgetExceededError, DataValidationError, PrivacyRiskWarning
from featuredp.mechanisms.pate import PATE, assign_teachers, collect_votes, teacher_parts


def _data(n_private=600, n_public=200, d=5, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=d)
    X = rng.normal(size=(n_private + n_public, d))
    y = (X @ w > 0).astype(np.int64)
    return X[:n_private], y[:n_private], X[n_private:], y[n_private:]


class _SpyTeacher:
    """A function teacher that records which private rows it was given (by an id in column 0)."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def __call__(self, X, y, X_query):
        self.seen.append(X[:, 0].astype(int).copy())
        return np.full(len(X_query), int(np.bincount(y, minlength=2).argmax()) if len(y) else -1)


class _SpyStudent:
    """A scikit-learn-style student that records every argument of fit."""

    calls: ClassVar[list[tuple]] = []

    def get_params(self, deep=True):
        return {}

    def set_params(self, **params):
        return self

    def fit(self, *args, **kwargs):
        _SpyStudent.calls.append((args, kwargs))
        return self

    def predict(self, X):
        return np.zeros(len(X), dtype=np.int64)


def test_assignment_is_disjoint_covering_and_adding_a_record_moves_no_other():
    a = assign_teachers(1000, 7, np.random.default_rng(1))
    parts = teacher_parts(a, 7)
    together = np.concatenate(parts)
    assert len(together) == 1000 and set(together.tolist()) == set(range(1000))  # cover, no record twice
    assert all((a[p] == t).all() for t, p in enumerate(parts))
    # i.i.d. assignment: one more record (appended) leaves every other record with its teacher
    b = assign_teachers(1001, 7, np.random.default_rng(1))
    assert np.array_equal(a, b[:1000])


def test_teachers_train_on_disjoint_parts_that_cover_the_private_data():
    X, y, Xp, _ = _data()
    X = np.column_stack([np.arange(len(X)), X])  # column 0: the record's id
    Xp = np.column_stack([np.full(len(Xp), -1), Xp])
    spy = _SpyTeacher()
    pate = PATE(spy, n_teachers=25, n_classes=2, epsilon=2.0, queries=50).fit(X, y, Xp)
    assert len(spy.seen) == 25
    seen = np.concatenate(spy.seen)
    assert len(seen) == len(X) and set(seen.tolist()) == set(range(len(X)))
    for t, ids in enumerate(spy.seen):
        assert np.array_equal(np.sort(ids), np.flatnonzero(pate.partition_ == t))
    # no public input ever reached a teacher as training data
    assert -1 not in seen


def test_the_student_sees_only_public_inputs_and_aggregated_labels():
    X, y, Xp, _ = _data()
    scrambled = np.random.default_rng(5).permutation(y)  # the private labels changed, nothing else
    runs = []
    for labels in (y, scrambled):
        _SpyStudent.calls = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrivacyRiskWarning)
            pate = PATE(n_teachers=20, n_classes=2, student=_SpyStudent(), epsilon=4.0, queries=120,
                        seed=7).fit(X, labels, Xp)  # fmt: skip
        assert len(_SpyStudent.calls) == 1
        args, kwargs = _SpyStudent.calls[0]
        assert kwargs == {} and len(args) == 2  # fit(X, y): no sample weights, no private side channel
        runs.append((pate, args))
    (p1, (x1, l1)), (p2, (x2, l2)) = runs
    # the student's inputs are exactly the asked public rows, identical whatever the private labels were
    assert np.array_equal(x1, Xp[:120]) and np.array_equal(x1, x2)
    assert np.array_equal(l1, p1.labels_) and np.array_equal(l2, p2.labels_)
    assert np.array_equal(p1.partition_, p2.partition_)  # the partition never looks at the labels
    assert not np.array_equal(p1.votes_, p2.votes_)  # ... while the votes (and labels) do depend on them
    # the student's training rows contain no private row
    assert not any((np.abs(Xp[:120][:, None, :] - X[None, :, :]).sum(axis=2) == 0).any(axis=1))


def test_no_teacher_is_trained_when_not_even_one_query_fits(tmp_path):
    X, y, Xp, _ = _data()
    spy = _SpyTeacher()
    spent = VoteAggregator(2, sigma=10.0, max_epsilon=0.5)
    spent.answer_all(np.zeros((1000, 3), dtype=int))  # exhausts its max_epsilon
    with pytest.raises(BudgetExceededError, match="no teacher was trained"):
        PATE(spy, n_teachers=10, n_classes=2, aggregator=spent).fit(X, y, Xp)
    path = tmp_path / "budget.json"
    BudgetLedger(path, total_epsilon=1.0, delta=1e-5).spend("earlier", epsilon=1.0)
    before = path.read_bytes()
    with pytest.raises(BudgetExceededError, match="no teacher was trained"):
        PATE(spy, n_teachers=10, n_classes=2, epsilon=0.5, ledger=path).fit(X, y, Xp)
    assert spy.seen == [] and path.read_bytes() == before


def test_the_ledger_holds_the_aggregation(tmp_path):
    X, y, Xp, _ = _data()
    path = tmp_path / "budget.json"
    BudgetLedger(path, total_epsilon=3.0, delta=1e-5)
    pate = PATE(n_teachers=20, n_classes=2, epsilon=1.0, queries=80, ledger=path).fit(X, y, Xp)
    records = BudgetLedger(path).records
    assert len(records) == 1 and records[0]["status"] == "settled"
    assert BudgetLedger(path).spent() == pytest.approx(pate.epsilon_, rel=1e-6) and pate.epsilon_ <= 1.0
    assert pate.queries_asked_ == 80 == pate.queries_answered_


def test_a_seed_warns_and_is_never_described():
    X, y, Xp, _ = _data()
    with pytest.warns(PrivacyRiskWarning, match="seed=424242"):
        pate = PATE(n_teachers=10, n_classes=2, epsilon=1.0, queries=20, seed=424242).fit(X, y, Xp)
    text = json.dumps(pate.describe())
    assert "424242" not in text and pate.describe()["seeded"] is True
    assert pate.aggregator_.seeded is True and "424242" not in repr(pate.aggregator_)


def test_edge_parts_abstain_or_vote_their_only_class():
    X = np.arange(6, dtype=float).reshape(-1, 1)
    y = np.array([0, 0, 1, 1, 1, 1])
    parts = [np.array([], dtype=np.int64), np.array([0, 1]), np.array([2, 3, 4, 5])]
    from sklearn.linear_model import LogisticRegression

    teachers, votes = collect_votes(LogisticRegression(), X, y, parts, X[:3], 2)
    assert votes.shape == (3, 3)
    assert (votes[:, 0] == -1).all() and (votes[:, 1] == 0).all() and (votes[:, 2] == 1).all()
    assert teachers == [None, None, None]

    def bad(X, y, Xq):
        return np.full(len(Xq), 5)

    with pytest.raises(DataValidationError, match=r"teacher 0: votes must be class indices in 0\.\.1"):
        collect_votes(bad, X, y, parts[1:], X[:3], 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_teachers": 601, "epsilon": 1.0}, "n_teachers must be <= the number of private records"),
        ({"n_teachers": 0, "epsilon": 1.0}, "n_teachers must be >= 1"),
        ({"n_teachers": 10, "epsilon": 1.0, "queries": 201}, "queries must be <= the number of public inputs"),
        ({"n_teachers": 10}, "give exactly one of aggregator"),
        ({"n_teachers": 10, "epsilon": -1.0}, "epsilon must be > 0"),
        ({"n_teachers": 10, "epsilon": 1.0, "mechanism": "rr"}, "mechanism must be one of"),
    ],
)
def test_bad_settings_fail_before_any_teacher(kwargs, message):
    X, y, Xp, _ = _data()
    spy = _SpyTeacher()
    with pytest.raises(ValueError, match=message):
        PATE(spy, n_classes=2, **kwargs).fit(X, y, Xp)
    assert spy.seen == []


def test_undeclared_labels_are_refused():
    X, y, Xp, _ = _data()
    with pytest.raises(DataValidationError, match=r"class indices 0\.\.1"):
        PATE(n_teachers=5, n_classes=2, epsilon=1.0).fit(X, y + 1, Xp)


def test_pate_learns_a_separable_task():
    X, y, Xp, yp = _data(n_private=2000, n_public=400, seed=3)
    pate = PATE(n_teachers=50, n_classes=2, epsilon=8.0, queries=60).fit(X, y, Xp)
    assert pate.queries_answered_ == 60 and pate.epsilon_ <= 8.0
    assert pate.label_accuracy(yp) > 0.85 and pate.score(Xp[200:], yp[200:]) > 0.85
