"""``--data FILE`` and its options, shared by ``train``, ``compare``, ``audit`` and ``data info``.

One call adds the group (:func:`add_data_arguments`) and one call turns the parsed flags into
the dataset name and loader options that ``load_dataset`` takes (:func:`resolve_data`), checking
every flag against the file's header (never its values) so that bad input is a one-line error
naming the flag and the value before any work. The options hold absolute paths: ``featuredp
train --out`` records them in run.json, and ``featuredp audit RUN`` reloads the same data.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from featuredp.data.schema import Schema

#: datasets read from a file the user names with --data
_FILE_DATASETS = ("csv", "purchase100", "criteo")
#: flags that only describe a CSV/Parquet table (not purchase100/criteo files)
_TABLE_FLAGS = ("label", "categorical", "numeric", "drop", "schema", "test_data", "missing", "sep", "user_column")


def _columns(text: str) -> list[str]:
    cols = [c.strip() for c in text.split(",") if c.strip()]
    if not cols:
        raise argparse.ArgumentTypeError(f"expected comma-separated column names, got {text!r}")
    return cols


#: what a --dataset value that names a file ends with (a hint to --data, not a dataset name)
_FILE_SUFFIXES = (".csv", ".csv.gz", ".tsv", ".tsv.gz", ".parquet", ".pq")


def check_dataset_name(value: str) -> str:
    """``value`` if it can be a dataset name; a path-like value is a one-line error pointing to --data.

    A file given to --dataset would otherwise be looked up as a name (an "unknown dataset" error, or
    argparse's list of choices) and never read.
    """
    text = str(value)
    if any(sep in text for sep in {"/", "\\", os.sep}) or text.lower().endswith(_FILE_SUFFIXES):
        raise ValueError(f"--dataset takes a dataset name; for your own file use --data {text} --label COL")
    return text


def dataset_name(value: str) -> str:
    """An argparse ``type`` for --dataset: :func:`check_dataset_name`, before the command's ``choices``."""
    try:
        return check_dataset_name(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --data, --label, --private, --categorical, --numeric, --drop, --user-column, --missing, --schema,
    --test-data, --offline.

    Flags the command already has (``compare``'s ``--label``, ``train``'s ``--private``) are kept
    as they are; their values are read the same way. A ``--dataset`` default becomes None here
    and :func:`resolve_data` applies it, so that ``--dataset adult --data FILE`` is an error.
    """
    if parser.get_default("dataset") is not None:
        parser.set_defaults(dataset=None)
    group = parser.add_argument_group(
        "your own data",
        "train on your CSV or Parquet file: --data FILE --label COL --private A,B (docs/own-data.md)",
    )

    def add(flag: str, **kwargs: Any) -> None:
        if flag not in parser._option_string_actions:
            group.add_argument(flag, **kwargs)

    add("--data", metavar="FILE", default=None,
        help="your table (.csv, .csv.gz, .tsv, .parquet); also the file of --dataset purchase100|criteo")
    add("--label", metavar="COL", default=None, help="the column to predict (with --data; default: the schema's)")
    add("--private", metavar="A,B", type=_columns, default=None,
        help="comma-separated private columns (default: the dataset's, or those the --schema marks private)")
    add("--categorical", metavar="A,B", type=_columns, default=None,
        help="columns to one-hot encode (others are typed from the schema or their dtypes)")
    add("--numeric", metavar="A,B", type=_columns, default=None, help="columns to scale as numbers")
    add("--drop", metavar="A,B", type=_columns, default=None, help="columns to leave out")
    add("--user-column", metavar="COL", default=None,
        help="user-level privacy (docs/users.md): the column naming each row's user; it is not a feature, users are "
        "sampled, each user's rows clipped as one, and ε covers a whole user (with --records-per-user, --num-users)")
    add("--missing", choices=("drop", "impute", "category"), default=None,
        help="missing values: drop the rows, impute (numbers: the schema's public fill value, else the median of "
        "a public column; categories: their own) or give categorical ones their own category (default: an error "
        "naming every column with missing values)")
    add("--schema", metavar="FILE", default=None,
        help="column types, public bounds, categories and classes (write one with `featuredp data schema`)")
    add("--test-data", metavar="FILE", default=None, help="a test file (default: a fixed 80/20 split of --data)")
    add("--sep", metavar="CHAR", default=None,
        help="the CSV delimiter: , ; | or tab (default: the file type's, or the one its header line is split by, "
        "with a note)")
    add("--cache-dir", default=None, help="dataset cache (default: $FEATUREDP_CACHE or ~/.cache/featuredp)")
    add("--offline", action="store_true",
        help="never download a dataset (as FEATUREDP_OFFLINE=1): a dataset not in the cache is an error")


def _file(flag: str, value: str, sep: str | None = None) -> str:
    from featuredp.data.files import read_header

    p = Path(value).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"{flag} {value}: no such file")
    try:
        read_header(p, sep=sep)
    except ValueError as exc:
        raise ValueError(f"{flag} {value}: {exc}") from None
    return os.path.abspath(p)


def resolve_data(
    args: argparse.Namespace, dataset: str | None, options: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The dataset name and loader options for ``args`` (``dataset``/``options`` when no --data is given).

    Checks, before any work: the files exist and have a supported type, the label and every named
    column are in the header, a table has a label and private columns (flags or schema), the
    schema parses and lists the file's columns. ``--offline`` sets ``FEATUREDP_OFFLINE=1`` for this process.
    """
    from featuredp.data.cache import OFFLINE_ENV

    for typed in (getattr(args, "dataset", None), dataset):
        if typed is not None:
            check_dataset_name(typed)
    if getattr(args, "offline", False):
        os.environ[OFFLINE_ENV] = "1"
    data = getattr(args, "data", None)
    if data is None:
        return _without_data(args, dataset, dict(options or {}))
    name = args.dataset if hasattr(args, "dataset") else dataset  # what the user typed, not a command's default
    if name is None:  # --data alone: your table
        name = "csv"
    if name not in _FILE_DATASETS:
        raise ValueError(f"--data FILE reads your own file; it cannot be combined with --dataset {name}")
    sep = _sep(args)
    path = _file("--data", data, sep)
    if name != "csv":
        extra = [f"--{k.replace('_', '-')}" for k in _TABLE_FLAGS if getattr(args, k, None)]
        if extra:
            raise ValueError(f"{extra[0]} applies to a CSV/Parquet table, not to --dataset {name}")
        return name, {"path": path}
    return name, _table_options(args, data, path, sep)


def _without_data(args: argparse.Namespace, name: str | None, opts: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A named dataset (no --data): table flags are refused, --cache-dir goes to a dataset that is fetched."""
    from featuredp.data import dataset_info

    given = [f"--{k.replace('_', '-')}" for k in _TABLE_FLAGS if k != "label" and getattr(args, k, None)]
    if given and not opts.get("path"):
        raise ValueError(f"{given[0]} describes your own table: give it with --data FILE")
    if name in _FILE_DATASETS and not opts.get("path"):
        raise ValueError(f"--dataset {name} reads your own file: give it with --data FILE")
    if name is not None and getattr(args, "cache_dir", None) and dataset_info(name).needs_fetch:
        opts.setdefault("cache_dir", args.cache_dir)
    return name or "adult", opts


def _sep(args: argparse.Namespace) -> str | None:
    from featuredp.data.table_io import check_separator

    value = getattr(args, "sep", None)
    if value is None:
        return None
    try:
        return check_separator(value)
    except ValueError:
        raise ValueError(f"--sep {value!r}: use one of , ; | or tab") from None


def _table_options(args: argparse.Namespace, data: str, path: str, sep: str | None) -> dict[str, Any]:
    """The loader options of your table: every flag checked against the header (and the schema against it)."""
    from featuredp.data.files import read_header

    opts: dict[str, Any] = {"path": path}
    if sep is not None:
        opts["sep"] = sep
    header = read_header(path, sep=sep)
    schema = _checked_schema(args, header, path)
    if schema is not None:
        opts["schema"] = os.path.abspath(Path(args.schema).expanduser())
    label = getattr(args, "label", None)
    if label is None and schema is None:
        raise ValueError("--data needs --label COL (the column to predict) or a --schema that names it")
    if label is not None:
        _check_label(args, label, schema, header, data)
        opts["label"] = label
    private = getattr(args, "private", None)
    if private is None and (schema is None or not schema.private):
        raise ValueError("--data needs --private A,B (the sensitive columns) or a --schema that marks them private")
    _check_named_columns(args, private, header, data)
    for key in ("private", "categorical", "numeric", "drop"):
        if getattr(args, key, None):
            opts[key] = list(getattr(args, key))
    user = getattr(args, "user_column", None)
    if user is not None:
        if user not in header:
            raise ValueError(f"--user-column {user!r}: no such column in {Path(data).name}")
        if user == label or user in (private or ()):
            raise ValueError(f"--user-column {user!r} is the label or a private column; it names each row's user")
        opts["user_column"] = user
    if getattr(args, "missing", None):
        opts["missing"] = args.missing
    if getattr(args, "test_data", None):
        opts["test"] = _file("--test-data", args.test_data, sep)
    return opts


def _checked_schema(args: argparse.Namespace, header: list[str], path: str) -> Schema | None:
    from featuredp.data.files import check_schema_header
    from featuredp.data.schema import read_schema

    if not getattr(args, "schema", None):
        return None
    schema_path = Path(args.schema).expanduser()
    if not schema_path.is_file():
        raise FileNotFoundError(f"--schema {args.schema}: no such file")
    try:
        schema = read_schema(schema_path)
        named = [c for k in ("categorical", "numeric", "drop") for c in getattr(args, k, None) or []]
        check_schema_header(schema, header, path, declared=named)
    except ValueError as exc:
        raise ValueError(f"--schema {args.schema}: {exc}") from None
    return schema


def _check_label(args: argparse.Namespace, label: str, schema: Schema | None, header: list[str], data: str) -> None:
    if label not in header:
        one = len(header) == 1 and any(c in header[0] for c in ",;|\t")
        raise ValueError(f"--label {label}: no such column in {data}; columns: {', '.join(header)}"
                         + ("; the header reads as one column: check --sep" if one else ""))
    if schema is not None and label != schema.label:
        raise ValueError(f"--label {label} differs from the label {schema.label!r} of --schema {args.schema}")


def _check_named_columns(args: argparse.Namespace, private: Any, header: list[str], data: str) -> None:
    named_flags = {"--private": private,
                   **{f"--{k}": getattr(args, k, None) for k in ("categorical", "numeric", "drop")}}  # fmt: skip
    for flag, cols in named_flags.items():
        unknown = [c for c in cols or [] if c not in header]
        if unknown:
            raise ValueError(f"{flag} {','.join(cols or [])}: no column {unknown[0]!r} in {data}; "
                             f"columns: {', '.join(header)}")  # fmt: skip


def use_data_args_for_run(run: Any, args: argparse.Namespace) -> None:
    """Point a loaded run (``featuredp audit``) at --data FILE ..., else check the files its run.json names.

    The private columns are the run's: --private may repeat them, not change them.
    """
    info = run.info.setdefault("dataset", {})
    if getattr(args, "data", None) is None:
        given = [f"--{k.replace('_', '-')}" for k in (*_TABLE_FLAGS, "private") if getattr(args, k, None)]
        if given:
            raise ValueError(f"{given[0]} describes the data: give it with --data FILE (default: the run's data)")
        for key in ("path", "schema", "test"):
            value = (info.get("options") or {}).get(key)
            if value and not Path(value).is_file():
                raise FileNotFoundError(
                    f"run {run.path} was trained on {value}, which is gone; give the data with --data FILE "
                    "(and the same --label/--schema options)"
                )
        return
    if getattr(args, "private", None) is None:
        args.private = run.private_columns or None
    elif set(args.private) != set(run.private_columns):
        raise ValueError(
            f"--private {','.join(args.private)} differs from the run's private columns "
            f"{','.join(run.private_columns) or '(none)'}: an audit attacks the feature map the run was trained with"
        )
    name = info.get("name") if info.get("name") in _FILE_DATASETS else None
    info["name"], info["options"] = resolve_data(args, name)
