"""The tabular dataset container and the encoder that turns raw tables into it.

Raw columns (what users name in ``--private sex,race``) are encoded as:

* numeric columns: optional ``log1p``, clipped to bounds and scaled to [0, 1];
* categorical columns: one-hot (``categorical="onehot"``, the default) or integer
  codes in ``X_cat`` for sparse models (``categorical="codes"``).

``feature_sources`` maps every encoded column back to its raw column, so a public
feature map can select columns by their raw name.

Privacy of the preprocessing (``docs/datasets.md``, "Encoding statistics"): scaling bounds and category
lists of a *private* column (and the class list of a private label) are
statistics of private data. They are fine when given by the user (or fixed
public knowledge such as a codebook), and raise
:class:`~featuredp.errors.PrivacyLeakWarning` when computed from the data.
Statistics of public columns are computed from Ψ(S), which is public anyway.

Which columns are private is only final when a feature map Ψ is bound for
training (``Columns(private=[...]).bind(train)``, ``featuredp train --private``),
which may differ from the set declared at load time. So every dataset records
the *provenance* of its encoding statistics in
:attr:`TabularDataset.statistics_from_data` (public columns included), and
:meth:`featuredp.features.Columns.bind` re-checks it against the Ψ actually used.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import pandas as pd

from featuredp._validate import check_choice
from featuredp.errors import DataValidationError, PrivacyLeakWarning, SmallSampleWarning

CategoricalEncoding = Literal["onehot", "codes"]
_MAX_LISTED = 5  # how many offending rows an error message lists

#: The encoding statistics whose provenance a dataset records, as the values of
#: :attr:`TabularDataset.statistics_from_data` (scaling bounds of a numeric column,
#: the category list of a categorical column, the class list of the label), each
#: with how a warning names it when it was computed from the data.
STATISTIC_KINDS: dict[str, str] = {
    "bounds": "min/max",
    "categories": "category list",
    "classes": "class list",
}


@dataclass
class TabularDataset:
    """An encoded table: features ``X``, labels ``y`` and where every column comes from.

    ``X`` is float32 ``(n, d)`` (scaled numeric columns and one-hot categoricals),
    ``y`` int64 ``(n,)`` with values in ``range(len(classes))``. ``X_cat`` (optional)
    holds int64 per-column category codes for sparse models; code
    ``cat_cardinalities[j] - 1`` is the reserved "unknown category" slot.
    ``default_private`` lists the raw columns the dataset declares private by
    default (it may contain ``label_name`` when the label is private).

    ``statistics_from_data`` records where the encoding statistics came from: it
    maps every raw column (or ``label_name``) whose statistic was *computed from
    the loaded data* to which one (``"bounds"``, ``"categories"`` or
    ``"classes"``, see :data:`STATISTIC_KINDS`), public and private columns alike.
    Columns not listed were encoded with public knowledge only (user-given
    ``bounds=``/``categories=``/``classes=``, a codebook, fixed constants, hashing)
    or need no statistic (binary features used as they are): their encoding is
    the same on every neighbouring dataset. Every loader fills it in; ``None``
    means "not recorded" (a dataset built by hand), which nothing can check.
    ``statistics_warned`` lists the entries of ``statistics_from_data`` that a
    :class:`~featuredp.errors.PrivacyLeakWarning` already reported at load time
    (the columns declared private then), so that binding Ψ does not repeat it.
    ``column_types`` maps every raw feature column to ``"numeric"`` or ``"categorical"``
    (None: not recorded) and ``inferred_types`` lists those whose type nobody declared
    (typed from the file's dtypes by the CSV/Parquet loader, see ``featuredp.data.files``).
    ``users``: each row's user (a user table's ``user_column``, never a feature), for ``user_key=``.
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    feature_names: list[str]
    feature_sources: list[str]
    label_name: str
    classes: list[str]
    X_cat: np.ndarray | None = None
    cat_sources: list[str] | None = None
    cat_cardinalities: list[int] | None = None
    description: str = ""
    default_private: list[str] | None = None
    statistics_from_data: dict[str, str] | None = None
    statistics_warned: list[str] = field(default_factory=list)
    column_types: dict[str, str] | None = None
    inferred_types: list[str] = field(default_factory=list)
    #: each row's user (``user_column``: the privacy unit of a user-level run); None: no user column
    users: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.statistics_from_data is not None:
            # A copy: datasets made by subset()/replace() must not share (and so co-mutate) one record.
            self.statistics_from_data = {str(k): str(v) for k, v in dict(self.statistics_from_data).items()}
            odd = {k: v for k, v in self.statistics_from_data.items() if v not in STATISTIC_KINDS}
            if odd:
                raise DataValidationError(
                    f"statistics_from_data values must be one of {list(STATISTIC_KINDS)}, got {odd}"
                )
        self.statistics_warned = [str(c) for c in self.statistics_warned]
        self.X = np.ascontiguousarray(self.X, dtype=np.float32)
        self.y = np.ascontiguousarray(self.y, dtype=np.int64)
        if self.X.ndim != 2:
            raise DataValidationError(f"X must be 2-dimensional, got shape {self.X.shape}")
        n, d = self.X.shape
        if self.y.shape != (n,):
            raise DataValidationError(f"y must have shape ({n},), got {self.y.shape}")
        if len(self.feature_names) != d or len(self.feature_sources) != d:
            raise DataValidationError(
                f"feature_names and feature_sources must have {d} entries, "
                f"got {len(self.feature_names)} and {len(self.feature_sources)}"
            )
        if n and (self.y.min() < 0 or self.y.max() >= len(self.classes)):
            raise DataValidationError(
                f"y must be in [0, {len(self.classes)}), got range [{self.y.min()}, {self.y.max()}]"
            )
        if self.X_cat is not None:
            self.X_cat = np.ascontiguousarray(self.X_cat, dtype=np.int64)
            c = self.X_cat.shape[1] if self.X_cat.ndim == 2 else -1
            if self.X_cat.shape[0] != n or c < 0:
                raise DataValidationError(f"X_cat must have shape ({n}, c), got {self.X_cat.shape}")
            if self.cat_sources is None or self.cat_cardinalities is None:
                raise DataValidationError("X_cat needs cat_sources and cat_cardinalities")
            if len(self.cat_sources) != c or len(self.cat_cardinalities) != c:
                raise DataValidationError(
                    f"cat_sources and cat_cardinalities must have {c} entries, "
                    f"got {len(self.cat_sources)} and {len(self.cat_cardinalities)}"
                )

    @property
    def n(self) -> int:
        """Number of records."""
        return int(self.X.shape[0])

    @property
    def raw_columns(self) -> list[str]:
        """The raw feature columns (in order of first appearance), excluding the label."""
        seen: dict[str, None] = dict.fromkeys(self.feature_sources)
        for s in self.cat_sources or []:
            seen.setdefault(s, None)
        return list(seen)

    def subset(self, indices: np.ndarray | Sequence[int], *, name: str | None = None) -> TabularDataset:
        """The records at ``indices`` (e.g. a validation split carved from training data).

        The encoding (and so its provenance, ``statistics_from_data``) is the parent's:
        a subset is not re-encoded.
        """
        idx = np.asarray(indices, dtype=np.int64)
        return replace(
            self,
            name=name or self.name,
            X=self.X[idx],
            y=self.y[idx],
            X_cat=None if self.X_cat is None else self.X_cat[idx],
        )

    def __repr__(self) -> str:
        cat = "" if self.X_cat is None else f", X_cat={self.X_cat.shape}"
        return (
            f"TabularDataset(name={self.name!r}, n={self.n}, d={self.X.shape[1]}{cat}, "
            f"label={self.label_name!r}, classes={len(self.classes)}, default_private={_short(self.default_private)})"
        )


def _short(names: list[str] | None) -> str:
    if names is None or len(names) <= 6:
        return repr(names)
    return f"[{', '.join(map(repr, names[:3]))}, ... ({len(names)} columns)]"


@dataclass(frozen=True)
class TableSpec:
    """Which raw column is what, and the public knowledge used to encode it.

    ``bounds`` (raw scale, before ``log1p``), ``categories`` and ``classes`` (the
    label's class list) are public knowledge supplied by the user or a codebook;
    columns without them get statistics from the training data (a
    ``PrivacyLeakWarning`` if private), recorded in the encoded datasets'
    ``statistics_from_data``. ``private`` lists the raw columns declared private
    (may include the label). ``given_from_data`` marks given statistics that were
    nevertheless computed from the data elsewhere (a schema written by ``featuredp data
    schema``): they are recorded in ``statistics_from_data`` as if computed here.
    ``inferred_types`` lists the columns whose type was read from dtypes (recorded).
    """

    label: str
    numeric: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    private: tuple[str, ...] = ()
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    categories: Mapping[str, Sequence[str]] = field(default_factory=dict)
    log1p: tuple[str, ...] = ()
    classes: Sequence[str] | None = None
    given_from_data: Mapping[str, str] = field(default_factory=dict)
    inferred_types: tuple[str, ...] = ()


def fix_hint(kinds: Sequence[str]) -> str:
    """How to make statistics of the given kinds (``"bounds"``, ...) public, for warning messages."""
    options = {"bounds": "bounds=", "categories": "categories=", "classes": "classes="}
    given = " / ".join(options[k] for k in options if k in set(kinds))
    return (
        "declare them in a schema file (`featuredp data schema FILE`, then --schema FILE; docs/own-data.md) "
        f"or pass public {given} to the loader, from a codebook or the data's documentation,"
    )


def category_string(value: object) -> str:
    """A category value as the encoder compares it: ``1``, ``1.0`` and ``" 1"`` are all ``"1"``.

    >>> [category_string(v) for v in (1, 1.0, " 1", "F", 2.5, True)]
    ['1', '1', '1', 'F', '2.5', 'True']
    """
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return str(value).strip()


def _category_values(series: pd.Series) -> np.ndarray:
    """The values of a categorical column as strings (numbers written the same way as declared ones)."""
    if pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series):
        return np.array([category_string(v) for v in series.to_numpy()], dtype=object)
    return series.astype(str).str.strip().to_numpy()


def _values_listed(series: pd.Series, mask: np.ndarray) -> str:
    rows = np.flatnonzero(mask)[:_MAX_LISTED]
    more = ", ..." if mask.sum() > _MAX_LISTED else ""
    return ", ".join(f"row {int(r)}: {series.iloc[int(r)]!r}" for r in rows) + more


def _rows_listed(mask: np.ndarray) -> str:
    rows = np.flatnonzero(mask)
    shown = ", ".join(str(int(r)) for r in rows[:_MAX_LISTED])
    return shown + (", ..." if rows.size > _MAX_LISTED else "")


def validate_frame(df: pd.DataFrame, spec: TableSpec, *, where: str = "data") -> None:
    """Raise DataValidationError for unknown columns, NaN/inf values and non-numeric numerics."""
    wanted = [spec.label, *spec.numeric, *spec.categorical]
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise DataValidationError(
            f"unknown column(s) {missing} in {where}; available columns: {list(map(str, df.columns))}"
        )
    dup = sorted(set(spec.numeric) & set(spec.categorical))
    if dup:
        raise DataValidationError(f"column(s) {dup} declared both numeric and categorical")
    if spec.label in spec.numeric or spec.label in spec.categorical:
        raise DataValidationError(f"label column {spec.label!r} is also declared as a feature")
    for col in spec.numeric:
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
        non_numeric = np.isnan(values) & df[col].notna().to_numpy()
        if non_numeric.any():
            raise DataValidationError(
                f"numeric column {col!r} in {where} has {int(non_numeric.sum())} non-numeric value(s) "
                f"({_values_listed(df[col], non_numeric)}); declare it categorical or clean it"
            )
        bad = ~np.isfinite(values)
        if bad.any():
            raise DataValidationError(
                f"column {col!r} in {where} has {int(bad.sum())} NaN or infinite value(s) "
                f"(rows {_rows_listed(bad)}); drop or impute them before loading"
            )
    for col in [*spec.categorical, spec.label]:
        bad = df[col].isna().to_numpy()
        if bad.any():
            raise DataValidationError(
                f"column {col!r} in {where} has {int(bad.sum())} missing value(s) "
                f"(rows {_rows_listed(bad)}); drop them or fill them with an explicit category"
            )


def check_private_set(private: Sequence[str], feature_columns: Sequence[str], label: str) -> list[str]:
    """Validate a private column set: known names, not empty, not every feature column."""
    private = list(dict.fromkeys(private))
    known = set(feature_columns) | {label}
    unknown = [c for c in private if c not in known]
    if unknown:
        raise DataValidationError(
            f"unknown private column(s) {unknown}; known columns: {[*feature_columns, label]}"
        )
    if not private:
        raise DataValidationError(
            "the private column set is empty: feature-DP needs at least one private column "
            "(with nothing private, train non-privately)"
        )
    if set(feature_columns) <= set(private):
        raise DataValidationError(
            f"every feature column is private ({len(feature_columns)} columns): nothing public is left "
            "for the public loss; use ordinary DP-SGD (method 'dpsgd') instead"
        )
    return private


def _codes(values: np.ndarray, categories: list[str]) -> np.ndarray:
    """Codes of ``values`` in ``categories``; values outside the list share the reserved code len(categories)."""
    if len(set(categories)) != len(categories):
        raise ValueError(f"categories must not repeat values, got {categories}")
    codes = pd.Index(categories).get_indexer(values).astype(np.int64)
    codes[codes < 0] = len(categories)
    return codes


def _numeric_transform(values: np.ndarray, use_log: bool) -> np.ndarray:
    if use_log:
        # log(1 + x) for x > 0 and 0 otherwise: the usual transform of heavy-tailed counts.
        return np.log1p(np.maximum(values, 0.0))
    return values


def encode_frames(
    train_df: pd.DataFrame,
    test_df: pd.DataFrame,
    spec: TableSpec,
    *,
    name: str,
    description: str = "",
    categorical: CategoricalEncoding = "onehot",
) -> tuple[TabularDataset, TabularDataset]:
    """Encode a train and a test table with statistics taken from the training table only.

    Raises DataValidationError for unknown columns, NaN/inf, a label with a single
    class, or labels outside the class list (``spec.classes`` when declared, else
    the training labels). Warns (PrivacyLeakWarning) when a private column's bounds
    or categories, or a private label's class list, are computed from the data; the
    provenance of every statistic is recorded in ``statistics_from_data`` of both
    datasets (see :class:`TabularDataset`).
    """
    check_choice("categorical", categorical, ("onehot", "codes"))
    validate_frame(train_df, spec, where="the training data")
    validate_frame(test_df, spec, where="the test data")
    private = set(spec.private)
    # Every statistic computed from the data, public columns included: which columns
    # are private is only final when Ψ is bound for training (Columns.bind re-checks).
    from_data: dict[str, str] = {}
    used = {spec.label, *spec.numeric, *spec.categorical}
    # Statistics given to the encoder but computed from the data elsewhere (a generated schema).
    from_data.update({c: k for c, k in spec.given_from_data.items() if c in used})

    # Label: classes fixed by the spec or taken from training data (the label is a
    # training input either way; with a private label its class list must be public knowledge).
    y_train_raw = _category_values(train_df[spec.label])
    y_test_raw = _category_values(test_df[spec.label])
    if spec.classes is not None:
        classes = [category_string(c) for c in spec.classes]
        # Only the declared list is checked for two classes, not the labels present: whether a
        # private label happens to be constant in the data must not decide if loading succeeds.
        if len(set(classes)) != len(classes) or len(classes) < 2:
            raise DataValidationError(
                f"classes must list at least two distinct values of label {spec.label!r}, got {classes}"
            )
    else:
        classes = sorted(set(y_train_raw))
        from_data[spec.label] = "classes"
        if len(classes) < 2:
            raise DataValidationError(
                f"label column {spec.label!r} has a single class {classes} in the training data; "
                "a classifier needs at least two"
            )
    index = {c: i for i, c in enumerate(classes)}
    declared = "the declared classes=" if spec.classes is not None else "classes "
    for where, raw in (("training", y_train_raw), ("test", y_test_raw)):
        unseen = sorted(set(raw) - set(index))
        if unseen:
            raise DataValidationError(
                f"label values {unseen[:_MAX_LISTED]} in the {where} data are not in {declared}{classes}"
            )
    y_train = np.array([index[v] for v in y_train_raw], dtype=np.int64)
    y_test = np.array([index[v] for v in y_test_raw], dtype=np.int64)

    blocks_tr: list[np.ndarray] = []
    blocks_te: list[np.ndarray] = []
    names: list[str] = []
    sources: list[str] = []
    for col in spec.numeric:
        use_log = col in spec.log1p
        tr = _numeric_transform(pd.to_numeric(train_df[col]).to_numpy(np.float64), use_log)
        te = _numeric_transform(pd.to_numeric(test_df[col]).to_numpy(np.float64), use_log)
        if col in spec.bounds:
            lo_raw, hi_raw = (float(b) for b in spec.bounds[col])
            if not lo_raw < hi_raw:
                raise ValueError(f"bounds[{col!r}] must satisfy low < high, got ({lo_raw}, {hi_raw})")
            lo, hi = (float(v) for v in _numeric_transform(np.array([lo_raw, hi_raw]), use_log))
        else:
            lo, hi = float(tr.min()), float(tr.max())
            from_data[col] = "bounds"
        scale = hi - lo if hi > lo else 1.0
        blocks_tr.append(np.clip((tr - lo) / scale, 0.0, 1.0)[:, None])
        blocks_te.append(np.clip((te - lo) / scale, 0.0, 1.0)[:, None])
        names.append(col)
        sources.append(col)

    cat_codes_tr: list[np.ndarray] = []
    cat_codes_te: list[np.ndarray] = []
    cardinalities: list[int] = []
    for col in spec.categorical:
        tr_raw = _category_values(train_df[col])
        te_raw = _category_values(test_df[col])
        if col in spec.categories:
            cats = [category_string(c) for c in spec.categories[col]]
        else:
            cats = sorted(set(tr_raw))
            from_data[col] = "categories"
        codes_tr = _codes(tr_raw, cats)
        codes_te = _codes(te_raw, cats)
        if categorical == "onehot":
            eye = np.vstack([np.eye(len(cats), dtype=np.float32), np.zeros((1, len(cats)), np.float32)])
            blocks_tr.append(eye[codes_tr])
            blocks_te.append(eye[codes_te])
            names.extend(f"{col}={c}" for c in cats)
            sources.extend([col] * len(cats))
        else:
            cat_codes_tr.append(codes_tr)
            cat_codes_te.append(codes_te)
            cardinalities.append(len(cats) + 1)

    # The columns declared private now; a different private set chosen at training time is
    # checked again by Columns.bind against ``statistics_from_data``.
    leaked = [c for c in from_data if c in private]
    if leaked:
        warnings.warn(
            f"{name}: encoding statistics of private column(s) were computed from the data: "
            f"{', '.join(f'{c} ({STATISTIC_KINDS[from_data[c]]})' for c in leaked)}. They are not covered by "
            f"the privacy guarantee; {fix_hint([from_data[c] for c in leaked])} to avoid this",
            PrivacyLeakWarning,
            stacklevel=2,
        )

    def _stack(blocks: list[np.ndarray], n: int) -> np.ndarray:
        return np.hstack(blocks).astype(np.float32) if blocks else np.zeros((n, 0), np.float32)

    common = dict(
        name=name,
        feature_names=names,
        feature_sources=sources,
        label_name=spec.label,
        classes=classes,
        description=description,
        default_private=list(spec.private) or None,
        statistics_from_data=from_data,
        statistics_warned=leaked,
        column_types={**dict.fromkeys(spec.numeric, "numeric"), **dict.fromkeys(spec.categorical, "categorical")},
        inferred_types=list(spec.inferred_types),
    )
    codes = categorical == "codes" and bool(spec.categorical)
    cat_kw_tr = (
        dict(X_cat=np.stack(cat_codes_tr, 1), cat_sources=list(spec.categorical), cat_cardinalities=cardinalities)
        if codes
        else {}
    )
    cat_kw_te = dict(cat_kw_tr, X_cat=np.stack(cat_codes_te, 1)) if codes else {}
    train = TabularDataset(X=_stack(blocks_tr, len(train_df)), y=y_train, **common, **cat_kw_tr)  # type: ignore[arg-type]
    test = TabularDataset(X=_stack(blocks_te, len(test_df)), y=y_test, **common, **cat_kw_te)  # type: ignore[arg-type]
    return train, test


#: A test split below this many rows is warned about: one row is then more than half a point of accuracy.
MIN_TEST_ROWS = 200


def warn_small_test(n_test: int, what: str) -> None:
    """SmallSampleWarning when ``n_test`` < :data:`MIN_TEST_ROWS`, giving the size of one row in points.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_small_test(12, "the test split of t.csv")
    >>> str(caught[0].message).split(":")[0]
    'the test split of t.csv holds 12 rows'
    """
    if 0 < n_test < MIN_TEST_ROWS:
        warnings.warn(
            f"{what} holds {n_test} rows: one row is {100 / n_test:.2f} points of accuracy, so differences of a "
            f"few points are noise (fewer than {MIN_TEST_ROWS} rows); give a larger test file (test=) or "
            "test_fraction, or compare runs by their spread over seeds",
            SmallSampleWarning,
            stacklevel=3,
        )


def seeded_split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random split of ``range(n)`` into (train, test) index arrays."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, round(n * test_fraction))
    if n_test >= n:
        raise DataValidationError(f"cannot split {n} rows with test_fraction={test_fraction}")
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])
