"""``featuredp ledger``: create a privacy-budget ledger and show what it has spent.

Examples::

    featuredp ledger create budget.json --total-epsilon 8 --delta 1e-5
    featuredp train --epsilon 2 --ledger budget.json
    featuredp ledger show budget.json --json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``ledger`` subcommand (``create``, ``show``)."""
    parser = subparsers.add_parser(
        "ledger",
        help="create a privacy-budget ledger, or show its spends and what is left",
        description=__doc__.split("Examples::")[0].strip() + " A ledger is the JSON file that "
        "`train/convex/pate --ledger FILE` reserve their spends in; an overspend is refused before any work "
        "(docs/accounting.md).",
    )
    sub = parser.add_subparsers(dest="ledger_command", metavar="ACTION")
    sub.required = True

    create = sub.add_parser(
        "create", help="declare a new budget (total epsilon at delta) in FILE",
        description="Declare a new, empty budget in FILE (written atomically). An existing FILE is refused "
        "unless --overwrite: replacing a ledger forgets its spends, handing the spent budget out again.",
    )
    create.add_argument("file", metavar="FILE", help="the ledger to write (JSON)")
    create.add_argument("--total-epsilon", type=float, required=True, metavar="E",
                        help="the whole budget's epsilon (> 0)")
    create.add_argument("--delta", type=float, required=True, metavar="D",
                        help="the whole budget's delta in (0, 1), well below 1/N")
    create.add_argument("--relation", choices=("add-remove", "replace-one"), default="add-remove",
                        help="neighbouring relation the spends are composed under (default add-remove)")
    create.add_argument("--accountant", choices=("pld", "rdp"), default="pld",
                        help="how event spends compose: pld (tight, default) or rdp")
    create.add_argument("--overwrite", action="store_true",
                        help="replace an existing FILE (its spends are forgotten)")
    create.add_argument("--json", action="store_true", help="print one JSON object (the new ledger's summary)")
    create.set_defaults(func=run_create)

    show = sub.add_parser(
        "show", help="total epsilon, delta, spent, left and every spend or reservation in FILE",
        description="Show a ledger: its total epsilon and delta, epsilon spent (open reservations count in "
        "full) and left, every record (name, status, epsilon alone) and the open reservations.",
    )
    show.add_argument("file", metavar="FILE", help="the ledger to read")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=run_show)


def run_create(args: argparse.Namespace) -> int:
    """``featuredp ledger create``: validate the flags, then write the new ledger."""
    from featuredp._validate import check_open_unit, check_positive
    from featuredp.accounting.ledger import BudgetLedger

    total = check_positive("--total-epsilon", args.total_epsilon)
    delta = check_open_unit("--delta", args.delta)
    path = Path(args.file)
    if path.is_dir():
        raise ValueError(f"FILE must be a file, got the directory {str(path)!r}")
    try:
        ledger = BudgetLedger.create(path, total, delta, relation=args.relation, accountant=args.accountant,
                                     overwrite=args.overwrite)
    except FileExistsError:
        # FileExistsError is no ValueError: say it in the CLI's one-line form, naming the flag
        raise ValueError(f"ledger {str(path)!r} already exists: give --overwrite to replace it (its spends are "
                         "forgotten), or use it as it is") from None
    _emit(_summary(ledger), as_json=args.json, title=f"Created ledger {path}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    """``featuredp ledger show``: read the ledger (never writes or creates anything)."""
    from featuredp.accounting.ledger import BudgetLedger

    path = Path(args.file)
    if not path.is_file():
        raise FileNotFoundError(f"ledger {str(path)!r} does not exist: create it with featuredp ledger create "
                                f"{path} --total-epsilon E --delta D")
    _emit(_summary(BudgetLedger(path)), as_json=args.json, title=f"Ledger {path}")
    return 0


def _summary(ledger: Any) -> dict[str, Any]:
    records = ledger.records
    spent = ledger._total(records)  # one read for every number: a concurrent spend cannot mix two states
    return {
        "path": str(ledger.path),
        "total_epsilon": ledger.total_epsilon,
        "delta": ledger.delta,
        "relation": ledger.relation,
        "accountant": ledger.accountant,
        "spent_epsilon": None if math.isinf(spent) else spent,
        "left_epsilon": max(0.0, ledger.total_epsilon - spent),
        "records": [_brief(r) for r in records],
        "open_reservations": [_brief(r) for r in records if r.get("status", "settled") == "reserved"],
    }


def _brief(record: dict[str, Any]) -> dict[str, Any]:
    """One record without its event's internals: what a person reads to see where the budget went."""
    return {
        "id": record.get("id"),
        "what": record.get("what"),
        "when": record.get("when"),
        "status": record.get("status", "settled"),  # no status: written before reservations, a settled spend
        "kind": "generic" if record.get("event") is None else "event",
        "epsilon": record.get("epsilon"),
        # the replace-one ε alone (two values of one record's private part); None: a generic spend or an old entry
        "replacement_epsilon": record.get("replacement_epsilon"),
        "delta": record.get("delta"),
        "total_epsilon_after": record.get("total_epsilon_after"),
    }


def _emit(summary: dict[str, Any], *, as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(summary))
        return
    spent = summary["spent_epsilon"]
    lines = [
        title,
        f"  total epsilon  {summary['total_epsilon']:.6g}  (delta={summary['delta']:g}, {summary['relation']}, "
        f"{summary['accountant']})",
        f"  spent          {'inf' if spent is None else f'{spent:.6g}'}",
        f"  left           {summary['left_epsilon']:.6g}",
    ]
    records = summary["records"]
    if records:
        lines.append(f"  records ({len(records)}; epsilon alone at the ledger's delta, the replace-one epsilon "
                     "alone, total after it):")
        for r in records:
            rep = "-" if r.get("replacement_epsilon") is None else f"{r['replacement_epsilon']:.4g}"
            lines.append(f"    {r['when'] or '-':<20}  {r['status']:<9}  {r['epsilon']:>9.4g}  {rep:>9}  "
                         f"{r['total_epsilon_after'] or 0:>9.4g}  {r['what']}")
    else:
        lines.append("  records        none")
    opened = summary["open_reservations"]
    if opened:
        lines.append(f"  open reservations ({len(opened)}; they count in full until settled or cancelled):")
        for r in opened:
            lines.append(f"    {r['id']}  {r['what']}")
    print("\n".join(lines))
