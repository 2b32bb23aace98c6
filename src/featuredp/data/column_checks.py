"""What the loader reads off a column's values: its type (:func:`infer_column_type`), and whether it looks like
an identifier or a copy of the label (:func:`flag_columns`, reported in one :class:`ColumnWarning`, for the analyst
only: nothing of it is recorded in a dataset or a run).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from featuredp.errors import DataValidationError

__all__ = [
    "FLAG_MIN_ROWS",
    "ID_DISTINCT_SHARE",
    "LABEL_COPY_ACCURACY",
    "LOW_CARDINALITY",
    "NUMERIC_SHARE",
    "ColumnWarning",
    "flag_columns",
    "flag_text",
    "identifier_reason",
    "infer_column_type",
    "label_copy_accuracy",
]


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


def flag_text(where: str, flags: Mapping[str, str]) -> str:
    """The :class:`ColumnWarning` message for ``flags`` found in ``where`` (a file name)."""
    return (
        f"{where}: column(s) that look like identifiers or copies of the label (a model memorises them, and its "
        f"accuracy then means little): {'; '.join(f'{c} ({why})' for c, why in flags.items())}. Check them and "
        f'leave them out with --drop {",".join(flags)} (drop= in Python, "type": "drop" in a schema)'
    )
