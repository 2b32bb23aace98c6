"""Your own CSV or Parquet table, with a column spec::

    train, test = load_table("people.csv", label="income", numeric=["age", "hours"],
                             categorical=["sex", "race", "job"], private=["sex", "race"])

Either ``private`` or ``public`` is given (the other is the complement of the
feature columns); the label is public unless it is listed in ``private``.
``bounds``, ``categories`` and ``classes`` (the label's class list) are public
knowledge; whatever they do not cover is computed from the training data and
recorded in ``statistics_from_data`` (a ``PrivacyLeakWarning`` when the column
is private, now or when Ψ is bound for training).
Numeric and categorical columns default to every non-label column, split by
dtype. Without ``test``, a fixed seeded split holds out ``test_fraction``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from featuredp._validate import check_int, check_open_unit
from featuredp.data.tabular import (
    CategoricalEncoding,
    TableSpec,
    TabularDataset,
    check_private_set,
    encode_frames,
    seeded_split,
)
from featuredp.errors import DataValidationError


def read_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a ``.csv``/``.csv.gz``/``.tsv`` or ``.parquet`` file into a DataFrame."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(p)!r} does not exist or is not a file")
    suffixes = "".join(p.suffixes).lower()
    if suffixes.endswith(".parquet") or suffixes.endswith(".pq"):
        return pd.read_parquet(p)
    if ".tsv" in suffixes:
        return pd.read_csv(p, sep="\t")
    if ".csv" in suffixes:
        return pd.read_csv(p)
    raise ValueError(f"path {str(p)!r}: unsupported file type (use .csv, .csv.gz, .tsv or .parquet)")


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
    label: str,
    numeric: Sequence[str] | str | None = None,
    categorical: Sequence[str] | str | None = None,
    private: Sequence[str] | str | None = None,
    public: Sequence[str] | str | None = None,
    test: str | os.PathLike[str] | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    bounds: Mapping[str, tuple[float, float]] | None = None,
    categories: Mapping[str, Sequence[str]] | None = None,
    classes: Sequence[object] | str | None = None,
    log1p: Sequence[str] = (),
    encoding: CategoricalEncoding = "onehot",
    name: str | None = None,
) -> tuple[TabularDataset, TabularDataset]:
    """Load a user table as ``(train, test)``; errors name the column and the problem.

    ``private``/``public`` are raw column names (the label may be listed in
    ``private``). ``bounds`` and ``categories`` are public knowledge used for
    scaling and one-hot encoding; ``classes`` is the label's declared class list
    (in this order; a label value outside it is a DataValidationError). Without
    them the statistics come from the training data and are recorded in the
    datasets' ``statistics_from_data``; for a private column (or label) that is a
    PrivacyLeakWarning.
    """
    if not isinstance(label, str) or not label:
        raise TypeError(f"label must be a column name, got {label!r}")
    check_open_unit("test_fraction", test_fraction)
    check_int("seed", seed, minimum=0)
    df = read_table(path)
    if df.empty:
        raise DataValidationError(f"path {str(path)!r} has no rows")
    df.columns = [str(c) for c in df.columns]
    if label not in df.columns:
        raise DataValidationError(f"unknown label column {label!r}; available columns: {list(df.columns)}")
    num = _as_list("numeric", numeric)
    cat = _as_list("categorical", categorical)
    if num is None and cat is None:
        rest = [c for c in df.columns if c != label]
        num = [c for c in rest if pd.api.types.is_numeric_dtype(df[c])]
        cat = [c for c in rest if c not in num]
    num, cat = num or [], cat or []
    features = [*num, *cat]
    unknown = [c for c in features if c not in df.columns]
    if unknown:
        raise DataValidationError(f"unknown column(s) {unknown}; available columns: {list(df.columns)}")
    priv = _as_list("private", private)
    pub = _as_list("public", public)
    if priv is None and pub is None:
        raise ValueError("give private= (or public=): feature-DP needs the private columns declared")
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
    if test is not None:
        test_df = read_table(test)
        test_df.columns = [str(c) for c in test_df.columns]
        train_df = df
    else:
        tr_idx, te_idx = seeded_split(len(df), test_fraction, seed)
        train_df, test_df = df.iloc[tr_idx].reset_index(drop=True), df.iloc[te_idx].reset_index(drop=True)
    spec = TableSpec(
        label=label,
        numeric=tuple(num),
        categorical=tuple(cat),
        private=tuple(priv),
        bounds=dict(bounds or {}),
        categories=dict(categories or {}),
        log1p=tuple(log1p),
        classes=_as_classes(classes),
    )
    desc = f"user table {Path(path).name}" + (f" (test: {Path(test).name})" if test is not None else "")
    return encode_frames(train_df, test_df, spec, name=name or Path(path).stem, description=desc, categorical=encoding)
