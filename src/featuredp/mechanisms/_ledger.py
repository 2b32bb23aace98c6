"""Reserve-before-fit: the ``ledger=`` parameter of the private estimators.

Recording a spend *after* ``fit`` (``est.record(ledger)``) finds an overspend only once the
mechanism has already run on the private data: the refusal comes too late to protect it.
With ``ledger=`` the estimator instead

1. validates its parameters and the data's shape (nothing released),
2. reserves the planned spend in the ledger — ``BudgetExceededError`` here, before any
   mechanism touched the data, and the ledger file is left untouched,
3. runs the mechanism,
4. settles the reservation with what was actually spent.

If the mechanism raises part-way, the reservation is settled at the reserved amount (the
ledger's context manager does this): the data may already have been touched, so the
conservative choice is to count it.

Shared by the sklearn-style private estimators: :mod:`featuredp.mechanisms.labeldp` and :mod:`featuredp.erm`
(which imports it from here, so that the mechanisms never import the estimators built on them).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from featuredp.accounting import BudgetLedger


def open_ledger(ledger: object) -> Any:
    """``None``, a ``BudgetLedger`` (or any object with ``reserve``), or the ledger at a path.

    A path must name an existing ledger: a budget is declared once, with its total, by
    whoever owns it, never created implicitly by a fit.
    """
    if ledger is None or hasattr(ledger, "reserve"):
        return ledger
    if isinstance(ledger, (str, os.PathLike)):
        path = Path(ledger)
        if not path.exists():
            raise FileNotFoundError(
                f"ledger {str(path)!r} does not exist: create it with a total budget first "
                "(featuredp.accounting.BudgetLedger(path, total_epsilon=..., delta=...))"
            )
        return BudgetLedger(path)
    raise TypeError(f"ledger must be None, a path or a featuredp.accounting.BudgetLedger, got {ledger!r}")


def ledger_composes(ledger: Any, relation: str, accountant: str) -> bool:
    """Whether ``ledger`` composes events under this ``relation`` and ``accountant``
    (then an event spend is composed tightly; otherwise only an (ε, δ) pair is meaningful)."""
    # BudgetLedger keeps relation/accountant in its file header; prefer public attributes if it has them.
    data = getattr(ledger, "_data", {})
    ledger_relation = getattr(ledger, "relation", data.get("relation"))
    ledger_accountant = getattr(ledger, "accountant", data.get("accountant"))
    return bool(ledger_relation == relation and ledger_accountant == accountant)


@contextlib.contextmanager
def reserved(ledger: Any, what: str, *, event: Any = None, epsilon: float | None = None,
             delta: float = 0.0) -> Iterator[Any]:
    """Reserve a spend for the duration of the block (yields the reservation, or None without a ledger).

    The caller settles it inside the block once the mechanism has run. Raises
    ``BudgetExceededError`` on entry, recording nothing, if the spend does not fit.
    """
    if ledger is None:
        yield None
        return
    kwargs: dict[str, Any] = {"event": event} if event is not None else {"epsilon": epsilon, "delta": delta}
    with ledger.reserve(what, **kwargs) as reservation:
        yield reservation


def same_ledger(a: Any, b: Any) -> bool:
    """Whether two ledger handles point at the same file (or are the same object)."""
    if a is b:
        return True
    pa, pb = getattr(a, "path", None), getattr(b, "path", None)
    if pa is None or pb is None:
        return False
    try:
        return Path(pa).resolve() == Path(pb).resolve()
    except OSError:  # pragma: no cover - unreadable paths: treat as different
        return False
