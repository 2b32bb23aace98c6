"""Issue #17 defect 13: `featuredp convex --dataset digits --method objective --epsilon 1` is near chance.

Not a bug: the labels, the class order and the row normalisation are right (a huge ε reaches the
non-private accuracy); one-vs-rest gives each of the 10 problems ε/10, and the noise then
outweighs any data signal. The CLI now says so and suggests settings that work.
"""

from __future__ import annotations

import json

from featuredp.cli import main
from featuredp.cli.convex import _data
from featuredp.erm import ObjectivePerturbationClassifier


def test_digits_encoding_is_right_a_huge_epsilon_reaches_non_private_accuracy() -> None:
    Xtr, ytr, Xte, yte, classes = _data("digits")
    assert classes == list(range(10)) and sorted(set(ytr.tolist())) == classes
    est = ObjectivePerturbationClassifier(epsilon=1e4, lam=1e-3, data_norm=1.0, classes=classes, random_state=0)
    assert est.fit(Xtr, ytr).score(Xte, yte) > 0.9


def test_convex_explains_near_chance_accuracy_and_suggests_what_works(capsys) -> None:
    assert main(["convex", "--dataset", "digits", "--method", "objective", "--epsilon", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    note = out["accuracy_note"]
    assert "one-vs-rest splits ε = 1 over 10 classes (0.1 each)" in note and "not a bug" in note
    assert "--method noisy-sgd" in note and "--epsilon" in note
    assert out["test_accuracy"] < 0.5
    assert main(["convex", "--dataset", "digits", "--method", "objective", "--epsilon", "1"]) == 0
    assert "\nnote: one-vs-rest" in capsys.readouterr().out
    # Enough budget: no note; and the suggested setting works.
    assert main(["convex", "--dataset", "digits", "--method", "noisy-sgd", "--epsilon", "1", "--json"]) == 0
    sgd = json.loads(capsys.readouterr().out)
    assert sgd["accuracy_note"] is None and sgd["test_accuracy"] > 0.5
    assert main(["convex", "--dataset", "breast_cancer", "--method", "objective", "--epsilon", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy_note"] is None
