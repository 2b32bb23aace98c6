"""Attacks on what the private classifiers release or do *outside* their mechanisms.

1. The class set. If ``classes_`` is ``np.unique(y)``, a record holding a label no other record
   has changes the model's shape (``classes_``, rows of ``coef_``, columns of ``predict_proba``)
   between neighbouring datasets: distinguishable with certainty, ε = ∞ for that record.
   Declared ``classes=[...]`` must make every released shape identical between such
   neighbours; leaving it out must warn.
2. The ledger. Recording a spend after ``fit`` refuses an overspend only once the data was
   used. ``ledger=`` must refuse *before* the mechanism draws any randomness or sees the
   labels, leave the ledger file byte-identical, and otherwise settle exactly one spend.

Covers the four estimators: output / objective perturbation, noisy SGD, and the label-DP
classifier.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

import featuredp.erm.noisy_sgd as noisy_sgd_module
import featuredp.erm.perturbation as perturbation_module
import featuredp.mechanisms.labeldp as labeldp_module
from featuredp.accounting import BudgetLedger
from featuredp.erm import NoisySGDClassifier, ObjectivePerturbationClassifier, OutputPerturbationClassifier
from featuredp.errors import BudgetExceededError, DataValidationError, PrivacyLeakWarning
from featuredp.mechanisms.labeldp import LabelDPClassifier

ALL = (OutputPerturbationClassifier, ObjectivePerturbationClassifier, NoisySGDClassifier, LabelDPClassifier)
ERM = ALL[:3]


def _make(cls, **kw):
    """An estimator with small-data settings (noisy SGD's default batch exceeds these sets)."""
    if cls is NoisySGDClassifier:
        kw = {"batch_size": 10, "epochs": 1, "data_norm": 1.0, **kw}
    elif cls is LabelDPClassifier:
        kw = {"method": "rr", **kw}
    else:
        kw = {"data_norm": 1.0, **kw}
    return cls(random_state=0, **kw)


def _neighbours(n: int = 80, d: int = 4, seed: int = 0):
    """D with labels {0, 1}; D' = D with record 0 replaced by one holding the singleton label 2."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (X[:, 0] > 0).astype(np.int64)
    X2, y2 = X.copy(), y.copy()
    X2[0] = -X[0]
    y2[0] = 2
    return (X, y), (X2, y2)


def _shapes(est, X) -> dict:
    """Everything about the released model whose *shape* an attacker sees."""
    out = {"classes_": est.classes_.tolist(), "predict_proba": est.predict_proba(X).shape}
    for name in ("coef_", "intercept_"):
        if hasattr(est, name):
            out[name] = np.shape(getattr(est, name))
    if hasattr(est, "budget_split_"):
        out["budget_split_"] = len(est.budget_split_)
    if hasattr(est, "model_"):
        out["model_"] = est.model_
    return out


def _fit_quiet(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(X, y)


# ---------------------------------------------------------------------------------------------
# 1. the class set
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ALL)
def test_inferred_classes_let_a_singleton_label_change_the_model_shape_and_warn(cls):
    # The attack, on the default: neighbours D, D' are told apart with certainty by the shapes.
    (X, y), (X2, y2) = _neighbours()
    with pytest.warns(PrivacyLeakWarning, match=r"classes=\[") as rec:
        a = _make(cls).fit(X, y)
    assert any("private labels" in str(w.message) for w in rec)
    b = _fit_quiet(_make(cls), X2, y2)
    assert _shapes(a, X) != _shapes(b, X)


@pytest.mark.parametrize("cls", ALL)
def test_declared_classes_make_neighbours_with_a_singleton_label_indistinguishable_by_shape(cls):
    (X, y), (X2, y2) = _neighbours()
    with warnings.catch_warnings():
        # Declaring the classes reads nothing from y: no PrivacyLeakWarning may be raised.
        warnings.simplefilter("error", PrivacyLeakWarning)
        a = _make(cls, classes=[0, 1, 2]).fit(X, y)
        b = _make(cls, classes=[0, 1, 2]).fit(X2, y2)
    assert _shapes(a, X) == _shapes(b, X)
    assert a.classes_.tolist() == [0, 1, 2]
    # One output per declared class although class 2 is absent from D.
    assert a.predict_proba(X).shape == (len(X), 3)
    if cls is not LabelDPClassifier:
        assert a.coef_.shape == (3, X.shape[1]) and a.intercept_.shape == (3,)
    # And the same K enters the mechanism (RR's keep probability, the one-vs-rest split, the SGD model).
    if cls is LabelDPClassifier:
        assert a.privacy_["classes"] == b.privacy_["classes"] == 3
    assert a.epsilon_ == b.epsilon_


@pytest.mark.parametrize("cls", ALL)
def test_declared_classes_are_sorted_like_sklearn(cls):
    (X, y), _ = _neighbours()
    labels = np.array(["cat", "dog"])[y]
    est = _make(cls, classes=["dog", "cat", "bird"]).fit(X, labels)
    assert est.classes_.tolist() == ["bird", "cat", "dog"]
    assert set(est.predict(X)) <= {"bird", "cat", "dog"}
    assert est.get_params()["classes"] == ["dog", "cat", "bird"]  # stored unchanged (sklearn convention)


@pytest.mark.parametrize("cls", ALL)
def test_label_outside_declared_classes_is_a_named_error(cls):
    (X, y), _ = _neighbours()
    y = y.copy()
    y[5] = 7
    with pytest.raises(DataValidationError, match=r"label 7.*classes=\[0, 1\]"):
        _make(cls, classes=[0, 1]).fit(X, y)


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize(("bad", "match"), [([1], "at least 2"), ([0, 1, 1], "duplicate"), ("ab", "list")])
def test_bad_declared_classes_are_refused(cls, bad, match):
    (X, y), _ = _neighbours()
    with pytest.raises(ValueError, match=match):
        _make(cls, classes=bad).fit(X, y)


def test_declared_classes_fix_noisy_sgd_model_kind_and_label_dp_rr_k():
    # K is a mechanism parameter: binary vs multinomial (SGD) and RR's K must come from the declaration.
    (X, y), _ = _neighbours(n=200)
    sgd = _make(NoisySGDClassifier, classes=[0, 1, 2]).fit(X, y)
    assert sgd.model_ == "multinomial" and sgd.coef_.shape[0] == 3
    rr = LabelDPClassifier(epsilon=0.2, classes=[0, 1, 2], random_state=0).fit(X, y)
    assert rr.privacy_["classes"] == 3


def test_rr_prior_model_with_classes_outside_the_declared_ones_is_refused():
    from sklearn.linear_model import LogisticRegression

    (X, y), _ = _neighbours(n=200)
    prior = LogisticRegression().fit(X, np.where(y == 1, 5, 0))  # classes {0, 5}: 5 is not declared
    with pytest.raises(DataValidationError, match="do not map onto classes_"):
        LabelDPClassifier(method="rr-prior", prior_model=prior, classes=[0, 1], random_state=0).fit(X, y)


# ---------------------------------------------------------------------------------------------
# 2. the ledger: reserve before the mechanism
# ---------------------------------------------------------------------------------------------
_PRIVATE_PARTS = {
    OutputPerturbationClassifier: [
        (OutputPerturbationClassifier, "_fit_private"), (perturbation_module, "make_streams"),
    ],
    ObjectivePerturbationClassifier: [
        (ObjectivePerturbationClassifier, "_fit_private"), (perturbation_module, "make_streams"),
    ],
    NoisySGDClassifier: [(NoisySGDClassifier, "_train"), (noisy_sgd_module, "make_streams")],
    LabelDPClassifier: [
        (labeldp_module, "randomized_response"), (labeldp_module, "make_streams"), (LabelDPClassifier, "_lp_2st"),
    ],
}


def _spy(monkeypatch, cls) -> list[str]:
    """Wrap the estimator's private fitting function and its source of randomness; return the call log."""
    calls: list[str] = []
    for owner, name in _PRIVATE_PARTS[cls]:
        original = getattr(owner, name)

        def wrapper(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)
    return calls


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize("as_path", [False, True])
def test_ledger_too_small_refuses_before_the_mechanism_runs(cls, as_path, tmp_path, monkeypatch):
    (X, y), _ = _neighbours(n=200)
    path = tmp_path / "ledger.json"
    ledger = BudgetLedger(path, total_epsilon=1.0, delta=1e-5)
    ledger.spend("earlier analysis", epsilon=0.8)
    before = path.read_bytes()
    calls = _spy(monkeypatch, cls)
    est = _make(cls, epsilon=0.5, classes=[0, 1], ledger=str(path) if as_path else ledger)
    with pytest.raises(BudgetExceededError, match="nothing was reserved"):
        est.fit(X, y)
    assert calls == []  # no private fitting function reached, no generator made: no draw taken
    assert path.read_bytes() == before  # the ledger file is untouched
    assert not hasattr(est, "coef_") and not hasattr(est, "estimator_") and not hasattr(est, "epsilon_")
    with pytest.raises(NotFittedError):  # a refused fit is not a fitted model (nothing to record)
        est.record(ledger)


@pytest.mark.parametrize("cls", ALL)
def test_refused_refit_keeps_the_previous_model_and_its_epsilon_together(cls, tmp_path):
    # A refused fit must not leave a new epsilon_ / classes_ next to the old model (record() would lie).
    (X, y), _ = _neighbours(n=200)
    ledger = BudgetLedger(tmp_path / "l.json", total_epsilon=1.1, delta=1e-5)
    est = _make(cls, epsilon=1.0, classes=[0, 1], ledger=ledger).fit(X, y)
    old = (est.epsilon_, est.classes_.tolist(), est.predict_proba(X))
    est.set_params(epsilon=0.95, classes=[0, 1, 2])  # even composed tightly (noisy SGD), > 1.1 in all
    with pytest.raises(BudgetExceededError):
        est.fit(X, y)
    assert est.epsilon_ == old[0] and est.classes_.tolist() == old[1]
    np.testing.assert_array_equal(est.predict_proba(X), old[2])


@pytest.mark.parametrize("cls", ALL)
def test_ledger_with_room_holds_one_settled_spend_equal_to_epsilon(cls, tmp_path, monkeypatch):
    (X, y), _ = _neighbours(n=200)
    path = tmp_path / "ledger.json"
    ledger = BudgetLedger(path, total_epsilon=5.0, delta=1e-5)
    calls = _spy(monkeypatch, cls)
    est = _make(cls, epsilon=1.0, classes=[0, 1], ledger=ledger).fit(X, y)
    assert calls  # the mechanism did run
    (rec,) = ledger.records
    assert rec["status"] == "settled" and ledger.pending() == []
    assert rec["epsilon"] == pytest.approx(est.epsilon_, rel=1e-6)
    assert ledger.spent() == pytest.approx(est.epsilon_, rel=1e-6)
    assert est.ledger_record_["id"] == rec["id"]
    if cls is NoisySGDClassifier:
        # Same relation and accountant as the ledger: reserved as its event, so runs compose tightly.
        assert rec["event"] is not None
    # Recording the same fit again would count it twice: refused.
    with pytest.raises(ValueError, match="twice"):
        est.record(ledger)
    assert len(ledger.records) == 1


def test_noisy_sgd_reserves_a_pair_when_the_ledger_composes_differently(tmp_path):
    (X, y), _ = _neighbours(n=200)
    ledger = BudgetLedger(tmp_path / "l.json", total_epsilon=5.0, delta=1e-4, relation="replace-one")
    est = _make(NoisySGDClassifier, epsilon=1.0, classes=[0, 1], ledger=ledger).fit(X, y)
    (rec,) = ledger.records
    assert rec["event"] is None and rec["epsilon"] == est.epsilon_ and rec["delta"] == est.delta_


def test_mechanism_failure_settles_the_reservation_conservatively(tmp_path, monkeypatch):
    # A crash inside the mechanism may come after the data was used: the reservation counts.
    (X, y), _ = _neighbours(n=200)
    ledger = BudgetLedger(tmp_path / "l.json", total_epsilon=5.0, delta=1e-5)

    def boom(*args, **kwargs):
        raise RuntimeError("crash mid-mechanism")

    monkeypatch.setattr(OutputPerturbationClassifier, "_fit_private", boom)
    with pytest.raises(RuntimeError, match="crash"):
        OutputPerturbationClassifier(epsilon=1.0, data_norm=1.0, classes=[0, 1], ledger=ledger).fit(X, y)
    (rec,) = ledger.records
    assert rec["status"] == "settled" and rec["epsilon"] == 1.0


@pytest.mark.parametrize("cls", ALL)
def test_invalid_data_is_refused_before_reserving(cls, tmp_path):
    # A fit that fails validation must not cost budget: validation comes before the reservation.
    (X, y), _ = _neighbours(n=200)
    path = tmp_path / "l.json"
    BudgetLedger(path, total_epsilon=5.0, delta=1e-5)
    before = path.read_bytes()
    y = y.copy()
    y[0] = 9
    with pytest.raises(DataValidationError):
        _make(cls, classes=[0, 1], ledger=path).fit(X, y)
    assert path.read_bytes() == before


def test_missing_ledger_path_is_refused(tmp_path):
    (X, y), _ = _neighbours()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _make(OutputPerturbationClassifier, classes=[0, 1], ledger=tmp_path / "none.json").fit(X, y)
    with pytest.raises(TypeError, match="ledger"):
        _make(OutputPerturbationClassifier, classes=[0, 1], ledger=3).fit(X, y)


def test_randomized_response_without_n_classes_warns_that_k_comes_from_the_labels():
    from featuredp.mechanisms.labeldp import randomized_response

    y = np.array([0, 1, 1, 0, 3])  # the single 3 sets K = 4; without it K would be 2
    with pytest.warns(PrivacyLeakWarning, match="n_classes"):
        randomized_response(y, 1.0, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        randomized_response(y, 1.0, n_classes=4, random_state=0)
