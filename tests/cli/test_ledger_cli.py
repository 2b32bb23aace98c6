"""``featuredp ledger create|show``: a budget declared from the command line (issue 24)."""

from __future__ import annotations

import json

import pytest

from featuredp.accounting import BudgetLedger, dpsgd_event
from featuredp.cli import main


def _show(path, capsys) -> dict:
    assert main(["ledger", "show", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_create_then_show_an_empty_ledger(tmp_path, capsys):
    path = tmp_path / "budget.json"
    assert main(["ledger", "create", str(path), "--total-epsilon", "8", "--delta", "1e-5"]) == 0
    assert "Created ledger" in capsys.readouterr().out
    ledger = BudgetLedger(path)  # a ledger the library (train/convex/pate --ledger) opens as it is
    assert (ledger.total_epsilon, ledger.delta, ledger.relation, ledger.accountant) == (8.0, 1e-5, "add-remove",
                                                                                         "pld")  # fmt: skip
    shown = _show(path, capsys)
    assert shown["total_epsilon"] == 8.0 and shown["delta"] == 1e-5
    assert shown["spent_epsilon"] == 0.0 and shown["left_epsilon"] == 8.0
    assert shown["records"] == [] and shown["open_reservations"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.json"]  # no lock or temporary file left


def test_create_refuses_to_overwrite_a_ledger_with_spends(tmp_path, capsys):
    # wiping a ledger hands its spent budget out again: not without --overwrite
    path = tmp_path / "budget.json"
    assert main(["ledger", "create", str(path), "--total-epsilon", "4", "--delta", "1e-5"]) == 0
    BudgetLedger(path).spend("published count", epsilon=3.5)
    before = path.read_bytes()
    capsys.readouterr()
    assert main(["ledger", "create", str(path), "--total-epsilon", "4", "--delta", "1e-5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already exists" in err and "--overwrite" in err
    assert path.read_bytes() == before and BudgetLedger(path).remaining() == pytest.approx(0.5)
    assert main(["ledger", "create", str(path), "--total-epsilon", "2", "--delta", "1e-6", "--accountant", "rdp",
                 "--overwrite", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["total_epsilon"] == 2.0 and out["spent_epsilon"] == 0.0 and out["accountant"] == "rdp"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--total-epsilon", "-1", "--delta", "1e-5"], "--total-epsilon must be > 0, got -1.0"),
        (["--total-epsilon", "0", "--delta", "1e-5"], "--total-epsilon must be > 0, got 0.0"),
        (["--total-epsilon", "inf", "--delta", "1e-5"], "--total-epsilon must be finite, got inf"),
        (["--total-epsilon", "nan", "--delta", "1e-5"], "--total-epsilon must not be NaN"),
        (["--total-epsilon", "1", "--delta", "1"], "--delta must be in (0, 1), got 1.0"),
        (["--total-epsilon", "1", "--delta", "0"], "--delta must be in (0, 1), got 0.0"),
    ],
)
def test_bad_values_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, flags, message):
    path = tmp_path / "budget.json"
    assert main(["ledger", "create", str(path), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("featuredp ledger: error:") and message in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_show_lists_spends_reservations_and_what_is_left(tmp_path, capsys):
    path = tmp_path / "budget.json"
    assert main(["ledger", "create", str(path), "--total-epsilon", "8", "--delta", "1e-5"]) == 0
    ledger = BudgetLedger(path)
    ledger.spend("pre-study", event=dpsgd_event(1.0, 0.0625, 150))
    ledger.spend("survey", epsilon=0.5)
    ledger.reserve("cancelled run", epsilon=1.0).cancel()
    pending = ledger.reserve("main run", event=dpsgd_event(1.0, 0.0625, 100))
    capsys.readouterr()
    shown = _show(path, capsys)
    assert [(r["what"], r["status"], r["kind"]) for r in shown["records"]] == [
        ("pre-study", "settled", "event"), ("survey", "settled", "generic"),
        ("cancelled run", "cancelled", "generic"), ("main run", "reserved", "event")]  # fmt: skip
    assert [r["id"] for r in shown["open_reservations"]] == [pending.id]
    # the open reservation counts in full, the cancelled one not at all: the library's own numbers
    assert shown["spent_epsilon"] == pytest.approx(ledger.spent())
    assert shown["left_epsilon"] == pytest.approx(ledger.remaining())
    assert 0 < shown["left_epsilon"] < 8.0 - 0.5
    assert main(["ledger", "show", str(path)]) == 0
    text = capsys.readouterr().out
    for name in ("pre-study", "survey", "cancelled run", "main run", pending.id, "open reservations"):
        assert name in text
    assert f"left           {ledger.remaining():.6g}" in text
    # each event entry states its replace-one ε beside ε (two values of one record's private part); generic: none
    pre, survey = shown["records"][0], shown["records"][1]
    assert pre["replacement_epsilon"] > pre["epsilon"] and survey["replacement_epsilon"] is None
    assert f"{pre['replacement_epsilon']:.4g}" in text


def test_show_a_missing_or_foreign_file_exits_2_and_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "sub" / "nope.json"
    assert main(["ledger", "show", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not exist" in err and "featuredp ledger create" in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    other = tmp_path / "other.json"
    other.write_text('{"not": "a ledger"}')
    assert main(["ledger", "show", str(other)]) == 2
    assert "is not a featuredp budget ledger" in capsys.readouterr().err


def test_a_stale_lock_file_does_not_block_the_cli(tmp_path, capsys):
    # what a crashed process leaves next to the ledger (here holding a long-dead pid) is harmless
    path = tmp_path / "budget.json"
    (tmp_path / "budget.json.lock").write_text("999999999\n")
    assert main(["ledger", "create", str(path), "--total-epsilon", "1", "--delta", "1e-5"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.json"]
