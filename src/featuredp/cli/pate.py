"""``featuredp pate``: PATE — teachers on disjoint private parts, noisy vote aggregation, a student.

Examples::

    featuredp pate --dataset adult --epsilon 1 --json
    featuredp pate --dataset adult --teachers 250 --epsilon 1 --queries 200 --json
    featuredp pate --dataset adult --epsilon 2 --queries 500 --mechanism lnmax
    featuredp pate --dataset adult --epsilon 4 --queries 1000 --threshold 180
    featuredp pate --dataset adult --compare --epsilons 0.5,1,2,4 --queries 100,1000 --diagnostics --out results/pate
    featuredp pate --data people.csv --label income --teachers 50 --epsilon 1 --json

The training split is cut (by --public-seed, a permutation of row indices) into private teacher
data (80%) and a public query pool (20%: inputs public, labels treated as unknown and used only to
score the aggregated labels). The first --queries pool inputs are asked (default 1000, or the whole
pool if smaller); the test split is for evaluation only. delta defaults to min(1e-5, 1/(2N)),
N = private records. Everything printed or written is covered by epsilon unless --diagnostics asks
for the noiseless numbers (marked "not covered by epsilon").

Your own table (--data FILE --label COL): the same split of its training rows (--test-data, else a
fixed 80/20 split of the file, gives the test split). PATE protects whole records, every column and
the label, so --private is optional (default: the label). Statistics the loader computes from the
file (bounds, categories, classes) are outside epsilon: give them public in a --schema.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from featuredp.cli._data_args import add_data_arguments, dataset_name, resolve_data
from featuredp.cli._flags import number_list, whole_number

DATASETS = ("adult", "census-income", "fashion-mnist")
#: public inputs a single run labels when --queries is not given (capped at the public pool). A fixed
#: number rather than the whole pool because ε is split over the asked queries: every extra query adds
#: noise to all the others. 1000 is the larger of --compare's default query counts (100, 1000).
DEFAULT_QUERIES = 1000
#: library parameter → flag (errors raised inside the library name the flag the user typed)
PATE_FLAGS = {
    "n_teachers": "--teachers",
    "teachers": "--teachers",
    "epsilon": "--epsilon",
    "delta": "--delta",
    "queries": "--queries",
    "threshold": "--threshold",
    "mechanism": "--mechanism",
    "public_seed": "--public-seed",
}


def _whole_numbers(text: str) -> list[int]:
    try:
        values = [whole_number(v.strip()) for v in text.split(",") if v.strip()]
    except argparse.ArgumentTypeError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}")
    return values



def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pate`` subcommand."""
    p = subparsers.add_parser(
        "pate",
        help="PATE: teachers on disjoint private parts, GNMax/LNMax vote aggregation, a student on public inputs",
        description=__doc__.split("Examples::")[0].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --dat, --data: never silently taken as --dataset
    )
    p.add_argument("--dataset", type=dataset_name, choices=DATASETS, default="adult",
                   help="dataset (default adult; your own file: --data FILE)")
    p.add_argument("--teachers", type=whole_number, default=250, help="number of teachers (default 250)")
    p.add_argument("--epsilon", type=float, default=None, help="privacy epsilon of all queries together (> 0)")
    p.add_argument("--queries", type=_whole_numbers, default=None,
                   help=f"public inputs to label (one number, default {DEFAULT_QUERIES} or the whole public pool "
                        "if smaller; with --compare a list, default 100,1000)")
    p.add_argument("--delta", type=float, default=None,
                   help="delta (default min(1e-5, 1/(2N)), N = private records; --compare: 1e-5)")
    p.add_argument("--mechanism", choices=("gnmax", "lnmax"), default="gnmax",
                   help="gnmax (Gaussian noise, default) or lnmax (Laplace noise, pure epsilon per query)")
    p.add_argument("--threshold", type=float, default=None,
                   help="Confident-GNMax: answer a query only if its top count + N(0, sigma1^2) >= T "
                        "(sigma1 = 5 x sigma; every asked query is still charged)")
    p.add_argument("--seed", type=whole_number, default=None,
                   help="seed the partition and the noise for a reproducible research run (warns: the seed must stay "
                        "secret; never written out). Default: fresh OS entropy")
    p.add_argument("--public-seed", type=whole_number, default=0,
                   help="seed of the private/public split and the query order (public; default 0)")
    p.add_argument("--secure-rng", action="store_true", help="noise from a ChaCha20 CSPRNG keyed by the OS")
    p.add_argument("--ledger", metavar="FILE", default=None,
                   help="reserve the queries' spend in this existing budget ledger before answering them")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="write pate.json there (with --compare: results.csv, summary.md, accuracy_vs_epsilon.png)")
    p.add_argument("--diagnostics", action="store_true",
                   help="also show numbers computed from the private data WITHOUT noise, marked \"not covered by "
                   "epsilon\" (teacher_accuracy; with --compare the non-private reference and the noiseless "
                   "majority, teacher and true-label student rows): a research run's, never to publish")
    g = p.add_argument_group("comparison with label-DP methods (Adult)")
    g.add_argument("--compare", action="store_true",
                   help="PATE vs Algorithm 1's label-DP split, RR-with-prior (LP-2ST) and RR at the same epsilons")
    g.add_argument("--epsilons", type=number_list, default=None, help="comma-separated epsilons (default 0.5,1,2,4)")
    g.add_argument("--repeats", type=whole_number, default=3, help="repeats per cell (default 3)")
    g.add_argument("--quick", action="store_true", help="a small subsample (seconds; for CI)")
    add_data_arguments(p)  # --data FILE --label COL ... (your own table; docs/own-data.md)
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    """Every flag, each error naming it, before any data is loaded."""
    from featuredp._validate import check_int, check_open_unit
    from featuredp.cli._flags import check_epsilon, check_out_dir

    check_int("--teachers", args.teachers, minimum=1)
    check_int("--public-seed", args.public_seed, minimum=0)
    if args.seed is not None:
        check_int("--seed", args.seed, minimum=0)
    if args.delta is not None:
        check_open_unit("--delta", args.delta)
    for q in args.queries or []:
        check_int("--queries", q, minimum=1)
    if args.threshold is not None and args.mechanism != "gnmax":
        raise ValueError(f"--threshold is Confident-GNMax: it needs --mechanism gnmax, got --mechanism "
                         f"{args.mechanism}")
    check_out_dir("--out", args.out)
    if args.compare:
        _check_compare(args)
        return
    for flag, given in (("--epsilons", args.epsilons), ("--quick", args.quick or None)):
        if given is not None:
            raise ValueError(f"{flag} needs --compare (a single run takes --epsilon)")
    if args.epsilon is None:
        raise ValueError("--epsilon is required (the privacy epsilon of all queries together)")
    check_epsilon("--epsilon", args.epsilon)
    if args.queries is not None and len(args.queries) != 1:
        raise ValueError(f"--queries takes one number without --compare, got {','.join(map(str, args.queries))}")


def _check_compare(args: argparse.Namespace) -> None:
    from featuredp._validate import check_int
    from featuredp.cli._flags import check_epsilon

    if args.data is not None:
        raise ValueError(f"--compare runs on --dataset adult only, got --data {args.data}")
    if args.dataset not in (None, "adult"):
        raise ValueError(f"--compare runs on --dataset adult only, got --dataset {args.dataset}")
    for flag, given in (("--epsilon", args.epsilon), ("--mechanism", args.mechanism != "gnmax" or None),
                        ("--threshold", args.threshold), ("--seed", args.seed), ("--ledger", args.ledger)):
        if given is not None:
            raise ValueError(f"{flag} does not apply to --compare (use --epsilons; the noise is fresh OS entropy)")
    for e in args.epsilons or []:
        check_epsilon("--epsilons", e)
    check_int("--repeats", args.repeats, minimum=1)
    if args.out is None:
        raise ValueError("--compare needs --out DIR (results.csv, summary.md and the plot go there)")


def run(args: argparse.Namespace) -> int:
    """Run PATE (or the comparison) and print the summary."""
    _check(args)
    if args.data is not None and args.private is None and args.schema is None and args.label is not None:
        args.private = [args.label]  # PATE protects whole records: nothing more to declare
    args.dataset, args.dataset_options = resolve_data(args, args.dataset)  # bad --data/--label/...: exit 2, no work
    from featuredp.cli._flags import flag_names

    with flag_names(PATE_FLAGS):
        if args.compare:
            return _compare(args)
        return _single(args)


def _single(args: argparse.Namespace) -> int:
    from pathlib import Path

    from featuredp._io import atomic_write_json
    from featuredp.experiments.pate_runs import load_pate_data, run_pate

    ledger = None
    if args.ledger:
        from featuredp.accounting import BudgetLedger

        if not Path(args.ledger).exists():
            raise FileNotFoundError(f"--ledger {args.ledger} does not exist: create it with a total budget first")
        ledger = BudgetLedger(args.ledger)
    data = load_pate_data(args.dataset, public_seed=args.public_seed, dataset_options=args.dataset_options)
    n_private, n_public = len(data.y_private), len(data.y_public)
    if args.teachers > n_private:
        raise ValueError(f"--teachers must be <= the number of private records ({n_private:,}), got {args.teachers}")
    if args.queries is None:
        queries = min(DEFAULT_QUERIES, n_public)
    elif args.queries[0] > n_public:
        raise ValueError(f"--queries must be <= the public query pool ({n_public:,} inputs), got {args.queries[0]}")
    else:
        queries = args.queries[0]
    print(f"featuredp pate: {args.dataset}: {n_private:,} private records, {args.teachers} teachers "
          f"(≈ {n_private / args.teachers:.0f} records each), {queries} of {n_public:,} public queries",
          file=sys.stderr, flush=True)  # fmt: skip
    summary = run_pate(data, teachers=args.teachers, epsilon=args.epsilon, queries=queries, delta=args.delta,
                       mechanism=args.mechanism, threshold=args.threshold, seed=args.seed, secure_rng=args.secure_rng,
                       ledger=ledger, progress=True, public_seed=args.public_seed,
                       diagnostics=args.diagnostics)  # fmt: skip
    if args.dataset_options:
        summary["data"] = _data_summary(args.dataset_options, data)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "pate.json", summary)
        summary["out"] = str(out)
    if args.json:
        print(json.dumps(summary, default=str))
        return 0
    _print_table(summary)
    return 0


def _data_summary(options: dict[str, Any], data: Any) -> dict[str, Any]:
    """Which file was read, its label, and how many of its rows each part got (--data)."""
    return {"path": options.get("path"), "label": data.label_name, "description": data.description,
            "rows": len(data.y_private) + len(data.y_public) + len(data.y_test)}  # fmt: skip


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _print_table(s: dict[str, Any]) -> None:
    print(f"PATE on {s['dataset']}: {s['teachers']} teachers, {s['mechanism']}")
    for key in ("student_accuracy", "label_accuracy", "epsilon", "delta", "sigma", "scale",
                "threshold", "queries_asked", "queries_answered", "n_private", "n_public"):
        if s.get(key) is not None:
            print(f"  {key:<18}{_fmt(s[key])}")
    print(f"  guarantee         {s['guarantee']}")
    diagnostics = s.get("diagnostics")
    if diagnostics:
        print("  diagnostics (NOT covered by epsilon: computed from the private data without noise; do not publish)")
        for key, value in diagnostics.items():
            if key not in ("covered_by_epsilon", "note"):
                print(f"  {key:<18}{_fmt(value)}")


def _compare(args: argparse.Namespace) -> int:
    import time

    from featuredp.experiments.pate_runs import compare_label_dp

    started = time.perf_counter()
    rows = compare_label_dp(epsilons=args.epsilons or (0.5, 1.0, 2.0, 4.0), queries=args.queries or (100, 1000),
                            seeds=args.repeats, teachers=args.teachers, delta=args.delta or 1e-5, out=args.out,
                            quick=args.quick, progress=not args.json, public_seed=args.public_seed,
                            diagnostics=args.diagnostics)  # fmt: skip
    result = {"out": args.out, "rows": len(rows), "seconds": round(time.perf_counter() - started, 1),
              "files": ["results.csv", "summary.md", "accuracy_vs_epsilon.png"]}  # fmt: skip
    if args.json:
        print(json.dumps(result))
    else:
        print(f"featuredp pate --compare: {len(rows)} results in {result['seconds']} s; see {args.out}/summary.md")
    return 0
