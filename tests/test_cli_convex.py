"""Smoke tests of ``featuredp convex``."""

from __future__ import annotations

import json

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
