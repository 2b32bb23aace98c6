"""The persisted budget ledger."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

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


# ---------------------------------------------------------------------------------------- reserve / settle


def test_reserve_past_budget_raises_and_file_is_byte_identical(tmp_path):
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, 8.0, 1e-5)
    run = dpsgd_event(1.0, 0.0625, 300)
    ledger.spend("run", event=run)
    before = path.read_bytes()
    # the message names the ledger, the amount asked for and the totals before/after
    pattern = r"(?s)reserving 'again' of an event \(epsilon=.*from .* to .*above the budget.*nothing was reserved"
    with pytest.raises(BudgetExceededError, match=pattern) as info:
        ledger.reserve("again", event=run)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    with pytest.raises(BudgetExceededError, match=r"\(epsilon=5, delta=0\)"):
        ledger.reserve("generic", epsilon=5.0)
    assert path.read_bytes() == before
    assert ledger.pending() == []
    assert len(ledger.records) == 1


def test_reservation_counts_and_blocks_a_concurrent_spend(tmp_path):
    path = tmp_path / "l.json"
    a = BudgetLedger(path, 4.0, 1e-6)
    b = BudgetLedger(path)  # a second handle on the same file, as another process would have
    r = a.reserve("long job", epsilon=3.0)
    from featuredp.accounting import Reservation  # exported (imported here so old code fails test by test)

    assert isinstance(r, Reservation) and isinstance(r.id, str) and r.id
    # the pending reservation counts in full everywhere, seen through the other handle too
    assert b.spent() == pytest.approx(3.0)
    assert b.remaining() == pytest.approx(1.0)
    assert b.projected(epsilon=0.5) == pytest.approx(3.5)
    before = path.read_bytes()
    with pytest.raises(BudgetExceededError):
        b.spend("would fit without the reservation", epsilon=1.5)
    with pytest.raises(BudgetExceededError):
        b.reserve("same", epsilon=1.5)
    assert path.read_bytes() == before
    assert [p["id"] for p in b.pending()] == [r.id]
    assert b.pending()[0]["status"] == "reserved"
    b.spend("fits next to it", epsilon=1.0)
    assert a.spent() == pytest.approx(4.0)


def test_racing_reservations_never_overspend(tmp_path):
    path = tmp_path / "l.json"
    BudgetLedger(path, 4.0, 1e-6)
    won, lost = [], []

    def worker(i: int) -> None:
        ledger = BudgetLedger(path)  # one handle per thread: only the file lock serialises them
        try:
            won.append(ledger.reserve(f"job {i}", epsilon=1.0))
        except BudgetExceededError:
            lost.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(won), len(lost)) == (4, 4)
    ledger = BudgetLedger(path)
    assert len(ledger.pending()) == 4 and len(ledger.records) == 4
    assert ledger.spent() == pytest.approx(4.0)


def test_settle_with_fewer_steps_is_composed_tightly(tmp_path):
    path = tmp_path / "l.json"
    ledger = BudgetLedger(path, 20.0, 1e-5)
    pre = dpsgd_event(1.0, 0.0625, 100)
    ledger.spend("pre-study", event=pre)
    ledger.spend("survey", epsilon=0.5, delta=2e-6)
    r = ledger.reserve("training: up to 400 steps", event=dpsgd_event(1.0, 0.0625, 400))
    # a reserved event is composed with the other events (tight), at delta - sum of generic deltas
    with_reservation = 0.5 + compute_epsilon(compose_events(pre, dpsgd_event(1.0, 0.0625, 400)), 8e-6)
    assert ledger.spent() == pytest.approx(with_reservation, rel=1e-9)
    assert ledger.spent() < 0.5 + ledger.records[0]["epsilon"] + r.record["epsilon"]
    reserved_total, reserved_eps = ledger.spent(), r.record["epsilon"]

    settled = r.settle(event=dpsgd_event(1.0, 0.0625, 150))  # early stop after 150 private steps
    expected = 0.5 + compute_epsilon(compose_events(pre, dpsgd_event(1.0, 0.0625, 150)), 8e-6)
    assert ledger.spent() == pytest.approx(expected, rel=1e-9)
    assert ledger.spent() < reserved_total
    # tight: pre-study (100) + training (150) cost one 250-step run
    assert ledger.spent() == pytest.approx(0.5 + compute_epsilon(dpsgd_event(1.0, 0.0625, 250), 8e-6), rel=3e-3)
    assert settled["status"] == "settled" and settled["id"] == r.id
    assert settled["total_epsilon_after"] == pytest.approx(expected, rel=1e-9)
    assert (settled["event"]["count"], settled["reserved"]["event"]["count"]) == (150, 400)  # audit trail
    assert settled["reserved"]["epsilon"] == reserved_eps
    assert settled["reserved"]["total_epsilon_after"] == pytest.approx(reserved_total)
    on_file = json.loads(path.read_text())["spends"]
    assert [s["status"] for s in on_file] == ["settled", "settled", "settled"]
    assert on_file[2] == settled
    assert ledger.pending() == []


def test_settle_without_arguments_keeps_the_reserved_amount(tmp_path):
    ledger = BudgetLedger(tmp_path / "l.json", 4.0, 1e-6)
    r = ledger.reserve("count", epsilon=1.25, delta=1e-7)
    record = r.settle()
    assert (record["epsilon"], record["delta"], record["status"]) == (1.25, 1e-7, "settled")
    assert ledger.spent() == pytest.approx(1.25)


def test_cancel_releases_and_keeps_the_audit_record(tmp_path):
    path = tmp_path / "l.json"
    ledger = BudgetLedger(path, 8.0, 1e-5)
    ledger.spend("earlier", epsilon=0.5)
    r = ledger.reserve("never ran", event=dpsgd_event(1.0, 0.0625, 300))  # ε ≈ 7.4: nearly all the budget
    assert ledger.spent() > 7.5
    assert r.cancel() is None
    assert ledger.spent() == pytest.approx(0.5)
    assert ledger.pending() == []
    cancelled = ledger.records[1]
    assert (cancelled["id"], cancelled["status"], cancelled["what"]) == (r.id, "cancelled", "never ran")
    assert cancelled["event"] is not None and "cancelled_when" in cancelled
    assert r.status == "cancelled"
    # the released budget is really available again: a spend that needs it now fits
    ledger.spend("now fits", event=dpsgd_event(1.0, 0.0625, 300))
    before = path.read_bytes()
    with pytest.raises(ValueError, match="already cancelled"):
        r.cancel()
    with pytest.raises(ValueError, match="already cancelled"):
        r.settle()
    assert path.read_bytes() == before


def test_double_settle_errors_from_any_handle(tmp_path):
    path = tmp_path / "l.json"
    ledger = BudgetLedger(path, 4.0, 1e-6)
    r = ledger.reserve("job", epsilon=2.0)
    r.settle(epsilon=1.0)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=rf"(?s)reservation {r.id}.*already settled"):
        r.settle(epsilon=0.5)  # must not lower a settled spend
    with pytest.raises(ValueError, match="already settled"):
        BudgetLedger(path).reservation(r.id).settle()
    with pytest.raises(ValueError, match="already settled"):
        r.cancel()  # nor release it
    assert path.read_bytes() == before
    assert ledger.spent() == pytest.approx(1.0)


def test_settle_above_the_reservation_must_fit_the_budget(tmp_path):
    path = tmp_path / "l.json"
    ledger = BudgetLedger(path, 4.0, 1e-6)
    ledger.spend("other", epsilon=1.0)
    r = ledger.reserve("job", epsilon=1.0)
    before = path.read_bytes()
    with pytest.raises(BudgetExceededError, match=r"(?s)\(epsilon=3.5, delta=0\).*from 2 to 4.5.*unchanged") as info:
        r.settle(epsilon=3.5)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before  # the reservation is kept exactly as it was
    assert r.status == "reserved" and ledger.spent() == pytest.approx(2.0)
    # more than reserved but within the budget: recorded as spent
    record = r.settle(epsilon=2.5)
    assert record["epsilon"] == 2.5 and record["reserved"]["epsilon"] == 1.0
    assert ledger.spent() == pytest.approx(3.5)


def test_context_manager_settles_at_the_reserved_amount_on_an_exception(tmp_path):
    path = tmp_path / "l.json"
    ledger = BudgetLedger(path, 8.0, 1e-5)
    event = dpsgd_event(1.0, 0.0625, 200)
    # the exception is not swallowed
    with pytest.raises(RuntimeError, match="crashed mid-run"), ledger.reserve("training", event=event) as r:
        assert ledger.pending()[0]["id"] == r.id
        raise RuntimeError("crashed mid-run")
    record = ledger.records[0]
    assert record["status"] == "settled" and record["event"] == record["reserved"]["event"]
    assert ledger.pending() == []
    assert ledger.spent() == pytest.approx(compute_epsilon(event, 1e-5))


def test_context_manager_normal_exit_and_explicit_close(tmp_path):
    ledger = BudgetLedger(tmp_path / "l.json", 8.0, 1e-6)
    with ledger.reserve("left open", epsilon=1.0):
        pass
    with ledger.reserve("settled lower", epsilon=2.0) as r:
        r.settle(epsilon=0.5)
    with ledger.reserve("cancelled", epsilon=3.0) as r:
        r.cancel()
    # __exit__ leaves a reservation closed inside the block alone
    assert [(x["status"], x["epsilon"]) for x in ledger.records] == [
        ("settled", 1.0), ("settled", 0.5), ("cancelled", 3.0)
    ]
    assert ledger.spent() == pytest.approx(1.5)


def test_old_format_ledger_loads_and_counts(tmp_path):
    path = tmp_path / "old.json"
    event = dpsgd_event(1.0, 0.0625, 150)
    old = {  # as written before reservations existed: records have no id and no status
        "version": 1, "total_epsilon": 8.0, "delta": 1e-5, "relation": "add-remove", "accountant": "pld",
        "spends": [
            {"what": "old run", "when": "2026-01-01T00:00:00Z", "event": json.loads(json.dumps(
                BudgetLedger(tmp_path / "scratch.json", 8.0, 1e-5).spend("x", event=event)["event"])),
             "epsilon": 2.0, "delta": 1e-5, "total_epsilon_after": 2.0},
            {"what": "old survey", "when": "2026-01-01T00:00:00Z", "event": None, "epsilon": 0.5,
             "delta": 1e-6, "total_epsilon_after": 2.5},
        ],
    }
    path.write_text(json.dumps(old))
    ledger = BudgetLedger(path)
    expected = 0.5 + compute_epsilon(event, 9e-6)
    assert ledger.spent() == pytest.approx(expected)  # both old records count as settled spends
    assert ledger.pending() == []
    r = ledger.reserve("new", event=event)  # composes with the old event record
    assert ledger.spent() == pytest.approx(0.5 + compute_epsilon(compose_events(event, event), 9e-6))
    r.cancel()
    data = json.loads(path.read_text())
    assert data["version"] == 1
    assert data["spends"][:2] == old["spends"]  # old records are left exactly as they were


def test_reservation_survives_reopening_in_another_process(tmp_path):
    path = tmp_path / "l.json"
    BudgetLedger(path, 4.0, 1e-6)
    code = (
        "import sys; from featuredp.accounting import BudgetLedger; "
        "print(BudgetLedger(sys.argv[1]).reserve('other process', epsilon=3.0).id)"
    )
    rid = subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True,
                         text=True).stdout.strip()
    ledger = BudgetLedger(path)
    assert [p["id"] for p in ledger.pending()] == [rid]
    assert ledger.spent() == pytest.approx(3.0)
    with pytest.raises(BudgetExceededError):
        ledger.spend("too much while it is pending", epsilon=1.5)
    r = ledger.reservation(rid)
    assert (r.id, r.what, r.status) == (rid, "other process", "reserved")
    r.settle(epsilon=0.75)
    reopened = BudgetLedger(path)
    assert reopened.spent() == pytest.approx(0.75)
    assert reopened.reservation(rid).status == "settled"
    with pytest.raises(ValueError, match=rf"no reservation with id 'nope' in ledger {path}"):
        reopened.reservation("nope")


def test_reserve_bad_input_and_unknown_status(tmp_path):
    path = tmp_path / "l.json"
    ledger = BudgetLedger(path, 1.0, 1e-5)
    with pytest.raises(ValueError, match="exactly one"):
        ledger.reserve("x")
    with pytest.raises(ValueError, match="what"):
        ledger.reserve("", epsilon=0.1)
    with pytest.raises(ValueError, match="delta is set by the ledger"):
        ledger.reserve("x", event=dpsgd_event(1.0, 0.1, 10), delta=1e-6)
    r = ledger.reserve("x", epsilon=0.1)
    with pytest.raises(ValueError, match="exactly one"):
        r.settle(delta=1e-6)  # a delta alone is not an amount
    with pytest.raises(ValueError, match="epsilon"):
        r.settle(epsilon=-1.0)
    assert r.status == "reserved"
    data = json.loads(path.read_text())
    data["spends"][0]["status"] = "maybe"  # a tampered or future status: refuse to guess whether it counts
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unknown status 'maybe'"):
        ledger.spent()
