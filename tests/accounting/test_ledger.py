"""The persisted budget ledger."""

from __future__ import annotations

import json

import pytest

from featuredp.accounting import BudgetLedger, compose_events, compute_epsilon, dpsgd_event
from featuredp.errors import BudgetExceededError


def test_records_and_tight_composition(tmp_path):
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, 8.0, 1e-5)
    half = dpsgd_event(1.0, 0.0625, 150)
    r1 = ledger.spend("first half", event=half)
    r2 = ledger.spend("second half", event=half)
    whole = compute_epsilon(dpsgd_event(1.0, 0.0625, 300), 1e-5)
    # the ledger composes events tightly: two halves cost the whole run, far less than the naive sum
    assert ledger.spent() == pytest.approx(whole, rel=3e-3)
    assert ledger.spent() < r1["epsilon"] + r2["epsilon"]
    data = json.loads(path.read_text())
    assert [s["what"] for s in data["spends"]] == ["first half", "second half"]
    for s in data["spends"]:
        assert set(s) >= {"what", "when", "event", "epsilon", "delta", "total_epsilon_after"}
    assert ledger.remaining() == pytest.approx(8.0 - ledger.spent())


def test_overspend_raises_and_records_nothing(tmp_path):
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, 8.0, 1e-5)
    ledger.spend("run", event=dpsgd_event(1.0, 0.0625, 300))
    before = path.read_bytes()
    with pytest.raises(BudgetExceededError, match="nothing was spent"):
        ledger.spend("too much", event=dpsgd_event(1.0, 0.0625, 300))
    assert path.read_bytes() == before
    with pytest.raises(BudgetExceededError):
        ledger.spend("generic too much", epsilon=5.0)
    assert path.read_bytes() == before
    assert len(ledger.records) == 1


def test_generic_spends_add_and_take_delta(tmp_path):
    ledger = BudgetLedger(tmp_path / "l.json", 10.0, 1e-5)
    ledger.spend("survey", epsilon=1.0)
    ledger.spend("count", epsilon=0.5, delta=5e-6)
    event = dpsgd_event(2.0, 0.01, 1000)
    ledger.spend("training", event=event)
    # events are accounted at δ − Σδ_i = 5e-6, generic ε add
    expected = 1.5 + compute_epsilon(event, 5e-6)
    assert ledger.spent() == pytest.approx(expected)
    assert ledger.projected(epsilon=0.25) == pytest.approx(expected + 0.25)


def test_reopen_and_shared_between_instances(tmp_path):
    path = tmp_path / "l.json"
    a = BudgetLedger(path, 4.0, 1e-6)
    b = BudgetLedger(path)  # reopen without restating the totals
    a.spend("a", epsilon=1.0)
    b.spend("b", epsilon=1.0)  # b re-reads the file: sees a's spend
    assert a.spent() == pytest.approx(2.0)
    with pytest.raises(BudgetExceededError):
        a.spend("c", epsilon=2.5)
    with pytest.raises(ValueError, match="declared"):
        BudgetLedger(path, 5.0, 1e-6)


def test_event_round_trip_through_file(tmp_path):
    path = tmp_path / "l.json"
    ledger = BudgetLedger(path, 100.0, 1e-5)
    ev = compose_events(dpsgd_event(1.0, 0.1, 10), dpsgd_event(3.0, 1.0, 2))
    ledger.spend("phases", event=ev)
    assert BudgetLedger(path).spent() == pytest.approx(compute_epsilon(ev, 1e-5))


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="total_epsilon"):
        BudgetLedger(tmp_path / "a.json", -1.0, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        BudgetLedger(tmp_path / "a.json", 1.0, 2.0)
    with pytest.raises(ValueError, match="does not exist"):
        BudgetLedger(tmp_path / "missing.json")
    ledger = BudgetLedger(tmp_path / "b.json", 1.0, 1e-5)
    with pytest.raises(ValueError, match="exactly one"):
        ledger.spend("x")
    with pytest.raises(ValueError, match="what"):
        ledger.spend("", epsilon=0.1)
    with pytest.raises(ValueError, match="epsilon"):
        ledger.spend("x", epsilon=-0.1)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        BudgetLedger(tmp_path / "bad.json")
