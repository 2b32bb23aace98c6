"""The ledger's lock file: never left behind, never stale, still exclusive between processes (issue 24)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from featuredp.accounting import BudgetLedger, dpsgd_event

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the ledger locks with POSIX flock")


def lock_path(path):
    """Where the ledger at ``path`` keeps its lock (the documented ``<ledger>.lock``)."""
    return path.with_name(path.name + ".lock")


def _python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_no_lock_file_is_left_after_any_change(tmp_path):
    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, 8.0, 1e-5)
    assert not lock_path(path).exists()
    ledger.spend("survey", epsilon=0.5)
    with ledger.reserve("run", event=dpsgd_event(1.0, 0.0625, 100)):
        assert not lock_path(path).exists()  # a reservation holds no lock while the mechanism runs
    ledger.reserve("cancelled", epsilon=0.1).cancel()
    BudgetLedger.create(tmp_path / "other.json", 1.0, 1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.json", "other.json"]


def test_a_lock_file_left_by_a_killed_holder_does_not_block(tmp_path):
    path = tmp_path / "budget.json"
    BudgetLedger(path, 8.0, 1e-5)
    # a process dies (SIGKILL: no finally, no cleanup) in the middle of a change, holding the lock
    died = _python(f"""
        import os, signal
        from pathlib import Path
        from featuredp.accounting.ledger import _locked
        with _locked(Path({str(path)!r})):
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert died.returncode == -9
    assert lock_path(path).exists()  # what a crash leaves behind ...
    # ... does not block the next process (run with a timeout: a stale lock would hang it)
    spent = _python(f"""
        from featuredp.accounting import BudgetLedger
        ledger = BudgetLedger({str(path)!r})
        ledger.spend("after the crash", epsilon=1.0)
        print(ledger.spent())
    """, timeout=30)
    assert spent.returncode == 0, spent.stderr
    assert float(spent.stdout) == pytest.approx(1.0)
    assert not lock_path(path).exists()  # and is cleaned up by the next change


@pytest.mark.parametrize("content", ["999999999\n", "not a pid", ""])
def test_a_lock_file_with_any_content_does_not_block(tmp_path, content):
    # a dead pid or garbage in <ledger>.lock means nothing: the lock is flock, not the file
    path = tmp_path / "budget.json"
    lock_path(path).write_text(content)
    ledger = BudgetLedger(path, 2.0, 1e-5)
    ledger.spend("count", epsilon=0.5)
    assert ledger.spent() == pytest.approx(0.5)
    assert not lock_path(path).exists()


def test_removing_the_lock_file_keeps_writers_exclusive(tmp_path):
    # the holder unlinks the lock file: a waiter that locked the old file must not write alongside
    # the next holder. Four processes race 25 spends each; a lost update would drop a record.
    path = tmp_path / "budget.json"
    BudgetLedger(path, 1000.0, 1e-5)
    code = textwrap.dedent(f"""
        from featuredp.accounting import BudgetLedger
        ledger = BudgetLedger({str(path)!r})
        for i in range(25):
            ledger.spend("worker spend", epsilon=0.01)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    data = json.loads(path.read_text())
    assert len(data["spends"]) == 100
    assert BudgetLedger(path).spent() == pytest.approx(1.0)
    assert not lock_path(path).exists()


def test_create_refuses_an_existing_ledger_unless_overwrite(tmp_path):
    path = tmp_path / "budget.json"
    BudgetLedger.create(path, 4.0, 1e-5).spend("run", epsilon=3.0)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="already exists"):
        BudgetLedger.create(path, 4.0, 1e-5)
    assert path.read_bytes() == before
    fresh = BudgetLedger.create(path, 2.0, 1e-6, accountant="rdp", overwrite=True)
    assert (fresh.total_epsilon, fresh.delta, fresh.accountant, fresh.spent()) == (2.0, 1e-6, "rdp", 0.0)
    with pytest.raises(ValueError, match="total_epsilon must be > 0, got -1"):
        BudgetLedger.create(tmp_path / "bad.json", -1, 1e-5)
    assert not (tmp_path / "bad.json").exists()
    assert os.listdir(tmp_path) == ["budget.json"]
