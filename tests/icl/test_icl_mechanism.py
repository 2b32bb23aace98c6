"""DP-ICL's mechanism as an attacker would probe it: disjoint prompts, budget stop, ε, secret randomness."""

from __future__ import annotations

import json
import math
import warnings

import dp_accounting
import numpy as np
import pytest

from featuredp.accounting import BudgetLedger, compute_epsilon
from featuredp.errors import BudgetExceededError, DataValidationError, PrivacyLeakWarning, PrivacyRiskWarning
from featuredp.icl import DPICLClassifier, KNNPredictor, partition_demonstrations


def _data(n=103, k=3, d=4, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 4, (k, d))
    y = rng.integers(0, k, n)
    X = centres[y] + rng.normal(0, 0.5, (n, d))
    return X, y


class Spy(KNNPredictor):
    """A 1-NN that records which demonstrations every call reads (as identities of the input rows)."""

    def __init__(self, n_classes):
        super().__init__(n_classes)
        self.calls: list[list[int]] = []

    def predict_batch(self, demonstrations, queries):
        self.calls.append([int(x[-1]) for x, _ in demonstrations])
        return super().predict_batch([(x[:-1], y) for x, y in demonstrations], [q[:-1] for q in queries])


def _tagged(X, y):
    # the last column is the record's index: the spy sees which records a prompt holds
    return [(np.r_[x, i], int(c)) for i, (x, c) in enumerate(zip(X, y))]


def test_prompts_are_disjoint_and_sized_as_asked():
    X, y = _data()
    clf = DPICLClassifier(KNNPredictor(3), shots=4, prompts=20, epsilon=math.inf).fit(list(zip(X, y)))
    p = clf.partition_
    assert p.shape == (20, 4) and clf.prompts == 20
    assert len(set(p.ravel().tolist())) == 80 and p.min() >= 0 and p.max() < 103
    # default: as many prompts as fit
    with pytest.warns(PrivacyLeakWarning, match="reveals n"):  # M derived from the private set's size
        full = DPICLClassifier(KNNPredictor(3), shots=4, epsilon=math.inf).fit(list(zip(X, y)))
    assert full.partition_.shape == (25, 4) and len(set(full.partition_.ravel().tolist())) == 100
    with pytest.raises(ValueError, match=r"prompts × shots = 26 × 4 = 104 must be <= the number of demonstrations"):
        DPICLClassifier(KNNPredictor(3), shots=4, prompts=26, epsilon=math.inf).fit(list(zip(X, y)))
    with pytest.raises(ValueError, match="shots"):
        partition_demonstrations(3, 1, 4, np.random.default_rng())


def test_each_vote_reads_exactly_one_prompt_and_no_record_twice():
    X, y = _data()
    spy = Spy(3)
    clf = DPICLClassifier(spy, shots=3, prompts=30, epsilon=2.0, queries=10).fit(_tagged(X, y))
    clf.predict([np.r_[x, -1] for x in X[:5]])
    assert len(spy.calls) == 30
    seen = [i for call in spy.calls for i in call]
    assert len(seen) == len(set(seen)) == 90  # disjoint: one record influences at most one vote
    assert sorted(map(sorted, spy.calls)) == sorted(sorted(row) for row in clf.partition_.tolist())


def test_budget_stop_refuses_before_release_and_epsilon_stays_within_budget():
    X, y = _data()
    spy = Spy(3)
    clf = DPICLClassifier(spy, shots=2, prompts=40, epsilon=1.0, delta=1e-5, queries=5).fit(_tagged(X, y))
    queries = [np.r_[x, -1] for x in X[:8]]
    out = clf.predict(queries)
    assert (out[:5] >= 0).all() and (out[5:] == -1).all()
    assert clf.queries_asked == clf.queries_answered == 5 and clf.epsilon <= 1.0
    calls = len(spy.calls)
    # once spent: refused, and no prompt even reads the query
    with pytest.raises(BudgetExceededError, match="nothing was computed or released"):
        clf.predict_one(queries[0])
    assert clf.predict(queries).tolist() == [-1] * 8
    with pytest.raises(BudgetExceededError):
        clf.predict(queries[:1], stop_at_budget=False)
    assert len(spy.calls) == calls and clf.queries_asked == 5 and clf.epsilon <= 1.0
    # a batch too big for the rest of the budget is refused whole without stop_at_budget
    fresh = DPICLClassifier(Spy(3), shots=2, prompts=40, epsilon=1.0, queries=5).fit(_tagged(X, y))
    with pytest.raises(BudgetExceededError, match="do not fit"):
        fresh.predict(queries, stop_at_budget=False)
    assert fresh.queries_asked == 0 and fresh.predictor.calls == []


def test_reported_epsilon_is_the_composition_of_the_queries_answered():
    X, y = _data()
    clf = DPICLClassifier(KNNPredictor(3), shots=2, prompts=40, epsilon=3.0, delta=1e-6, queries=50).fit(
        list(zip(X, y)))
    assert clf.epsilon == 0.0
    for k in (1, 7, 30):
        clf.predict(X[:k])
        answered = clf.queries_answered
        # independent of the aggregator: GNMax with std σ is a Gaussian with sensitivity √2, composed per query
        event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(clf.sigma / math.sqrt(2)), answered)
        assert clf.epsilon == pytest.approx(compute_epsilon(event, 1e-6), rel=1e-9)
    assert clf.queries_answered == 38 and clf.epsilon < 3.0
    clf.predict(X[:20])
    assert clf.queries_answered == 50 and 0.99 * 3.0 <= clf.epsilon <= 3.0


def test_noise_is_really_added():
    # 10 prompts that all vote class 0; at ε = 1 over 100 queries σ ≈ 53 votes drowns 10 votes
    X = np.zeros((20, 1))
    y = np.zeros(20, dtype=int)
    clf = DPICLClassifier(KNNPredictor(3), shots=2, prompts=10, epsilon=1.0, queries=100, seed=3).fit(list(zip(X, y)))
    out = clf.predict(np.zeros((100, 1)))
    assert clf.sigma > 40 and np.mean(out == 0) < 0.6 and set(out.tolist()) == {0, 1, 2}


def test_infinite_epsilon_is_the_plain_majority_and_reports_inf():
    X, y = _data()
    clf = DPICLClassifier(KNNPredictor(3), shots=3, prompts=15, epsilon=math.inf).fit(list(zip(X, y)))
    out = clf.predict(X)
    votes = clf._votes(X)
    hist = np.stack([np.bincount(v, minlength=3) for v in votes])
    top = hist.max(1)
    unique = (hist == top[:, None]).sum(1) == 1
    assert (out[unique] == hist[unique].argmax(1)).all()
    assert (hist[np.arange(len(out)), out] == top).all()  # ties: a top class, chosen at random
    assert clf.epsilon == math.inf and clf.sigma is None and clf.event() is None
    info = json.loads(json.dumps(clf.describe()))
    assert info["epsilon"] == "inf" and info["mechanism"] == "majority"


def test_secret_randomness_differs_between_runs_and_a_seed_warns_and_is_never_shown():
    X, y = _data()
    demos = list(zip(X, y))
    a = DPICLClassifier(KNNPredictor(3), shots=4, prompts=25, epsilon=1.0, queries=10).fit(demos)
    b = DPICLClassifier(KNNPredictor(3), shots=4, prompts=25, epsilon=1.0, queries=10).fit(demos)
    assert not np.array_equal(a.partition_, b.partition_)
    with pytest.warns(PrivacyRiskWarning, match="seed=987654321"):
        c = DPICLClassifier(KNNPredictor(3), shots=4, prompts=25, epsilon=1.0, queries=10, seed=987654321).fit(demos)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = DPICLClassifier(KNNPredictor(3), shots=4, prompts=25, epsilon=1.0, queries=10, seed=987654321).fit(demos)
    assert [w.category for w in caught] == [PrivacyRiskWarning]  # one warning, not one per internal stream
    assert np.array_equal(c.partition_, d.partition_)
    assert c.predict(X[:10]).tolist() == d.predict(X[:10]).tolist()  # the noise too
    text = json.dumps(c.describe()) + repr(c) + repr(c.aggregator) + json.dumps(c.aggregator.describe())
    assert "987654321" not in text and c.describe()["seeded"] is True and a.describe()["seeded"] is False


def test_a_ledger_stops_the_answers_too(tmp_path):
    X, y = _data()
    ledger = BudgetLedger(tmp_path / "budget.json", total_epsilon=0.5, delta=1e-5)
    clf = DPICLClassifier(KNNPredictor(3), shots=2, prompts=40, epsilon=1.0, queries=20, ledger=ledger).fit(
        list(zip(X, y)))
    out = clf.predict(X[:20])
    answered = int((out >= 0).sum())
    assert 0 < answered < 20 and clf.queries_asked == answered
    assert BudgetLedger(tmp_path / "budget.json").spent() <= 0.5


def test_refusals_before_any_work():
    X, y = _data()
    with pytest.raises(ValueError, match="queries is required with a finite epsilon"):
        DPICLClassifier(KNNPredictor(3), shots=2, epsilon=1.0)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        DPICLClassifier(KNNPredictor(3), shots=2, epsilon=0.0, queries=1)
    with pytest.raises(TypeError, match="predictor must implement"):
        DPICLClassifier(object(), shots=2, epsilon=1.0, queries=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threshold and ledger need a finite epsilon"):
        DPICLClassifier(KNNPredictor(3), shots=2, epsilon=math.inf, threshold=5.0)
    clf = DPICLClassifier(KNNPredictor(3), shots=2, prompts=1, epsilon=1.0, queries=1)
    with pytest.raises(DataValidationError, match=r"label 3, outside the declared classes 0\.\.2"):
        clf.fit([(X[0], 0), (X[1], 3)])
    assert clf.partition_ is None
    clf.fit(list(zip(X, y)))
    with pytest.raises(ValueError, match="fit was already called"):
        clf.fit(list(zip(X, y)))
