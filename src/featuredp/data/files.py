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

import os
import re
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from featuredp._validate import check_int, check_open_unit
from featuredp.data.schema import (
    BOUNDS_PLACEHOLDER,
    CATEGORIES_PLACEHOLDER,
    CLASSES_PLACEHOLDER,
    MISSING_MODES,
    SCHEMA_FORMAT,
    TYPE_PLACEHOLDER,
    Schema,
    is_placeholder,
    read_schema,
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
from featuredp.errors import DataValidationError, PrivacyLeakWarning


def _kind(path: str | os.PathLike[str]) -> str:
    """``"parquet"``, ``"tsv"`` or ``"csv"`` from the file name; ValueError for anything else."""
    suffixes = "".join(Path(path).suffixes).lower()
    if suffixes.endswith(".parquet") or suffixes.endswith(".pq"):
        return "parquet"
    if ".tsv" in suffixes:
        return "tsv"
    if ".csv" in suffixes:
        return "csv"
    raise ValueError(f"path {str(path)!r}: unsupported file type (use .csv, .csv.gz, .tsv or .parquet)")


def read_table(
    path: str | os.PathLike[str], columns: Sequence[str] | None = None, rows: tuple[int, int] | None = None
) -> pd.DataFrame:
    """Read a ``.csv``/``.csv.gz``/``.tsv`` or ``.parquet`` file into a DataFrame (only ``columns`` if given).

    ``rows=(start, stop)``: only the data rows ``start .. stop − 1`` (0-based, the header not counted),
    without reading the others into memory: Parquet reads only the row groups that hold them, a CSV is
    skipped through line by line. A rank of a data-parallel run loads its shard this way
    (docs/distributed.md).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(p)!r} does not exist or is not a file")
    kind = _kind(p)
    cols = None if columns is None else list(columns)
    if rows is not None:
        start, stop = check_int("rows[0]", rows[0], minimum=0), check_int("rows[1]", rows[1], minimum=0)
        if stop < start:
            raise ValueError(f"rows must be (start, stop) with start <= stop, got {rows!r}")
        if kind == "parquet":
            return _parquet_rows(p, cols, start, stop)
        return pd.read_csv(p, sep="\t" if kind == "tsv" else ",", usecols=cols,
                           skiprows=range(1, start + 1), nrows=stop - start)  # fmt: skip
    if kind == "parquet":
        return pd.read_parquet(p, columns=cols)
    return pd.read_csv(p, sep="\t" if kind == "tsv" else ",", usecols=cols)


def _parquet_rows(path: Path, columns: list[str] | None, start: int, stop: int) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    tables, first = [], 0
    for g in range(pf.metadata.num_row_groups):
        size = pf.metadata.row_group(g).num_rows
        lo, hi = max(start, first), min(stop, first + size)
        if lo < hi:
            tables.append(pf.read_row_group(g, columns=columns).slice(lo - first, hi - lo))
        first += size
    if not tables:
        return pf.schema_arrow.empty_table().select(columns or pf.schema_arrow.names).to_pandas()
    return pa.concat_tables(tables).to_pandas()


def count_rows(path: str | os.PathLike[str]) -> int:
    """The number of data rows of a table file: Parquet's metadata, or a CSV read one column at a time.

    Every rank of a sharded run computes the same count from the same file, so the shards agree.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(p)!r} does not exist or is not a file")
    kind = _kind(p)
    if kind == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(p).metadata.num_rows)
    first = read_header(p)[:1]
    chunks = pd.read_csv(p, sep="\t" if kind == "tsv" else ",", usecols=first, chunksize=1 << 20)
    return sum(len(c) for c in chunks)


def read_header(path: str | os.PathLike[str]) -> list[str]:
    """The column names of a table file, reading no values."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(p)!r} does not exist or is not a file")
    kind = _kind(p)
    if kind == "parquet":
        import pyarrow.parquet as pq

        names = [str(c) for c in pq.read_schema(p).names]
        _check_unique(p, names)
        return names
    sep = "\t" if kind == "tsv" else ","
    # pandas renames a repeated name ("x", "x.1"): read the header line as values to see it as written.
    first = pd.read_csv(p, sep=sep, header=None, nrows=1, dtype=str, keep_default_na=False)
    _check_unique(p, [str(c).strip() for c in first.iloc[0].tolist()] if len(first) else [])
    return [str(c) for c in pd.read_csv(p, sep=sep, nrows=0).columns]


def _check_unique(path: Path, names: Sequence[str]) -> None:
    counts = Counter(names)
    dups = [c for c in counts if counts[c] > 1]
    if dups:
        raise DataValidationError(
            f"path {str(path)!r} repeats the column name(s) {dups} in its header: every column needs its own "
            "name (rename or remove the copies)"
        )


#: a column declared private whose values are at most this many distinct integers is typed categorical
#: (a 0/1 flag, a small code): attribute inference and the audit need it one-hot, not scaled
LOW_CARDINALITY = 10
#: a text column in which at least this share of the values are numbers is a typing surprise (an error)
NUMERIC_SHARE = 0.9


def _where_row(row: int, line_offset: int | None) -> str:
    return f"row {row}" + (f" (line {row + line_offset} of the file)" if line_offset is not None else "")


def infer_column_type(
    series: pd.Series, column: str, *, private: bool = False, line_offset: int | None = 2
) -> tuple[str, str]:
    """``(type, why)`` of a column nobody typed: ``"numeric"`` or ``"categorical"`` from its dtype.

    Numbers are numeric, except a private column holding at most :data:`LOW_CARDINALITY`
    distinct integers (a flag or a small code), which is categorical; text and booleans are
    categorical. A text column whose values are nearly all numbers (:data:`NUMERIC_SHARE`) is a
    typing surprise: a DataValidationError names the column, the first offending rows and their
    values, and how to declare the type. ``line_offset`` turns row numbers into file lines
    (2 for a CSV with a header; None for Parquet).
    """
    if pd.api.types.is_bool_dtype(series):
        return "categorical", "true/false values"
    if pd.api.types.is_numeric_dtype(series):
        if private:
            distinct = np.unique(series.dropna().to_numpy(dtype=np.float64))
            if distinct.size <= LOW_CARDINALITY and np.all(np.isfinite(distinct) & (distinct == np.round(distinct))):
                return "categorical", f"private with {distinct.size} distinct integer values"
        return "numeric", f"dtype {series.dtype}"
    text = series.astype(str).str.strip()
    present = (series.notna() & (text != "")).to_numpy()
    numbers = pd.to_numeric(text.where(present), errors="coerce").notna().to_numpy() & present
    n_present, n_numbers = int(present.sum()), int(numbers.sum())
    if n_present and n_numbers >= NUMERIC_SHARE * n_present:
        odd = present & ~numbers
        if not odd.any():
            return "numeric", "numbers stored as text"
        first = int(np.flatnonzero(odd)[0])
        others = np.flatnonzero(odd)[1:5]
        more = "" if not others.size else (
            f"; also {', '.join(f'{_where_row(int(r), line_offset)}: {series.iloc[int(r)]!r}' for r in others)}"
            + (", ..." if odd.sum() > 5 else "")
        )  # fmt: skip
        raise DataValidationError(
            f"column {column!r} looks numeric ({n_numbers} of {n_present} values are numbers) but "
            f"{_where_row(first, line_offset)} holds {series.iloc[first]!r} ({int(odd.sum())} non-numeric "
            f"value(s){more}). Fix or remove those values and declare it numeric (--numeric {column}, numeric=[...], "
            f'or "type": "numeric" in a schema), or declare it categorical (--categorical {column}, '
            "categorical=[...]) if the numbers are codes"
        )
    return "categorical", f"dtype {series.dtype}"


#: what a missing categorical value becomes under ``missing="category"`` (or ``"impute"``)
MISSING_CATEGORY = "(missing)"
#: the checks for identifier-like columns and copies of the label need at least this many values
FLAG_MIN_ROWS = 50
#: a text column with more than this share of distinct values is identifier-like
ID_DISTINCT_SHARE = 0.9
#: a public column that predicts the label this well by itself (value -> majority class) is a copy of it
LABEL_COPY_ACCURACY = 0.98
_DATE = re.compile(r"^\d{1,4}[-/.]\d{1,2}[-/.]\d{1,4}([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?$")


class ColumnWarning(UserWarning):
    """Columns that look like identifiers or copies of the label; ``columns`` maps each to why.

    Shown to the analyst only: nothing of it is recorded in a dataset or a run.
    """

    def __init__(self, message: str, columns: Mapping[str, str]) -> None:
        super().__init__(message)
        self.columns = dict(columns)


def identifier_reason(series: pd.Series) -> str | None:
    """Why a column looks like an identifier rather than a feature, or None.

    With at least :data:`FLAG_MIN_ROWS` values: text that is date-like, free text (a median of
    four or more words), or more than :data:`ID_DISTINCT_SHARE` distinct; integers that are all
    distinct and in order (record numbers). The reason names counts, never values.
    """
    present = series.dropna()
    n = len(present)
    if n < FLAG_MIN_ROWS or pd.api.types.is_bool_dtype(series):
        return None
    if pd.api.types.is_numeric_dtype(series):
        values = present.to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(values) & (values == np.round(values))) or np.unique(values).size < n:
            return None
        if present.is_monotonic_increasing or present.is_monotonic_decreasing:
            return f"record numbers: {n} distinct integers in order"
        return None
    text = present.astype(str).str.strip()
    sample = text.iloc[:2000]  # enough to tell a date or a sentence, and cheap on a large file
    if sample.str.fullmatch(_DATE).mean() >= ID_DISTINCT_SHARE:
        return "date-like text"
    if sample.str.split().str.len().median() >= 4:
        return "free text"
    distinct = int(text.nunique())
    if distinct > ID_DISTINCT_SHARE * n:
        return f"identifier-like: {distinct} distinct values in {n} rows"
    return None


def label_copy_accuracy(series: pd.Series, labels: pd.Series) -> float | None:
    """How well ``series`` alone predicts ``labels`` (each value, or numeric bin, to its majority class).

    None when it cannot say (fewer than :data:`FLAG_MIN_ROWS` rows, or so many distinct values
    that the mapping would only memorise: more than one per 10 rows). Numbers with many values
    are cut into up to 50 quantile bins, which catches a threshold of the label.
    """
    mask = series.notna().to_numpy() & labels.notna().to_numpy()
    n = int(mask.sum())
    if n < FLAG_MIN_ROWS:
        return None
    x, y = series[mask], labels[mask].astype(str).to_numpy()
    distinct = int(x.nunique())
    if distinct > n // 10:
        if not pd.api.types.is_numeric_dtype(x) or pd.api.types.is_bool_dtype(x):
            return None
        keys = pd.qcut(x.to_numpy(dtype=np.float64), min(50, n // 10), labels=False, duplicates="drop")
    else:
        keys = x.astype(str).to_numpy()
    counts = pd.DataFrame({"k": keys, "y": y}).value_counts()
    return float(counts.groupby(level=0).max().sum()) / n


def flag_columns(df: pd.DataFrame, label: str, columns: Sequence[str], *, public: Sequence[str] = ()) -> dict[str, str]:
    """The columns of ``columns`` that look like identifiers, or (the ``public`` ones) copies of the label.

    Maps each to why (:func:`identifier_reason`; "predicts ... by itself" when
    :func:`label_copy_accuracy` is at least :data:`LABEL_COPY_ACCURACY` and errs at most a quarter
    as often as always guessing the majority class). Pass ``public=()`` when the label is private.
    """
    flags: dict[str, str] = {}
    base_error: float | None = None
    for c in columns:
        why = identifier_reason(df[c])
        if why is not None:
            flags[c] = why
            continue
        if c not in public:
            continue
        acc = label_copy_accuracy(df[c], df[label])
        if acc is None or acc < LABEL_COPY_ACCURACY:
            continue
        if base_error is None:
            shares = df[label].dropna().astype(str).value_counts(normalize=True)
            base_error = 1.0 - float(shares.iloc[0]) if len(shares) else 0.0
        if 1.0 - acc <= 0.25 * base_error:
            flags[c] = f"predicts {label!r} with {acc:.1%} accuracy by itself"
    return flags


def _flag_text(where: str, flags: Mapping[str, str]) -> str:
    return (
        f"{where}: column(s) that look like identifiers or copies of the label (a model memorises them, and its "
        f"accuracy then means little): {'; '.join(f'{c} ({why})' for c, why in flags.items())}. Check them and "
        f'leave them out with --drop {",".join(flags)} (drop= in Python, "type": "drop" in a schema)'
    )


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


def load_table(  # noqa: C901  (being split; the lead drops this)
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
    """
    sch = None if schema is None else read_schema(schema)
    if label is None and sch is not None:
        label = sch.label
    if not isinstance(label, str) or not label:
        raise TypeError(f"label must be a column name, got {label!r}")
    if sch is not None and label != sch.label:
        raise DataValidationError(f"label {label!r} differs from the label {sch.label!r} of the {sch.where}")
    check_open_unit("test_fraction", test_fraction)
    check_int("seed", seed, minimum=0)
    read_header(path)  # a repeated column name is an error (read_table would rename the copy)
    df = read_table(path, rows=rows)
    if df.empty:
        raise DataValidationError(f"path {str(path)!r} has no rows")
    df.columns = [str(c) for c in df.columns]
    if label not in df.columns:
        raise DataValidationError(f"unknown label column {label!r}; available columns: {list(df.columns)}")
    num = _as_list("numeric", numeric) or []
    cat = _as_list("categorical", categorical) or []
    dropped = _as_list("drop", drop) or []
    unknown = [c for c in [*num, *cat, *dropped] if c not in df.columns]
    if unknown:
        raise DataValidationError(f"unknown column(s) {unknown}; available columns: {list(df.columns)}")
    if sch is not None:
        absent = [c for c in sch.columns if c not in df.columns]
        if absent:
            raise DataValidationError(f"the {sch.where} lists column(s) {absent} that {str(path)!r} does not have")
        unlisted = [c for c in df.columns if c != label and c not in sch.columns and c not in [*num, *cat, *dropped]]
        if unlisted:
            raise DataValidationError(
                f"column(s) {unlisted} of {str(path)!r} are not in the {sch.where}; add them (type numeric, "
                'categorical or "drop")'
            )
        dropped += [c for c in sch.drop if c not in num and c not in cat]
    features = [c for c in df.columns if c != label and c not in dropped]
    priv = _as_list("private", private)
    pub = _as_list("public", public)
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
    priv = check_private_set(priv or [], features, label)
    # Read to warn the analyst only (nothing of it is recorded): the private label is not compared.
    flags = flag_columns(df, label, features,
                         public=[] if label in priv else [c for c in features if c not in priv])  # fmt: skip
    if flags:
        warnings.warn(ColumnWarning(_flag_text(Path(path).name, flags), flags), stacklevel=2)

    # Types and public statistics: the arguments, then the schema, then the dtypes.
    bounds_all: dict[str, tuple[float, float]] = {}
    cats_all: dict[str, Sequence[str]] = {}
    given_from_data: dict[str, str] = {}
    logs = list(log1p)
    classes_given = _as_classes(classes)
    pending: list[str] = []
    types: dict[str, str] = {}
    inferred: dict[str, str] = {}
    line_offset = None if _kind(path) == "parquet" else 2
    for c in features:
        entry = None if sch is None else sch.columns.get(c)
        if c in num or c in cat:
            types[c] = "numeric" if c in num else "categorical"
        elif entry is not None and entry.type is not None:
            types[c] = entry.type
        elif entry is not None:
            pending.append(f"{c} (type)")
            continue
        elif bounds and c in bounds:
            types[c] = "numeric"
        elif categories and c in categories:
            types[c] = "categorical"
        else:
            types[c], inferred[c] = infer_column_type(df[c], c, private=c in priv, line_offset=line_offset)
        if entry is None:
            continue
        if types[c] == "numeric":
            if entry.bounds is not None and not (bounds and c in bounds):
                bounds_all[c] = entry.bounds
                if entry.from_data:
                    given_from_data[c] = "bounds"
            elif "bounds" in entry.pending and not (bounds and c in bounds):
                pending.append(f"{c} (bounds)")
            if entry.log1p:
                logs.append(c)
        else:
            if entry.categories is not None and not (categories and c in categories):
                cats_all[c] = list(entry.categories)
                if entry.from_data:
                    given_from_data[c] = "categories"
            elif "categories" in entry.pending and not (categories and c in categories):
                pending.append(f"{c} (categories)")
    if sch is not None and classes_given is None:
        classes_given = sch.classes
        if sch.classes is not None and sch.classes_from_data:
            given_from_data[label] = "classes"
        elif sch.label_pending and label in priv:
            pending.append(f"{label} (classes)")
    if pending:
        assert sch is not None
        raise DataValidationError(
            f"the {sch.where} still has placeholders for {', '.join(pending)}: write the public values (the "
            "type; the bounds of a numeric column or the categories of a categorical one, from a codebook or the "
            "data's documentation; the label's classes), or null for a statistic to compute it from the data (a "
            "PrivacyLeakWarning for a private column); see docs/own-data.md"
        )
    bounds_all.update(bounds or {})
    cats_all.update(categories or {})
    if test is not None:
        read_header(test)
        test_df = read_table(test)
        test_df.columns = [str(c) for c in test_df.columns]
    modes, fills = _missing_modes(missing, fill, sch, [*features, label])
    data_key, test_key = repr(Path(path).name), f"the test file {Path(test).name!r}" if test is not None else ""
    frames = {data_key: df, **({test_key: test_df} if test is not None else {})}
    frames, computed_fills = _handle_missing(frames, label=label, types=types, private=priv, modes=modes,
                                             fills=fills, categories=cats_all, sharded=rows is not None)  # fmt: skip
    df = frames[data_key]
    if test is not None:
        test_df = frames[test_key]
    if inferred and (num or cat):
        warnings.warn(
            f"{Path(path).name}: column(s) not listed in numeric=/categorical= were typed from their dtypes: "
            f"{_types_text(types, inferred)}; list them, or drop= the ones to leave out",
            UserWarning,
            stacklevel=2,
        )
    spec = TableSpec(
        label=label,
        numeric=tuple(c for c in features if types.get(c) == "numeric"),
        categorical=tuple(c for c in features if types.get(c) == "categorical"),
        private=tuple(priv),
        bounds=bounds_all,
        categories=cats_all,
        log1p=tuple(dict.fromkeys(logs)),
        classes=classes_given,
        given_from_data=given_from_data,
        inferred_types=tuple(inferred),
    )
    if rows is not None:
        undeclared = [f"{c} (type)" for c in inferred] + [
            f"{c} ({'bounds' if types.get(c) == 'numeric' else 'categories'})"
            for c in features if c not in bounds_all and c not in cats_all
        ] + ([f"{label} (classes)"] if classes_given is None else []) + [
            f"{c} (fill)" for c in computed_fills
        ]  # fmt: skip
        if undeclared:
            raise DataValidationError(
                f"rows={rows!r} loads one shard, and every shard must be encoded alike, but these are not declared "
                f"and would be read from the shard: {', '.join(undeclared)}; declare them in a schema "
                "(featuredp data schema, docs/own-data.md)"
            )
    # Rows are counted in the whole file here (the split below renumbers them).
    validate_frame(df, spec, where=repr(Path(path).name))
    if test is not None:
        train_df = df
    else:
        tr_idx, te_idx = seeded_split(len(df), test_fraction, seed)
        train_df, test_df = df.iloc[tr_idx].reset_index(drop=True), df.iloc[te_idx].reset_index(drop=True)
    warn_small_test(len(test_df), f"the test split of {Path(path).name}" if test is None else f"{Path(test).name}")
    desc = f"user table {Path(path).name}" + (f" (test: {Path(test).name})" if test is not None else "")
    if sch is not None:
        desc += f"; {sch.where}"
    if inferred:
        desc += f"; typed from dtypes: {_types_text(types, inferred)}"
    return encode_frames(train_df, test_df, spec, name=name or Path(path).stem, description=desc, categorical=encoding)


def _missing_modes(
    missing: str | Mapping[str, str] | None,
    fill: Mapping[str, float] | None,
    sch: Schema | None,
    columns: Sequence[str],
) -> tuple[dict[str, str | None], dict[str, float]]:
    """Each column's missing-value mode (None: not handled) and the public fill values given."""
    if isinstance(missing, Mapping):
        per_column, default = dict(missing), None
    elif missing is None or isinstance(missing, str):
        per_column, default = {}, missing
    else:
        raise TypeError(f"missing must be one of {list(MISSING_MODES)} or a dict of column to mode, got {missing!r}")
    odd = {c: m for c, m in [*per_column.items(), ("", default)] if m is not None and m not in MISSING_MODES}
    if odd:
        raise ValueError(f"missing must be one of {list(MISSING_MODES)}, got {next(iter(odd.values()))!r}")
    unknown = [c for c in [*per_column, *(fill or {})] if c not in columns]
    if unknown:
        raise DataValidationError(f"missing=/fill= name unknown column(s) {unknown}; known columns: {list(columns)}")
    given: dict[str, float] = {}
    for c, v in (fill or {}).items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v):
            raise ValueError(f"fill[{c!r}] must be a finite number, got {v!r}")
        given[c] = float(v)
    modes: dict[str, str | None] = {}
    for c in columns:
        entry = None if sch is None else sch.columns.get(c)
        if entry is not None and entry.fill is not None and c not in given:
            given[c] = entry.fill
        modes[c] = (
            per_column.get(c) or (entry.missing if entry is not None else None)
            or ("impute" if c in given else None) or default or (sch.missing if sch is not None else None)
        )  # fmt: skip
    return modes, given


def _handle_missing(
    frames: dict[str, pd.DataFrame],
    *,
    label: str,
    types: Mapping[str, str],
    private: Sequence[str],
    modes: Mapping[str, str | None],
    fills: Mapping[str, float],
    categories: dict[str, Sequence[str]],
    sharded: bool,
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Apply the missing-value modes to the frames (the --data file first); the columns whose fill was computed.

    Declared category lists of columns that give missing values their own category get
    :data:`MISSING_CATEGORY` whether or not a value is missing, so that the encoding of a
    private column does not depend on its values.
    """
    for c, kind in types.items():
        if (
            kind == "categorical" and modes.get(c) in ("impute", "category") and c in categories
            and MISSING_CATEGORY not in [category_string(v) for v in categories[c]]
        ):  # fmt: skip
            categories[c] = [*categories[c], MISSING_CATEGORY]
    used = [*types, label]
    counts = {c: sum(int(f[c].isna().sum()) for f in frames.values() if c in f.columns) for c in used}
    counts = {c: k for c, k in counts.items() if k}
    if not counts:
        return frames, []
    where = " and ".join(frames)
    unhandled = [c for c in counts if modes.get(c) is None]
    if unhandled:
        raise DataValidationError(
            f"{where} has missing values in {len(unhandled)} column(s): "
            f"{', '.join(f'{c} ({counts[c]} missing)' for c in unhandled)}; say what to do with them: --missing "
            "drop (the rows), impute (numbers: a public fill value; categories: their own) or category (missing= in "
            'Python, "missing" in a schema; docs/own-data.md), or leave the columns out with --drop'
        )
    numeric_category = [c for c in counts if c != label and types[c] == "numeric" and modes[c] == "category"]
    if numeric_category:
        raise DataValidationError(
            f"missing 'category' gives categorical columns their own category, but the numeric column(s) "
            f"{numeric_category} have missing values: impute them (a fill value) or drop the rows"
        )
    drop_cols = [c for c in counts if c == label or modes[c] == "drop"]
    impute = [c for c in counts if c != label and types[c] == "numeric" and modes[c] == "impute"]
    own = [c for c in counts if c != label and types[c] == "categorical" and modes[c] in ("impute", "category")]
    out: dict[str, pd.DataFrame] = {}
    report: list[str] = []
    for key, f in frames.items():
        cols = [c for c in drop_cols if c in f.columns]
        if cols:
            gone = f[cols].isna().any(axis=1).to_numpy()
            if gone.any():
                report.append(f"{int(gone.sum())} of {len(f)} rows of {key}")
                f = f[~gone].reset_index(drop=True)
            if f.empty:
                raise DataValidationError(f"{key} has no rows left after dropping those with a missing value in {cols}")
        out[key] = f
    if report:
        decided = [c for c in drop_cols if c in private]
        text = f"dropped {' and '.join(report)} with a missing value in {drop_cols}"
        if decided:
            warnings.warn(
                f"{text}: whether a record is used then depends on its private value of {decided}, which the "
                "feature-DP guarantee does not cover; impute those columns with a public fill value or give them "
                "their own category instead",
                PrivacyLeakWarning,
                stacklevel=3,
            )
        else:
            warnings.warn(text, UserWarning, stacklevel=3)
    first = next(iter(out.values()))
    values: dict[str, float] = {}
    computed: list[str] = []
    for c in impute:
        if c in fills:
            values[c] = fills[c]
            continue
        present = pd.to_numeric(first[c], errors="coerce").dropna()
        values[c] = float(present.median()) if len(present) else 0.0
        computed.append(c)
    leaked = [c for c in computed if c in private]
    if leaked and not sharded:  # sharded: an error names them instead
        warnings.warn(
            f"the fill value (median) of private column(s) {leaked} was computed from the data: it is not covered "
            'by the privacy guarantee; give a public one ("fill" in the schema, fill= in Python) to avoid this',
            PrivacyLeakWarning,
            stacklevel=3,
        )
    for key, f in out.items():
        f = f.copy()
        for c, v in values.items():
            if c in f.columns:
                f[c] = f[c].fillna(v)
        for c in own:
            if c in f.columns:
                gaps = f[c].isna()
                f[c] = f[c].map(category_string).where(~gaps, MISSING_CATEGORY)
        out[key] = f
    return out, computed


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
    ``"note"``. Both are reported in one :class:`ColumnWarning`.
    """
    header = read_header(path)
    if label not in header:
        raise DataValidationError(f"unknown label column {label!r}; available columns: {header}")
    priv = _as_list("private", private) or []
    num = _as_list("numeric", numeric) or []
    cat = _as_list("categorical", categorical) or []
    dropped = _as_list("drop", drop) or []
    for what, cols in (("private", priv), ("numeric", num), ("categorical", cat), ("drop", dropped)):
        unknown = [c for c in cols if c not in header]
        if unknown:
            raise DataValidationError(f"unknown {what} column(s) {unknown}; available columns: {header}")
    both = sorted(set(num) & set(cat))
    if both:
        raise DataValidationError(f"column(s) {both} declared both numeric and categorical")
    label_private = label in priv
    public_cols = [c for c in header if c != label and c not in priv and c not in dropped]
    df = read_table(path, columns=[*public_cols, *([] if label_private else [label])])
    df.columns = [str(c) for c in df.columns]
    line_offset = None if _kind(path) == "parquet" else 2
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
            kind = "numeric" if c in num else "categorical" if c in cat else None
            entry: dict[str, Any] = {"type": kind or TYPE_PLACEHOLDER, "private": True}
            if kind in (None, "numeric"):
                entry["bounds"] = BOUNDS_PLACEHOLDER
            if kind in (None, "categorical"):
                entry["categories"] = CATEGORIES_PLACEHOLDER
            columns[c] = entry
            fields = [k for k in ("type", "bounds", "categories") if is_placeholder(entry.get(k))]
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
        if kind == "numeric":
            values = pd.to_numeric(s, errors="raise").dropna().to_numpy(dtype=np.float64)
            lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
            columns[c] = {"type": "numeric", "private": False, "bounds": [_plain_number(lo), _plain_number(hi)],
                          "from_data": True}  # fmt: skip
        else:
            cats = sorted({category_string(v) for v in s.dropna().tolist()})
            columns[c] = {"type": "categorical", "private": False, "categories": cats, "from_data": True}
    if not label_private:
        kept = [c for c in public_cols if c not in flags]
        for c, why in flag_columns(df, label, kept, public=kept).items():
            flags[c] = why
            columns[c]["note"] = f"{why}: a copy of the label? Make it \"type\": \"drop\" unless it is known at " \
                                 "prediction time"  # fmt: skip
    if flags:
        warnings.warn(ColumnWarning(_flag_text(Path(path).name, flags), flags), stacklevel=2)
    label_entry: dict[str, Any] = {"name": label, "private": label_private}
    if label_private:
        label_entry["classes"] = CLASSES_PLACEHOLDER
        todo.append(f"{label} (classes)")
    else:
        label_entry["classes"] = sorted({category_string(v) for v in df[label].dropna().tolist()})
        label_entry["from_data"] = True
    schema = {"featuredp_schema": SCHEMA_FORMAT, "source": Path(path).name, "label": label_entry, "columns": columns}
    read_schema(schema)  # what we write must load
    return schema, todo


def _plain_number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x
