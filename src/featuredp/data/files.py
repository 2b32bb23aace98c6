"""Your own CSV or Parquet table, with a column spec or a schema file::

    train, test = load_table("people.csv", label="income", private=["sex", "race"])
    train, test = load_table("people.csv", schema="people.schema.json")

Every column but the label (and ``drop=``) is a feature. Types come from
``numeric=``/``categorical=``, then the schema, then the file's dtypes
(:func:`infer_column_type`: a text value in an otherwise numeric column is an error
naming the column, the row and the value; a private column of a few integer codes
is categorical). Either ``private`` or ``public`` is given (the other is the
complement of the feature columns), or the schema marks them; the label is public
unless it is listed in ``private``. ``bounds``, ``categories`` and ``classes`` (the
label's class list) are public knowledge, as are a schema's; whatever they do not
cover is computed from the training data and recorded in ``statistics_from_data``
(a ``PrivacyLeakWarning`` when the column is private, now or when Ψ is bound for
training). :func:`schema_for_table` writes a starting schema without reading the
private columns. Without ``test``, a fixed seeded split holds out ``test_fraction``.

Raw files: every column with missing values is named in one error until ``missing=``
(``--missing drop|impute|category``, or ``"missing"`` in the schema) says what to do; a
repeated column name in the header is an error; and columns that look like identifiers
(names, dates, record numbers, free text) or like copies of the label are reported in one
:class:`ColumnWarning` (never recorded in the datasets: it is for the analyst).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from featuredp._validate import check_int, check_open_unit
from featuredp.data.column_checks import (
    FLAG_MIN_ROWS,
    ID_DISTINCT_SHARE,
    LABEL_COPY_ACCURACY,
    LOW_CARDINALITY,
    NUMERIC_SHARE,
    ColumnWarning,
    flag_columns,
    flag_text,
    identifier_reason,
    infer_column_type,
    label_copy_accuracy,
)
from featuredp.data.missing_values import MISSING_CATEGORY, handle_missing, missing_modes
from featuredp.data.schema import (
    BOUNDS_PLACEHOLDER,
    CATEGORIES_PLACEHOLDER,
    CLASSES_PLACEHOLDER,
    SCHEMA_FORMAT,
    TYPE_PLACEHOLDER,
    Schema,
    is_placeholder,
    read_schema,
)
from featuredp.data.table_io import (
    SEPARATORS,
    count_rows,
    file_kind,
    read_header,
    read_table,
    separator_note,
    table_separator,
)
from featuredp.data.tabular import (
    CategoricalEncoding,
    TableSpec,
    TabularDataset,
    category_string,
    check_private_set,
    encode_frames,
    seeded_split,
    validate_frame,
    warn_small_test,
)
from featuredp.errors import DataValidationError

# Re-exported: featuredp.data.files was one module; these names are still importable from here.
__all__ = [
    "FLAG_MIN_ROWS",
    "ID_DISTINCT_SHARE",
    "LABEL_COPY_ACCURACY",
    "LOW_CARDINALITY",
    "MISSING_CATEGORY",
    "NUMERIC_SHARE",
    "ColumnWarning",
    "check_schema_header",
    "count_rows",
    "flag_columns",
    "identifier_reason",
    "infer_column_type",
    "label_copy_accuracy",
    "load_table",
    "read_header",
    "read_table",
    "schema_for_table",
    "table_separator",
]


def _as_list(name: str, value: Sequence[str] | str | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name} must be a list of column names, got {value!r}")
    return list(value)


def _as_classes(value: Sequence[object] | str | None) -> list[str] | None:
    """The declared class list as strings (labels are compared as stripped strings)."""
    if value is None:
        return None
    if isinstance(value, str):  # "no,yes", as for the column lists
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, Mapping) or not isinstance(value, Sequence):
        raise TypeError(f"classes must be a list of label values, got {value!r}")
    return [str(v).strip() for v in value]


def load_table(
    path: str | os.PathLike[str],
    *,
    label: str | None = None,
    numeric: Sequence[str] | str | None = None,
    categorical: Sequence[str] | str | None = None,
    private: Sequence[str] | str | None = None,
    public: Sequence[str] | str | None = None,
    drop: Sequence[str] | str | None = None,
    schema: str | os.PathLike[str] | Mapping[str, Any] | Schema | None = None,
    test: str | os.PathLike[str] | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    bounds: Mapping[str, tuple[float, float]] | None = None,
    categories: Mapping[str, Sequence[str]] | None = None,
    classes: Sequence[object] | str | None = None,
    log1p: Sequence[str] = (),
    encoding: CategoricalEncoding = "onehot",
    name: str | None = None,
    rows: tuple[int, int] | None = None,
    missing: str | Mapping[str, str] | None = None,
    fill: Mapping[str, float] | None = None,
    sep: str | None = None,
    user_column: str | None = None,
) -> tuple[TabularDataset, TabularDataset]:
    """Load a user table as ``(train, test)``; errors name the column and the problem.

    Every column but the label and ``drop`` is a feature. Its type is, in this order: the
    ``numeric``/``categorical`` lists, the ``schema`` (:mod:`featuredp.data.schema`), ``bounds``
    (numeric) or ``categories`` (categorical), else the file's dtype (:func:`infer_column_type`;
    listed in the datasets' ``inferred_types`` and ``description``, and a warning when some
    columns were listed and others not). ``private``/``public`` are raw column names (the label
    may be listed in ``private``; default: the schema's). ``bounds``, ``categories`` and
    ``classes`` (the label's class list, in this order; a label value outside it is a
    DataValidationError) are public knowledge, added to the schema's. Without them the
    statistics come from the training data and are recorded in ``statistics_from_data``;
    for a private column (or label) that is a PrivacyLeakWarning.

    ``rows=(start, stop)`` loads only those data rows (a rank's shard in a data-parallel run,
    docs/distributed.md). Every rank must then encode alike, so every column's type and public
    statistics must be declared (schema, bounds, categories, classes): one computed from the shard,
    or a type read from its dtypes, is a DataValidationError.

    Missing values (in the file or ``test``) are a DataValidationError naming every such column
    and its count, until ``missing`` says what to do: ``"drop"`` the rows (a warning says how
    many; a PrivacyLeakWarning when a private value decided), ``"impute"`` (a numeric column
    gets its ``fill`` value, public knowledge; without one the median of the data, which for a
    private column is a PrivacyLeakWarning; a categorical column gets its own category
    :data:`MISSING_CATEGORY`) or ``"category"`` (categorical columns only). ``missing`` is one
    mode or a mapping of column to mode; a schema's per-column ``"missing"``/``"fill"`` and
    top-level ``"missing"`` apply where the arguments say nothing. Rows with a missing label
    are dropped under every mode. A header that repeats a column name is a DataValidationError;
    columns that look like identifiers or copies of the label are one :class:`ColumnWarning`.

    ``sep``: the CSV delimiter (one of ``, ; | \\t``); by default the file type's, or the one the header
    is split by (:func:`~featuredp.data.table_io.table_separator`, with a warning saying so). A schema whose
    columns do not match the file's header is one DataValidationError naming both files and the columns.

    ``user_column``: the column naming each row's user (``--user-column``, docs/users.md). It is never a feature; its
    values (as strings) become the datasets' ``users``, the unit of a user-level run. A row without one is an error.
    """
    sch = None if schema is None else read_schema(schema)
    label = _checked_label(label, sch)
    check_open_unit("test_fraction", test_fraction)
    check_int("seed", seed, minimum=0)
    df = _read_data(path, label, rows, sep)
    num = _as_list("numeric", numeric) or []
    cat = _as_list("categorical", categorical) or []
    dropped = _as_list("drop", drop) or []
    dropped += _user_column(df, user_column, label, [*num, *cat])
    unknown = [c for c in [*num, *cat, *dropped] if c not in df.columns]
    if unknown:
        raise DataValidationError(f"unknown column(s) {unknown}; available columns: {list(df.columns)}")
    if sch is not None:
        check_schema_header(sch, list(df.columns), path, declared=[*num, *cat, *dropped])
        dropped += [c for c in sch.drop if c not in num and c not in cat]
    features = [c for c in df.columns if c != label and c not in dropped]
    priv = _private_columns(_as_list("private", private), _as_list("public", public), features, label, sch)
    # Read to warn the analyst only (nothing of it is recorded): the private label is not compared.
    flags = flag_columns(df, label, features,
                         public=[] if label in priv else [c for c in features if c not in priv])  # fmt: skip
    if flags:
        warnings.warn(ColumnWarning(flag_text(Path(path).name, flags), flags), stacklevel=2)
    typed = _declared_types(df, features, priv, num, cat, sch, bounds, categories,
                            line_offset=None if file_kind(path) == "parquet" else 2)  # fmt: skip
    classes_given = _as_classes(classes)
    if sch is not None and classes_given is None:
        classes_given = sch.classes
        if sch.classes is not None and sch.classes_from_data:
            typed.from_data[label] = "classes"
        elif sch.label_pending and label in priv:
            typed.pending.append(f"{label} (classes)")
    if typed.pending:
        assert sch is not None
        raise DataValidationError(
            f"the {sch.where} still has placeholders for {', '.join(typed.pending)}: write the public values (the "
            "type; the bounds of a numeric column or the categories of a categorical one, from a codebook or the "
            "data's documentation; the label's classes), or null for a statistic to compute it from the data (a "
            "PrivacyLeakWarning for a private column); see docs/own-data.md"
        )
    typed.bounds.update(bounds or {})
    typed.categories.update(categories or {})
    test_df = None
    if test is not None:
        read_header(test, sep=sep)
        test_df = read_table(test, sep=sep)
        test_df.columns = [str(c) for c in test_df.columns]
    modes, fills = missing_modes(missing, fill, sch, [*features, label])
    data_key, test_key = repr(Path(path).name), f"the test file {Path(test).name!r}" if test is not None else ""
    frames = {data_key: df, **({test_key: test_df} if test_df is not None else {})}
    frames, computed_fills = handle_missing(frames, label=label, types=typed.types, private=priv, modes=modes,
                                            fills=fills, categories=typed.categories,
                                            sharded=rows is not None)  # fmt: skip
    df, test_df = frames[data_key], frames.get(test_key)
    if typed.inferred and (num or cat):
        warnings.warn(
            f"{Path(path).name}: column(s) not listed in numeric=/categorical= were typed from their dtypes: "
            f"{_types_text(typed.types, typed.inferred)}; list them, or drop= the ones to leave out",
            UserWarning,
            stacklevel=2,
        )
    spec = TableSpec(
        label=label,
        numeric=tuple(c for c in features if typed.types.get(c) == "numeric"),
        categorical=tuple(c for c in features if typed.types.get(c) == "categorical"),
        private=tuple(priv),
        bounds=typed.bounds,
        categories=typed.categories,
        log1p=tuple(dict.fromkeys([*log1p, *typed.log1p])),
        classes=classes_given,
        given_from_data=typed.from_data,
        inferred_types=tuple(typed.inferred),
    )
    if rows is not None:
        _check_shard_declared(rows, spec, features, typed, computed_fills)
    # Rows are counted in the whole file here (the split below renumbers them).
    validate_frame(df, spec, where=repr(Path(path).name))
    if test_df is not None:
        train_df = df
    else:
        tr_idx, te_idx = seeded_split(len(df), test_fraction, seed)
        train_df, test_df = df.iloc[tr_idx].reset_index(drop=True), df.iloc[te_idx].reset_index(drop=True)
    warn_small_test(len(test_df), f"the test split of {Path(path).name}" if test is None else f"{Path(test).name}")
    desc = _description(path, test, sch, typed)
    out = encode_frames(train_df, test_df, spec, name=name or Path(path).stem, description=desc, categorical=encoding)
    for ds, frame in zip(out, (train_df, test_df), strict=True):
        if user_column is not None and user_column in frame.columns:  # a --test-data file may name none
            ds.users = frame[user_column].astype(str).to_numpy()
    return out


def _user_column(df: pd.DataFrame, column: str | None, label: str, typed: Sequence[str]) -> list[str]:
    """``[column]`` (left out of the features) when it names a column of the file that is neither the label nor a
    typed feature, with a value in every row; ``[]`` without a user column."""
    if column is None:
        return []
    if column not in df.columns:
        raise DataValidationError(f"--user-column {column!r}: no such column; available columns: {list(df.columns)}")
    if column == label or column in typed:
        raise DataValidationError(f"--user-column {column!r} is the label or a feature; it names each row's user")
    if df[column].isna().any():
        raise DataValidationError(f"--user-column {column!r}: {int(df[column].isna().sum())} row(s) name no user "
                                  "(every row needs one)")  # fmt: skip
    return [column]


def _checked_label(label: str | None, sch: Schema | None) -> str:
    if label is None and sch is not None:
        label = sch.label
    if not isinstance(label, str) or not label:
        raise TypeError(f"label must be a column name, got {label!r}")
    if sch is not None and label != sch.label:
        raise DataValidationError(f"label {label!r} differs from the label {sch.label!r} of the {sch.where}")
    return label


def _description(
    path: str | os.PathLike[str], test: str | os.PathLike[str] | None, sch: Schema | None, typed: _Typed
) -> str:
    desc = f"user table {Path(path).name}" + (f" (test: {Path(test).name})" if test is not None else "")
    if sch is not None:
        desc += f"; {sch.where}"
    if typed.inferred:
        desc += f"; typed from dtypes: {_types_text(typed.types, typed.inferred)}"
    return desc


def _read_data(path: str | os.PathLike[str], label: str, rows: tuple[int, int] | None, sep: str | None) -> pd.DataFrame:
    """The --data file's frame (column names as strings), after the header's checks and a note on its delimiter."""
    read_header(path, sep=sep)  # a repeated column name is an error (read_table would rename the copy)
    note = separator_note(path, sep)
    if note is not None:
        warnings.warn(note, UserWarning, stacklevel=3)
    df = read_table(path, rows=rows, sep=sep)
    if df.empty:
        raise DataValidationError(f"path {str(path)!r} has no rows")
    df.columns = [str(c) for c in df.columns]
    if label not in df.columns:
        raise DataValidationError(f"unknown label column {label!r}; available columns: {list(df.columns)}")
    return df


def _first(names: Sequence[str], k: int = 5) -> str:
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


def check_schema_header(sch: Schema, header: Sequence[str], path: str | os.PathLike[str], *,
                        declared: Sequence[str] = ()) -> None:  # fmt: skip
    """A one-line DataValidationError when the schema ``sch`` and the header of ``path`` disagree: the schema's
    label or columns that the file lacks, and the file's columns that neither the schema nor ``declared``
    (numeric=/categorical=/drop=) lists (the first few of each), naming both files."""
    missing = [c for c in [sch.label, *sch.columns] if c not in header]
    extra = [c for c in header if c != sch.label and c not in sch.columns and c not in declared]
    if not missing and not extra:
        return
    parts = []
    if missing:
        parts.append(f"the schema has {len(missing)} column(s) the file lacks: {_first(missing)}")
    if extra:
        parts.append(f"the file has {len(extra)} column(s) the schema does not list: {_first(extra)}")
    hint = ""
    if len(header) == 1 and any(s in header[0] for s in SEPARATORS):
        hint = "; the file's header reads as one column: pass --sep (sep=) with its delimiter"
    elif extra:
        hint = '; add those to the schema (type numeric, categorical or "drop")'
    raise DataValidationError(f"the {sch.where} does not match {Path(path).name!r}: {'; '.join(parts)}{hint}")


def _private_columns(priv: list[str] | None, pub: list[str] | None, features: list[str], label: str,
                     sch: Schema | None) -> list[str]:  # fmt: skip
    """The private columns (the label among them when it is private), from private=/public= or the schema."""
    if priv is None and pub is None:
        if sch is None or not sch.private:
            raise ValueError("give private= (or public=): feature-DP needs the private columns declared")
        priv = sch.private
    if pub is not None:
        unknown = [c for c in pub if c not in features and c != label]
        if unknown:
            raise DataValidationError(f"unknown public column(s) {unknown}; known columns: {[*features, label]}")
        complement = [c for c in features if c not in pub]
        if priv is None:
            priv = complement
        else:
            overlap = sorted(set(priv) & set(pub))
            unassigned = sorted(set(features) - set(pub) - set(priv))
            if overlap or unassigned:
                raise DataValidationError(
                    f"public and private must split the feature columns: both list {overlap}, "
                    f"neither lists {unassigned}"
                )
    return list(check_private_set(priv or [], features, label))


@dataclasses.dataclass
class _Typed:
    """Each feature's type and the public statistics declared for it (the arguments' and the schema's)."""

    types: dict[str, str] = dataclasses.field(default_factory=dict)
    inferred: dict[str, str] = dataclasses.field(default_factory=dict)  # column -> why (typed from its dtype)
    bounds: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    categories: dict[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    from_data: dict[str, str] = dataclasses.field(default_factory=dict)  # column -> the statistic a schema computed
    log1p: list[str] = dataclasses.field(default_factory=list)
    pending: list[str] = dataclasses.field(default_factory=list)  # the schema's placeholders left


def _declared_types(df: pd.DataFrame, features: Sequence[str], priv: Sequence[str], num: Sequence[str],
                    cat: Sequence[str], sch: Schema | None, bounds: Mapping[str, Any] | None,
                    categories: Mapping[str, Any] | None, *, line_offset: int | None) -> _Typed:  # fmt: skip
    """Types and public statistics: the arguments, then the schema, then the dtypes."""
    out = _Typed()
    for c in features:
        entry = None if sch is None else sch.columns.get(c)
        if c in num or c in cat:
            out.types[c] = "numeric" if c in num else "categorical"
        elif entry is not None and entry.type is not None:
            out.types[c] = entry.type
        elif entry is not None:
            out.pending.append(f"{c} (type)")
            continue
        elif bounds and c in bounds:
            out.types[c] = "numeric"
        elif categories and c in categories:
            out.types[c] = "categorical"
        else:
            out.types[c], out.inferred[c] = infer_column_type(df[c], c, private=c in priv, line_offset=line_offset)
        if entry is not None:
            _schema_statistics(out, c, entry, bounds or {}, categories or {})
    return out


def _schema_statistics(out: _Typed, c: str, entry: Any, bounds: Mapping[str, Any],
                       categories: Mapping[str, Any]) -> None:  # fmt: skip
    """The schema's bounds or categories (and log1p) of column ``c``, where the arguments give none."""
    if out.types[c] == "numeric":
        if entry.bounds is not None and c not in bounds:
            out.bounds[c] = entry.bounds
            if entry.from_data:
                out.from_data[c] = "bounds"
        elif "bounds" in entry.pending and c not in bounds:
            out.pending.append(f"{c} (bounds)")
        if entry.log1p:
            out.log1p.append(c)
    elif entry.categories is not None and c not in categories:
        out.categories[c] = list(entry.categories)
        if entry.from_data:
            out.from_data[c] = "categories"
    elif "categories" in entry.pending and c not in categories:
        out.pending.append(f"{c} (categories)")


def _check_shard_declared(rows: tuple[int, int], spec: TableSpec, features: Sequence[str], typed: _Typed,
                          computed_fills: Sequence[str]) -> None:  # fmt: skip
    """A shard (``rows=``) must be encoded as every other: nothing may be read from its values."""
    undeclared = [f"{c} (type)" for c in typed.inferred] + [
        f"{c} ({'bounds' if typed.types.get(c) == 'numeric' else 'categories'})"
        for c in features if c not in typed.bounds and c not in typed.categories
    ] + ([f"{spec.label} (classes)"] if spec.classes is None else []) + [
        f"{c} (fill)" for c in computed_fills
    ]  # fmt: skip
    if undeclared:
        raise DataValidationError(
            f"rows={rows!r} loads one shard, and every shard must be encoded alike, but these are not declared "
            f"and would be read from the shard: {', '.join(undeclared)}; declare them in a schema "
            "(featuredp data schema, docs/own-data.md)"
        )


def _types_text(types: Mapping[str, str], why: Mapping[str, str]) -> str:
    return ", ".join(f"{c} {types[c]} ({why[c]})" for c in why)


def schema_for_table(
    path: str | os.PathLike[str],
    *,
    label: str,
    private: Sequence[str] | str | None = None,
    numeric: Sequence[str] | str | None = None,
    categorical: Sequence[str] | str | None = None,
    drop: Sequence[str] | str | None = None,
    sep: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """A starting schema for a table (its JSON dict) and the fields left for you to fill in.

    Reads the header and the values of the *public* columns (and of the label when it is
    public) only: their types (declared or from dtypes), bounds (min/max) and category lists
    are filled in and marked ``"from_data": true``. The private columns' values are never read:
    their type (unless declared with ``numeric``/``categorical``), bounds and categories (and
    the classes of a private label) are ``"FILL IN ..."`` placeholders that loading refuses
    until you write public values (:mod:`featuredp.data.schema`).

    A public column that looks like an identifier (:func:`identifier_reason`: names, dates, record
    numbers, free text) is written ``"type": "drop"`` with a ``"note"`` saying why, and its values
    are not copied into the schema; a public column that predicts a public label by itself gets a
    ``"note"``. Both are reported in one :class:`ColumnWarning`. ``sep``: as :func:`load_table`'s (a header
    split by another delimiter than the file type's is read with it, and a warning says so).
    """
    note = separator_note(path, sep)
    if note is not None:
        warnings.warn(note, UserWarning, stacklevel=2)
    header = read_header(path, sep=sep)
    if label not in header:
        raise DataValidationError(f"unknown label column {label!r}; available columns: {header}")
    priv = _as_list("private", private) or []
    num = _as_list("numeric", numeric) or []
    cat = _as_list("categorical", categorical) or []
    dropped = _as_list("drop", drop) or []
    _check_declared(header, priv=priv, num=num, cat=cat, dropped=dropped)
    label_private = label in priv
    public_cols = [c for c in header if c != label and c not in priv and c not in dropped]
    df = read_table(path, columns=[*public_cols, *([] if label_private else [label])], sep=sep)
    df.columns = [str(c) for c in df.columns]
    line_offset = None if file_kind(path) == "parquet" else 2
    columns: dict[str, Any] = {}
    todo: list[str] = []
    flags: dict[str, str] = {}
    for c in header:
        if c == label:
            continue
        if c in dropped:
            columns[c] = {"type": "drop"}
            continue
        if c in priv:
            columns[c] = _private_entry(c, num, cat)
            fields = [k for k in ("type", "bounds", "categories") if is_placeholder(columns[c].get(k))]
            todo.append(f"{c} ({', '.join(fields)})")
            continue
        s = df[c]
        why = identifier_reason(s)
        if why is not None:
            # Never copy an identifier's values (names, record numbers) into a file meant to be shared.
            flags[c] = why
            columns[c] = {"type": "drop", "note": f"{why}: left out (a model memorises identifiers); to use it, "
                                                  "write its type and public bounds or categories"}  # fmt: skip
            continue
        kind = "numeric" if c in num else "categorical" if c in cat else infer_column_type(
            s, c, line_offset=line_offset)[0]  # fmt: skip
        columns[c] = _public_entry(s, kind)
    if not label_private:
        kept = [c for c in public_cols if c not in flags]
        for c, why in flag_columns(df, label, kept, public=kept).items():
            flags[c] = why
            columns[c]["note"] = f"{why}: a copy of the label? Make it \"type\": \"drop\" unless it is known at " \
                                 "prediction time"  # fmt: skip
    if flags:
        warnings.warn(ColumnWarning(flag_text(Path(path).name, flags), flags), stacklevel=2)
    label_entry: dict[str, Any] = {"name": label, "private": label_private}
    if label_private:
        label_entry["classes"] = CLASSES_PLACEHOLDER
        todo.append(f"{label} (classes)")
    else:
        seen = sorted({category_string(v) for v in df[label].dropna().tolist()})
        if len(seen) >= 2:
            label_entry["classes"] = seen
            label_entry["from_data"] = True
        else:  # one value in this file (a single row, say): the classes cannot come from it
            label_entry["classes"] = CLASSES_PLACEHOLDER
            todo.append(f"{label} (classes: this file holds {len(seen)} value(s) of it)")
    schema = {"featuredp_schema": SCHEMA_FORMAT, "source": Path(path).name, "label": label_entry, "columns": columns}
    read_schema(schema)  # what we write must load
    return schema, todo


def _check_declared(header: list[str], *, priv: list[str], num: list[str], cat: list[str], dropped: list[str]) -> None:
    for what, cols in (("private", priv), ("numeric", num), ("categorical", cat), ("drop", dropped)):
        unknown = [c for c in cols if c not in header]
        if unknown:
            raise DataValidationError(f"unknown {what} column(s) {unknown}; available columns: {header}")
    both = sorted(set(num) & set(cat))
    if both:
        raise DataValidationError(f"column(s) {both} declared both numeric and categorical")


def _private_entry(c: str, num: Sequence[str], cat: Sequence[str]) -> dict[str, Any]:
    # Only what was declared: the private column's values are never read, so the rest is a placeholder.
    kind = "numeric" if c in num else "categorical" if c in cat else None
    entry: dict[str, Any] = {"type": kind or TYPE_PLACEHOLDER, "private": True}
    if kind in (None, "numeric"):
        entry["bounds"] = BOUNDS_PLACEHOLDER
    if kind in (None, "categorical"):
        entry["categories"] = CATEGORIES_PLACEHOLDER
    return entry


def _public_entry(s: pd.Series, kind: str) -> dict[str, Any]:
    if kind != "numeric":
        cats = sorted({category_string(v) for v in s.dropna().tolist()})
        return {"type": "categorical", "private": False, "categories": cats, "from_data": True}
    values = pd.to_numeric(s, errors="raise").dropna().to_numpy(dtype=np.float64)
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    note = None
    if hi <= lo:
        # One value (a constant column, or one row): a schema needs low < high. [v, v + 1] encodes v as
        # 0, as the loader does with bounds it computes for such a column, so the schema loads back alike.
        hi = lo + 1.0
        note = "one value in this file: bounds widened to [value, value + 1]; a constant column carries " \
               "no information (\"type\": \"drop\" leaves it out)"  # fmt: skip
    return {"type": "numeric", "private": False, "bounds": [_plain_number(lo), _plain_number(hi)],
            "from_data": True, **({"note": note} if note else {})}  # fmt: skip


def _plain_number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x
