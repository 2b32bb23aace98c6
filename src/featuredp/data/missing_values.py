"""Missing values of a user table: each column's mode (``drop``, ``impute``, ``category``) from the arguments and
the schema (:func:`missing_modes`), applied to the data and test frames alike (:func:`handle_missing`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from featuredp.data.schema import MISSING_MODES, Schema
from featuredp.data.tabular import category_string
from featuredp.errors import DataValidationError, PrivacyLeakWarning

__all__ = ["MISSING_CATEGORY", "handle_missing", "missing_modes"]

#: what a missing categorical value becomes under ``missing="category"`` (or ``"impute"``)
MISSING_CATEGORY = "(missing)"


def missing_modes(
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


def handle_missing(
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
    _add_missing_category(types, modes, categories)
    used = [*types, label]
    counts = {c: sum(int(f[c].isna().sum()) for f in frames.values() if c in f.columns) for c in used}
    counts = {c: k for c, k in counts.items() if k}
    if not counts:
        return frames, []
    _check_handled(counts, " and ".join(frames), label=label, types=types, modes=modes)
    drop_cols = [c for c in counts if c == label or modes[c] == "drop"]
    impute = [c for c in counts if c != label and types[c] == "numeric" and modes[c] == "impute"]
    own = [c for c in counts if c != label and types[c] == "categorical" and modes[c] in ("impute", "category")]
    out = _drop_rows(frames, drop_cols, private)
    values, computed = _fill_values(next(iter(out.values())), impute, fills, private, sharded)
    return _filled(out, values, own), computed


def _add_missing_category(
    types: Mapping[str, str], modes: Mapping[str, str | None], categories: dict[str, Sequence[str]]
) -> None:
    for c, kind in types.items():
        if (
            kind == "categorical" and modes.get(c) in ("impute", "category") and c in categories
            and MISSING_CATEGORY not in [category_string(v) for v in categories[c]]
        ):  # fmt: skip
            categories[c] = [*categories[c], MISSING_CATEGORY]


def _check_handled(
    counts: Mapping[str, int], where: str, *, label: str, types: Mapping[str, str], modes: Mapping[str, str | None]
) -> None:
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


def _drop_rows(
    frames: dict[str, pd.DataFrame], drop_cols: list[str], private: Sequence[str]
) -> dict[str, pd.DataFrame]:
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
        # stacklevel 4: past this helper and handle_missing, to load_table's caller
        if decided:
            warnings.warn(
                f"{text}: whether a record is used then depends on its private value of {decided}, which the "
                "feature-DP guarantee does not cover; impute those columns with a public fill value or give them "
                "their own category instead",
                PrivacyLeakWarning,
                stacklevel=4,
            )
        else:
            warnings.warn(text, UserWarning, stacklevel=4)
    return out


def _fill_values(
    first: pd.DataFrame, impute: list[str], fills: Mapping[str, float], private: Sequence[str], sharded: bool
) -> tuple[dict[str, float], list[str]]:
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
            stacklevel=4,  # past this helper and handle_missing, to load_table's caller
        )
    return values, computed


def _filled(out: dict[str, pd.DataFrame], values: Mapping[str, float], own: list[str]) -> dict[str, pd.DataFrame]:
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
    return out
