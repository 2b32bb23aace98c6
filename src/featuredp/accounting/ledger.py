"""A persisted privacy-budget ledger: every spend recorded, overspending refused.

The ledger is a JSON file::

    {"version": 1, "total_epsilon": 8.0, "delta": 1e-5, "relation": "add-remove", "accountant": "pld",
     "spends": [{"what": "...", "when": "2026-...Z", "event": {...} | null,
                 "epsilon": ..., "delta": ..., "total_epsilon_after": ...}, ...]}

How spends add up (and why the total is not the naive sum):

* spends given as privacy **events** (e.g. ``dpsgd_event(...)``) are composed with each
  other by the tight accountant (PLD by default) — two halves of a run cost what the
  whole run costs, not twice the half;
* spends given only as an (ε_i, δ_i) pair (a generic mechanism) add by basic composition;
* the events together are accounted at δ_E = δ − Σ δ_i, so the ledger's guarantee is
  (ε_E(δ_E) + Σ ε_i, δ) overall.

Writes are atomic (temporary file + rename) and serialised with a lock file, and the file
is re-read before every spend, so several processes can share one ledger. A spend that
would take the total above ``total_epsilon`` raises ``BudgetExceededError`` and records nothing.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from featuredp._io import atomic_write_json
from featuredp._validate import check_nonnegative, check_open_unit, check_positive
from featuredp.accounting.accountant import compute_epsilon
from featuredp.accounting.events import (
    DpEvent,
    check_accountant,
    check_relation,
    compose_events,
    event_from_dict,
    event_to_dict,
)
from featuredp.errors import BudgetExceededError

__all__ = ["BudgetLedger"]

_VERSION = 1


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as fh:
        try:
            import fcntl

            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - non-POSIX: single-process use only
            pass
        yield


class BudgetLedger:
    """A privacy budget of ``total_epsilon`` at ``delta``, persisted in ``path``.

    Opening an existing ledger reads its totals; passing different totals is an error
    (a budget is declared once). ``relation`` and ``accountant`` say how event spends
    are composed.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        total_epsilon: float | None = None,
        delta: float | None = None,
        *,
        relation: str = "add-remove",
        accountant: str = "pld",
    ) -> None:
        self.path = Path(path)
        if total_epsilon is not None:
            total_epsilon = check_positive("total_epsilon", total_epsilon)
        if delta is not None:
            delta = check_open_unit("delta", delta)
        relation = check_relation(relation)
        accountant = check_accountant(accountant)
        with _locked(self.path):
            if self.path.exists():
                data = self._read()
                for name, given in (("total_epsilon", total_epsilon), ("delta", delta)):
                    if given is not None and not math.isclose(given, data[name], rel_tol=1e-12):
                        raise ValueError(
                            f"{name}={given} differs from the ledger's declared {name}={data[name]} in {self.path}; "
                            "a budget is declared once"
                        )
            else:
                if total_epsilon is None or delta is None:
                    raise ValueError(
                        f"ledger {self.path} does not exist: give total_epsilon and delta to create it "
                        f"(got total_epsilon={total_epsilon}, delta={delta})"
                    )
                data = {
                    "version": _VERSION,
                    "total_epsilon": total_epsilon,
                    "delta": delta,
                    "relation": relation,
                    "accountant": accountant,
                    "spends": [],
                }
                atomic_write_json(self.path, data)
        self._data = data

    # ------------------------------------------------------------------ reading
    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"ledger {self.path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != _VERSION or "spends" not in data:
            raise ValueError(f"ledger {self.path} is not a featuredp budget ledger (version {_VERSION})")
        return data

    @property
    def total_epsilon(self) -> float:
        """The declared budget ε."""
        return float(self._data["total_epsilon"])

    @property
    def delta(self) -> float:
        """The declared δ of the whole budget."""
        return float(self._data["delta"])

    @property
    def records(self) -> list[dict[str, Any]]:
        """All spends so far (a copy; re-read from the file)."""
        self._data = self._read()
        return [dict(r) for r in self._data["spends"]]

    def spent(self) -> float:
        """ε spent so far (at the ledger's δ), by the rule in the module docstring."""
        self._data = self._read()
        return self._total(self._data["spends"])

    def remaining(self) -> float:
        """ε still available."""
        return max(0.0, self.total_epsilon - self.spent())

    # ------------------------------------------------------------------ arithmetic
    def _total(self, spends: list[dict[str, Any]]) -> float:
        events = [event_from_dict(r["event"]) for r in spends if r.get("event") is not None]
        generic = [(r["epsilon"], r["delta"]) for r in spends if r.get("event") is None]
        delta_events = self.delta - sum(d for _, d in generic)
        eps = sum(e for e, _ in generic)
        if events:
            if delta_events <= 0:
                return math.inf
            eps += compute_epsilon(
                compose_events(*events),
                delta_events,
                relation=self._data["relation"],
                accountant=self._data["accountant"],
            )
        elif delta_events < 0:
            return math.inf
        return float(eps)

    def projected(self, *, event: DpEvent | None = None, epsilon: float | None = None, delta: float = 0.0) -> float:
        """The total ε the ledger would show after this spend (nothing is recorded)."""
        record = self._record("projection", event, epsilon, delta)
        return self._total([*self._read()["spends"], record])

    def _record(self, what: str, event: DpEvent | None, epsilon: float | None, delta: float) -> dict[str, Any]:
        if not isinstance(what, str) or not what.strip():
            raise ValueError(f"what must be a non-empty description, got {what!r}")
        if (event is None) == (epsilon is None):
            raise ValueError("give exactly one of event (a DpEvent) or epsilon (a generic (epsilon, delta) spend)")
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        if event is not None:
            if not isinstance(event, DpEvent):
                raise TypeError(f"event must be a dp_accounting.DpEvent, got {event!r}")
            if delta:
                raise ValueError(f"delta is set by the ledger for event spends; got delta={delta!r}")
            eps_alone = compute_epsilon(
                event, self.delta, relation=self._data["relation"], accountant=self._data["accountant"]
            )
            return {"what": what, "when": now, "event": event_to_dict(event), "epsilon": eps_alone,
                    "delta": self.delta}
        epsilon = check_nonnegative("epsilon", epsilon)
        delta = check_nonnegative("delta", delta)
        if delta >= self.delta:
            raise ValueError(f"delta={delta!r} of a generic spend must be below the ledger's delta={self.delta}")
        return {"what": what, "when": now, "event": None, "epsilon": epsilon, "delta": delta}

    # ------------------------------------------------------------------ spending
    def spend(
        self, what: str, *, event: DpEvent | None = None, epsilon: float | None = None, delta: float = 0.0
    ) -> dict[str, Any]:
        """Record a spend: a privacy ``event``, or a generic mechanism's (``epsilon``, ``delta``).

        Returns the record. Raises ``BudgetExceededError`` (recording nothing) when the
        total would exceed ``total_epsilon``.
        """
        record = self._record(what, event, epsilon, delta)
        with _locked(self.path):
            data = self._read()
            new_total = self._total([*data["spends"], record])
            if new_total > self.total_epsilon:
                before = self._total(data["spends"])
                raise BudgetExceededError(
                    f"spend {what!r} would take epsilon from {before:.4g} to {new_total:.4g}, above the budget "
                    f"total_epsilon={self.total_epsilon:g} (delta={self.delta:g}) of {self.path}; nothing was spent"
                )
            record["total_epsilon_after"] = new_total
            data["spends"].append(record)
            atomic_write_json(self.path, data)
            self._data = data
        return dict(record)
