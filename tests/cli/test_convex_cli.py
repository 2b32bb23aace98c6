"""Smoke tests of ``featuredp convex``."""

from __future__ import annotations

import json
import warnings

import pytest

from featuredp.cli import main


def test_convex_cli_fits_and_records_in_ledger(tmp_path, capsys):
    from featuredp.accounting import BudgetLedger

    ledger = tmp_path / "budget.json"
    BudgetLedger(ledger, total_epsilon=2.0, delta=1e-5)
    rc = main(["convex", "--dataset", "breast_cancer", "--method", "output", "--epsilon", "1", "--lam", "1e-3",
               "--ledger", str(ledger), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["epsilon"] == 1.0 and out["delta"] == 0.0
    assert 0.0 <= out["test_accuracy"] <= 1.0 and out["ledger_spent_epsilon"] == 1.0
    # A second spend of 1.5 does not fit the budget of 2: exit 2, one-line error, nothing recorded.
    rc = main(["convex", "--dataset", "breast_cancer", "--method", "rr", "--epsilon", "1.5", "--ledger", str(ledger)])
    assert rc == 2 and "budget" in capsys.readouterr().err
    assert BudgetLedger(ledger).spent() == 1.0


def test_convex_cli_rejects_bad_epsilon(capsys):
    assert main(["convex", "--dataset", "digits", "--method", "objective", "--epsilon", "0"]) == 2
    assert "--epsilon must be > 0" in capsys.readouterr().err


# The attack: an exhausted budget must stop `convex --ledger` *before* training touches the data
# (recording after fit, as before, refused only once the mechanism had run).
_TRAINING = {
    "output": ("featuredp.erm.perturbation", "OutputPerturbationClassifier", "_fit_private"),
    "noisy-sgd": ("featuredp.erm.noisy_sgd", "NoisySGDClassifier", "_train"),
    "rr": ("featuredp.mechanisms.labeldp", None, "randomized_response"),
}


@pytest.mark.parametrize("method", sorted(_TRAINING))
def test_convex_cli_overspend_exits_2_before_training(method, tmp_path, capsys, monkeypatch):
    import importlib

    from featuredp.accounting import BudgetLedger

    path = tmp_path / "budget.json"
    BudgetLedger(path, total_epsilon=1.0, delta=1e-5).spend("earlier release", epsilon=1.0)
    before = path.read_bytes()
    module, cls, name = _TRAINING[method]
    owner = importlib.import_module(module)
    owner = getattr(owner, cls) if cls else owner
    trained: list[str] = []

    def spy(*args, **kwargs):
        trained.append(name)
        raise AssertionError("training ran although the budget is exhausted")

    monkeypatch.setattr(owner, name, spy)
    rc = main(["convex", "--dataset", "breast_cancer", "--method", method, "--epsilon", "0.5", "--epochs", "1",
               "--ledger", str(path)])
    assert rc == 2 and "budget" in capsys.readouterr().err
    assert trained == []
    assert path.read_bytes() == before


@pytest.mark.parametrize(("dataset", "method", "n_classes"), [("digits", "rr", 10), ("breast_cancer", "output", 2)])
def test_convex_cli_declares_the_dataset_class_list(dataset, method, n_classes, monkeypatch, capsys):
    # The class list is the dataset's definition (public), so no PrivacyLeakWarning and a fixed shape.
    from featuredp.erm import OutputPerturbationClassifier
    from featuredp.errors import PrivacyLeakWarning
    from featuredp.mechanisms.labeldp import LabelDPClassifier

    cls = LabelDPClassifier if method == "rr" else OutputPerturbationClassifier
    seen: list = []
    original = cls.fit

    def fit(self, X, y):
        seen.append(self.get_params()["classes"])
        return original(self, X, y)

    monkeypatch.setattr(cls, "fit", fit)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        rc = main(["convex", "--dataset", dataset, "--method", method, "--epsilon", "2", "--json"])
    assert rc == 0 and seen == [list(range(n_classes))]
    json.loads(capsys.readouterr().out)


def test_convex_refuses_label_private_where_it_would_be_ignored(capsys):
    for method in ("objective", "output"):
        assert main(["convex", "--dataset", "digits", "--method", method, "--label-private", "--epsilon", "1"]) == 2
        err = capsys.readouterr().err
        assert "--label-private does not apply to --method " + method in err
    assert main(["convex", "--dataset", "digits", "--method", "objective", "--epsilon", "1e6"]) == 2
    assert "--epsilon must be <= 1000" in capsys.readouterr().err
