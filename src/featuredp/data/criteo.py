"""Criteo display-ads (your TSV) and Criteo-style (a stand-in built from Census-Income).

Criteo's Kaggle/day-N files are tab-separated without a header: the click
label, 13 integer features ``I1..I13`` and 26 hashed categorical features
``C1..C26`` (hex strings); any field may be empty. :func:`load_criteo` applies
the usual preprocessing: integers become ``log(1 + x)`` for ``x > 0`` and 0
otherwise (missing → 0), then are scaled to [0, 1] by the training minimum and
maximum — statistics of the data, recorded in ``statistics_from_data`` (pass
public ``bounds=`` instead before making an integer column private);
categorical values (the empty value included) are hashed with a stable hash
(CRC-32 of ``"<column>:<value>"``) into ``hash_buckets`` buckets per column and
returned as codes in ``X_cat`` — hashing reads no data, so it leaks nothing.
Default split (paper §6.2): the label and the 13 integer columns public, the
26 categorical columns private.

**Criteo-style** is Census-Income (KDD) with the same shape of problem: the 7
numeric columns and the income label public, all 33 categorical columns
private, categoricals as ``X_cat`` codes for a logistic regression with sparse
embeddings; by default 40,000 train / 10,000 test rows (the paper's Criteo sizes).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from featuredp._validate import check_int, check_open_unit
from featuredp.data.census import CENSUS_NUMERIC, census_frames, load_census_income
from featuredp.data.census import LABEL as CENSUS_LABEL
from featuredp.data.tabular import (
    CategoricalEncoding,
    TableSpec,
    TabularDataset,
    check_private_set,
    encode_frames,
    seeded_split,
)
from featuredp.errors import DataValidationError

INT_COLUMNS = [f"I{i}" for i in range(1, 14)]
CAT_COLUMNS = [f"C{i}" for i in range(1, 27)]
CRITEO_COLUMNS = ["click", *INT_COLUMNS, *CAT_COLUMNS]


def hash_bucket(column: str, values: Sequence[str], buckets: int) -> np.ndarray:
    """Stable bucket of each value: CRC-32 of ``"<column>:<value>"`` modulo ``buckets``."""
    prefix = f"{column}:".encode()
    return np.fromiter((zlib.crc32(prefix + v.encode()) % buckets for v in values), dtype=np.int64, count=len(values))


def read_criteo(path: str | os.PathLike[str], *, max_rows: int | None = None) -> pd.DataFrame:
    """Read a Criteo TSV (40 tab-separated fields, no header) with empty fields kept as ``""``."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(p)!r} does not exist or is not a file")
    df = pd.read_csv(p, sep="\t", header=None, dtype=str, keep_default_na=False, nrows=max_rows, quoting=3)
    if df.shape[1] != len(CRITEO_COLUMNS):
        raise DataValidationError(
            f"{p.name}: expected {len(CRITEO_COLUMNS)} tab-separated fields (label, 13 integer, 26 categorical), "
            f"got {df.shape[1]}"
        )
    df.columns = CRITEO_COLUMNS
    bad = ~df["click"].isin(["0", "1"])
    if bad.any():
        rows = np.flatnonzero(bad.to_numpy())
        raise DataValidationError(f"{p.name}: {int(bad.sum())} label value(s) are not 0/1 (rows {rows[:5].tolist()})")
    for col in INT_COLUMNS:
        raw = df[col]
        num = pd.to_numeric(raw.replace("", "0"), errors="coerce")
        bad = num.isna().to_numpy()
        if bad.any():
            rows = np.flatnonzero(bad)
            raise DataValidationError(
                f"{p.name}: column {col} has {int(bad.sum())} non-integer value(s) (rows {rows[:5].tolist()})"
            )
        df[col] = num.astype(np.float64)
    return df


def load_criteo(
    *,
    path: str | os.PathLike[str],
    hash_buckets: int = 1000,
    private: Sequence[str] | None = None,
    test_fraction: float = 0.2,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    max_rows: int | None = None,
    categorical: CategoricalEncoding = "codes",
    bounds: Mapping[str, tuple[float, float]] | None = None,
) -> tuple[TabularDataset, TabularDataset]:
    """Your Criteo TSV as (train, test): ``X`` = 13 scaled log-counts, ``X_cat`` = hashed C1..C26.

    ``bounds`` gives public raw ranges of integer columns (before ``log1p``); the others
    are scaled by the training minimum and maximum (recorded in ``statistics_from_data``).
    """
    buckets = check_int("hash_buckets", hash_buckets, minimum=2)
    check_open_unit("test_fraction", test_fraction)
    df = read_criteo(path, max_rows=max_rows)
    for col in CAT_COLUMNS:
        df[col] = hash_bucket(col, df[col].tolist(), buckets).astype(str)
    tr_idx, te_idx = seeded_split(len(df), test_fraction, seed)
    rng = np.random.default_rng(seed + 1)
    if n_train is not None:
        n_train = check_int("n_train", n_train, minimum=1)
        if n_train > len(tr_idx):
            raise ValueError(f"n_train must be <= {len(tr_idx)} (the training rows available), got {n_train}")
        tr_idx = np.sort(rng.choice(tr_idx, n_train, replace=False))
    if n_test is not None:
        n_test = check_int("n_test", n_test, minimum=1)
        if n_test > len(te_idx):
            raise ValueError(f"n_test must be <= {len(te_idx)} (the test rows available), got {n_test}")
        te_idx = np.sort(rng.choice(te_idx, n_test, replace=False))
    priv = check_private_set(CAT_COLUMNS if private is None else list(private), INT_COLUMNS + CAT_COLUMNS, "click")
    spec = TableSpec(
        label="click",
        numeric=tuple(INT_COLUMNS),
        categorical=tuple(CAT_COLUMNS),
        private=tuple(priv),
        bounds=dict(bounds or {}),
        # Hash buckets are fixed by hash_buckets alone: these category lists read no data.
        categories={c: [str(b) for b in range(buckets)] for c in CAT_COLUMNS},
        log1p=tuple(INT_COLUMNS),
        classes=["0", "1"],
    )
    desc = (
        f"Criteo display-ads from {Path(path).name}: 13 integer features (log1p, scaled), 26 categorical hashed into "
        f"{buckets} buckets. Private: {', '.join(priv) if len(priv) < 8 else f'{len(priv)} columns'}."
    )
    return encode_frames(
        df.iloc[tr_idx].reset_index(drop=True), df.iloc[te_idx].reset_index(drop=True), spec,
        name="criteo", description=desc, categorical=categorical,
    )  # fmt: skip


def load_criteo_style(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    n_train: int | None = 40_000,
    n_test: int | None = 10_000,
    seed: int = 0,
    categorical: CategoricalEncoding = "codes",
    frames: tuple[pd.DataFrame, pd.DataFrame] | None = None,
) -> tuple[TabularDataset, TabularDataset]:
    """Criteo-style (train, test) from Census-Income: numeric + label public, categorical private."""
    raw = frames if frames is not None else census_frames(cache_dir)
    categoricals = [c for c in raw[0].columns if c not in CENSUS_NUMERIC and c != CENSUS_LABEL]
    train, test = load_census_income(
        private=categoricals, categorical=categorical, n_train=n_train, n_test=n_test, seed=seed, frames=raw
    )
    desc = (
        "Criteo-style: Census-Income (KDD) (UCI, CC BY 4.0) shaped like the paper's Criteo task: "
        f"{len(CENSUS_NUMERIC)} numeric columns and the income label public, {len(categoricals)} categorical columns "
        f"private (X_cat codes); {train.n} train / {test.n} test rows."
    )
    return replace(train, name="criteo-style", description=desc), replace(test, name="criteo-style", description=desc)
