"""A persisted privacy-budget ledger: every spend recorded, overspending refused.

The ledger is a JSON file::

    {"version": 1, "total_epsilon": 8.0, "delta": 1e-5, "relation": "add-remove", "accountant": "pld",
     "spends": [{"id": "...", "what": "...", "when": "2026-...Z", "status": "settled",
                 "event": {...} | null, "epsilon": ..., "replacement_epsilon": ..., "delta": ...,
                 "total_epsilon_after": ...}, ...]}

``replacement_epsilon`` is an event's ε alone for the replace-one question (telling two values of one record's
private part apart) at the ledger's δ, recorded beside ``epsilon`` for the reader; the budget is charged in the
ledger's ``relation`` only. A generic (ε, δ) spend records None (no replace-one ε at the same δ without its mechanism).

How spends add up (and why the total is not the naive sum):

* spends given as privacy **events** (e.g. ``dpsgd_event(...)``) are composed with each
  other by the tight accountant (PLD by default) — two halves of a run cost what the
  whole run costs, not twice the half;
* spends given only as an (ε_i, δ_i) pair (a generic mechanism) add by basic composition;
* the events together are accounted at δ_E = δ − Σ δ_i, so the ledger's guarantee is
  (ε_E(δ_E) + Σ ε_i, δ) overall.

Reserve, then settle. ``spend`` records a spend after the fact; ``reserve`` records it
*before* the mechanism touches the data, so an overspend is refused while the data is
still untouched. A record's ``status`` is

* ``"reserved"`` — pending: counts in full (the mechanism may be running right now);
* ``"settled"`` — spent: counts at the settled amount (the reserved amount is kept under
  ``"reserved"`` for the audit trail);
* ``"cancelled"`` — the mechanism never ran: kept for the audit trail, counts zero.

A reserved event is composed like any other event (tightly, with the other events).
Records without a ``status`` (written before reservations existed) are settled spends.

Writes are atomic (temporary file + rename) and serialised with an ``flock`` on
``<path>.lock`` (removed again after each change; a crashed process's left-over lock file
never blocks, as the kernel drops the lock with its holder), and the file is re-read under
the lock before every change, so several processes can share one ledger
(and a reservation made by one can be settled by another, by its ``id``). A spend or
reservation that would take the total above ``total_epsilon`` raises
``BudgetExceededError`` and records nothing.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import dp_accounting

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

__all__ = ["BudgetLedger", "Reservation"]

# Reservations did not need a new format version: they only add the optional fields ``id`` and
# ``status`` (plus ``reserved`` / ``settled_when`` / ``cancelled_when`` on closed reservations).
# A record without a status reads as a settled spend, so old files load unchanged; and an older
# featuredp reading a new file counts reserved and cancelled records as spends — it over-counts,
# never under-counts, so it stays sound. Bumping the version would only lock old readers out.
_VERSION = 1

RESERVED = "reserved"
SETTLED = "settled"
CANCELLED = "cancelled"
_STATUSES = (RESERVED, SETTLED, CANCELLED)
# the amount fields of a record: what a settle replaces and what the audit trail keeps
_AMOUNT_KEYS = ("event", "epsilon", "replacement_epsilon", "delta", "total_epsilon_after")


def lock_path(path: str | os.PathLike[str]) -> Path:
    """The lock file next to the ledger ``path`` (``<path>.lock``; present only while a process holds it)."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the ledger's exclusive lock; the lock file is removed again on the way out.

    The lock is ``flock`` on ``<path>.lock``, never the file's existence or content: the kernel
    releases it when its holder exits, however it dies, so a lock file left by a killed process (or
    one holding anything, e.g. a dead pid) never blocks. The holder unlinks the file before
    unlocking, so a normal exit leaves nothing behind. A waiter may then hold a lock on the unlinked
    file, so after locking it checks that the path still names the file it locked, and starts over
    if not: whoever holds the lock on the file at ``<path>.lock`` is the only holder.
    """
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: no lock, single-process use only
        yield
        return
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                current = os.stat(lock)
            except FileNotFoundError:
                current = None
        except BaseException:
            os.close(fd)
            raise
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # the holder before us removed this file: lock the new one
    try:
        yield
    finally:
        # unlink while still holding the lock (see above), then release it by closing
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


def _new_data(total_epsilon: float, delta: float, relation: str, accountant: str) -> dict[str, Any]:
    return {"version": _VERSION, "total_epsilon": total_epsilon, "delta": delta, "relation": relation,
            "accountant": accountant, "spends": []}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _status(record: dict[str, Any]) -> str:
    # no status: written before reservations existed, i.e. an immediate (settled) spend
    return str(record.get("status", SETTLED))


def _amount(record: dict[str, Any]) -> str:
    """The amount of one record, for error messages."""
    if record.get("event") is not None:
        return f"an event (epsilon={record['epsilon']:.4g} alone at delta={record['delta']:g})"
    return f"(epsilon={record['epsilon']:.4g}, delta={record['delta']:g})"


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
                data = _new_data(total_epsilon, delta, relation, accountant)
                atomic_write_json(self.path, data)
        self._data = data

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        total_epsilon: float,
        delta: float,
        *,
        relation: str = "add-remove",
        accountant: str = "pld",
        overwrite: bool = False,
    ) -> BudgetLedger:
        """Declare a new, empty budget in ``path`` (written atomically) and open it.

        Unlike the constructor, which opens an existing ledger, this refuses one that exists
        (``FileExistsError``) unless ``overwrite``: replacing a ledger forgets every spend in it,
        which silently hands the spent budget out again.
        """
        path = Path(path)
        total_epsilon = check_positive("total_epsilon", total_epsilon)
        delta = check_open_unit("delta", delta)
        relation = check_relation(relation)
        accountant = check_accountant(accountant)
        with _locked(path):
            if path.exists() and not overwrite:
                raise FileExistsError(f"ledger {path} already exists; replacing it forgets every spend in it "
                                      "(overwrite=True to do so)")
            atomic_write_json(path, _new_data(total_epsilon, delta, relation, accountant))
        return cls(path)

    # ------------------------------------------------------------------ reading
    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"ledger {self.path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != _VERSION or "spends" not in data:
            raise ValueError(f"ledger {self.path} is not a featuredp budget ledger (version {_VERSION})")
        for record in data["spends"]:
            # an unknown status could be read as "counts" or "does not count"; refuse to guess
            if _status(record) not in _STATUSES:
                raise ValueError(
                    f"ledger {self.path}: record {record.get('what')!r} has unknown status {record.get('status')!r} "
                    f"(expected one of {', '.join(_STATUSES)})"
                )
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
    def relation(self) -> str:
        """The neighbouring relation under which event spends are composed."""
        return str(self._data["relation"])

    @property
    def accountant(self) -> str:
        """The accountant (``"pld"`` or ``"rdp"``) that composes event spends."""
        return str(self._data["accountant"])

    @property
    def records(self) -> list[dict[str, Any]]:
        """All records so far, cancelled reservations included (a copy; re-read from the file)."""
        self._data = self._read()
        return [dict(r) for r in self._data["spends"]]

    def pending(self) -> list[dict[str, Any]]:
        """The reserved-but-unsettled records (copies; re-read from the file).

        Each still counts in full. One left behind by a crashed process stays pending until
        someone settles or cancels it (``ledger.reservation(record["id"])``).
        """
        return [r for r in self.records if _status(r) == RESERVED]

    def spent(self) -> float:
        """ε spent so far (at the ledger's δ), pending reservations included, by the rule in the module docstring."""
        self._data = self._read()
        return self._total(self._data["spends"])

    def remaining(self) -> float:
        """ε still available (pending reservations are not available)."""
        return max(0.0, self.total_epsilon - self.spent())

    # ------------------------------------------------------------------ arithmetic
    def _total(self, spends: list[dict[str, Any]]) -> float:
        # reserved records count in full (the mechanism may have run already), cancelled ones not at all
        counted = [r for r in spends if _status(r) != CANCELLED]
        events = [event_from_dict(r["event"]) for r in counted if r.get("event") is not None]
        generic = [(r["epsilon"], r["delta"]) for r in counted if r.get("event") is None]
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
        now = _now()
        if event is not None:
            if not isinstance(event, dp_accounting.DpEvent):  # DpEvent is an alias: isinstance needs the class
                raise TypeError(f"event must be a dp_accounting.DpEvent, got {event!r}")
            if delta:
                raise ValueError(f"delta is set by the ledger for event spends; got delta={delta!r}")
            eps_alone = compute_epsilon(
                event, self.delta, relation=self._data["relation"], accountant=self._data["accountant"]
            )
            return {"what": what, "when": now, "event": event_to_dict(event), "epsilon": eps_alone,
                    "replacement_epsilon": self._replacement(event, eps_alone), "delta": self.delta}
        epsilon = check_nonnegative("epsilon", epsilon)
        delta = check_nonnegative("delta", delta)
        if delta >= self.delta:
            raise ValueError(f"delta={delta!r} of a generic spend must be below the ledger's delta={self.delta}")
        # an (ε, δ) pair without its mechanism has no replace-one ε at the same δ (group privacy changes δ)
        return {"what": what, "when": now, "event": None, "epsilon": epsilon, "replacement_epsilon": None,
                "delta": delta}

    def _replacement(self, event: DpEvent, epsilon: float) -> float | None:
        """The event's replace-one ε alone at the ledger's δ (two values of one record's private part): recorded
        beside ε for the reader; the budget is charged in the ledger's own relation. PLD where RDP has no
        replace-one bound (Poisson sampling); None where no backend has one (a tuned run under Poisson sampling)."""
        if self._data["relation"] == "replace-one":
            return epsilon
        for accountant in dict.fromkeys((self._data["accountant"], "pld")):
            try:
                return compute_epsilon(event, self.delta, relation="replace-one", accountant=accountant)
            except ValueError:  # RDP under Poisson sampling: PLD has it; a tuned run (RDP only): none
                continue
        return None

    # ------------------------------------------------------------------ spending
    def spend(
        self, what: str, *, event: DpEvent | None = None, epsilon: float | None = None, delta: float = 0.0
    ) -> dict[str, Any]:
        """Record a spend: a privacy ``event``, or a generic mechanism's (``epsilon``, ``delta``).

        Returns the record (status ``"settled"``). Raises ``BudgetExceededError`` (recording
        nothing) when the total would exceed ``total_epsilon``. Prefer :meth:`reserve`, which
        refuses an overspend *before* the mechanism runs on the data.
        """
        return self._append(self._record(what, event, epsilon, delta), SETTLED, "spend", "nothing was spent")

    def reserve(
        self, what: str, *, event: DpEvent | None = None, epsilon: float | None = None, delta: float = 0.0
    ) -> Reservation:
        """Reserve a spend before the mechanism runs: a privacy ``event`` or a generic (``epsilon``, ``delta``).

        The reservation is recorded at once (status ``"reserved"``) and counts in full in
        :meth:`spent`, :meth:`remaining`, :meth:`projected` and every later spend or
        reservation, in this process and any other sharing the file. Raises
        ``BudgetExceededError``, recording nothing, when the total would exceed
        ``total_epsilon``. Close it with :meth:`Reservation.settle` (what was actually
        spent) or :meth:`Reservation.cancel` (the data was never used), or use it as a
        context manager, which settles it at the reserved amount if the block leaves it open.
        """
        record = self._append(self._record(what, event, epsilon, delta), RESERVED, "reserving", "nothing was reserved")
        return Reservation(self, record)

    def reservation(self, reservation_id: str) -> Reservation:
        """The reservation with this id (e.g. one made by another process), in whatever status it now has."""
        self._data = self._read()
        return Reservation(self, self._find(self._data, reservation_id)[1])

    def _append(self, record: dict[str, Any], status: str, verb: str, nothing: str) -> dict[str, Any]:
        # the record (with its ε alone, the slow part) is built before taking the lock; the check
        # and the write happen under the lock on a fresh read, so no concurrent writer slips between
        record = {"id": uuid.uuid4().hex, **record, "status": status}
        with _locked(self.path):
            data = self._read()
            new_total = self._total([*data["spends"], record])
            if new_total > self.total_epsilon:
                before = self._total(data["spends"])
                raise BudgetExceededError(
                    f"{verb} {record['what']!r} of {_amount(record)} would take epsilon from {before:.4g} to "
                    f"{new_total:.4g}, above the budget total_epsilon={self.total_epsilon:g} (delta={self.delta:g}) "
                    f"of {self.path}; {nothing}"
                )
            record["total_epsilon_after"] = new_total
            data["spends"].append(record)
            atomic_write_json(self.path, data)
            self._data = data
        return dict(record)

    def _find(self, data: dict[str, Any], reservation_id: str) -> tuple[int, dict[str, Any]]:
        for i, record in enumerate(data["spends"]):
            if record.get("id") == reservation_id:
                return i, record
        raise ValueError(f"no reservation with id {reservation_id!r} in ledger {self.path}")

    def _close(self, reservation_id: str, status: str, settled: dict[str, Any] | None,
               *, only_if_reserved: bool = False) -> dict[str, Any] | None:
        """Settle (``settled`` = the new amounts, or None for the reserved ones) or cancel a reservation.

        Under the lock, on a fresh read: the record is looked up by id, so any process may close it.
        With ``only_if_reserved`` an already closed reservation is left alone (returns None).
        """
        with _locked(self.path):
            data = self._read()
            index, record = self._find(data, reservation_id)
            current = _status(record)
            if current != RESERVED:
                if only_if_reserved:
                    return None
                raise ValueError(
                    f"reservation {reservation_id} ({record.get('what')!r}) in ledger {self.path} is already "
                    f"{current}; a reservation is settled or cancelled once"
                )
            new = {**record, "status": status, f"{status}_when": _now(),
                   "reserved": {k: record.get(k) for k in _AMOUNT_KEYS}}
            if settled is not None:
                new.update({k: settled[k] for k in ("event", "epsilon", "replacement_epsilon", "delta")})
            others = data["spends"][:index] + data["spends"][index + 1:]
            new_total = self._total([*others, new])
            # Settling at the reserved amount (settled None) or cancelling cannot raise the total, and
            # must not fail: it is what __exit__ does after a crash. A different amount — possibly more
            # than reserved — is checked against the budget like a new spend.
            if settled is not None and new_total > self.total_epsilon:
                before = self._total(data["spends"])
                raise BudgetExceededError(
                    f"settling reservation {reservation_id} ({record['what']!r}) at {_amount(new)} instead of the "
                    f"reserved {_amount(record)} would take epsilon from {before:.4g} to {new_total:.4g}, above the "
                    f"budget total_epsilon={self.total_epsilon:g} (delta={self.delta:g}) of {self.path}; the "
                    "reservation is unchanged and still counts in full (settle() with no arguments records it "
                    "at the reserved amount)"
                )
            new["total_epsilon_after"] = new_total
            data["spends"][index] = new
            atomic_write_json(self.path, data)
            self._data = data
        return dict(new)


class Reservation:
    """A pending spend in a :class:`BudgetLedger`, returned by :meth:`BudgetLedger.reserve`.

    Settle it once the mechanism has run (:meth:`settle`), or cancel it if the mechanism
    never touched the data (:meth:`cancel`); until then it counts in full. As a context
    manager it settles at the reserved amount when the block leaves it open — on normal
    exit and on an exception alike (a crash may come after the data was used, so the
    conservative choice is to count it).
    """

    def __init__(self, ledger: BudgetLedger, record: dict[str, Any]) -> None:
        self.ledger = ledger
        self.id: str = record["id"]
        self.what: str = record["what"]
        self._record = dict(record)

    @property
    def record(self) -> dict[str, Any]:
        """The record as this object last wrote or read it (a copy)."""
        return dict(self._record)

    @property
    def status(self) -> str:
        """``"reserved"``, ``"settled"`` or ``"cancelled"``, re-read from the ledger file."""
        self._record = self.ledger._find(self.ledger._read(), self.id)[1]
        return _status(self._record)

    def settle(
        self, *, event: DpEvent | None = None, epsilon: float | None = None, delta: float = 0.0
    ) -> dict[str, Any]:
        """Replace the reserved amount by what was actually spent; returns the settled record.

        With no arguments, settles at the reserved amount. Otherwise give an ``event`` or an
        (``epsilon``, ``delta``) pair, as for :meth:`BudgetLedger.spend` — e.g. an event with
        fewer steps after an early stop. An amount larger than reserved is allowed only if
        the total still fits the budget; otherwise ``BudgetExceededError`` is raised and the
        reservation stays as it was (still counted in full). Raises ``ValueError`` if the
        reservation was already settled or cancelled (by anyone sharing the file).
        """
        settled = None
        if event is not None or epsilon is not None or delta:
            # built (ε alone computed) before the ledger takes its lock
            settled = self.ledger._record(self.what, event, epsilon, delta)
        record = self.ledger._close(self.id, SETTLED, settled)
        assert record is not None
        self._record = record
        return dict(record)

    def cancel(self) -> None:
        """Release the reservation: the mechanism never touched the data.

        The record stays in the file with status ``"cancelled"`` (audit trail) and counts
        zero. Only cancel when no private data was used — otherwise settle. Raises
        ``ValueError`` if the reservation was already settled or cancelled.
        """
        record = self.ledger._close(self.id, CANCELLED, None)
        assert record is not None
        self._record = record

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Open at exit (normal or not): settle at the reserved amount. On an exception the
        # mechanism may already have used the data, so counting it is the conservative choice.
        # A reservation settled or cancelled inside the block (or by another process) is left alone.
        record = self.ledger._close(self.id, SETTLED, None, only_if_reserved=True)
        if record is not None:
            self._record = record

    def __repr__(self) -> str:
        return f"Reservation(id={self.id!r}, what={self.what!r}, ledger={str(self.ledger.path)!r})"
