"""Purchase100 (your file) and Purchase-style (a stand-in built from Census-Income).

Purchase100 (Shokri et al. 2017) is 197,324 shopping records × 600 binary
features with 100 classes obtained by k-means. It cannot be obtained offline,
so :func:`load_purchase100` reads the file you have, as commonly distributed:

* CSV: one row per record, the label first, then 600 0/1 features, no header;
* NPZ: arrays ``features`` and ``labels`` (or ``X`` and ``y``); one-hot labels are accepted.

**Purchase-style** is built from Census-Income (KDD) the way Purchase100 was
built from shopping histories: every column becomes binary indicators (numeric
columns with more than 10 distinct values are cut into 8 quantile bins first),
525 binary features in all, and the label is the k-means cluster (100
clusters, ``MiniBatchKMeans``, fixed seed) of the binary vector. The built
matrix is cached (``<cache>/purchase-style/``).

Privacy split of both (paper §6.2): 100 features chosen at random (fixed
seed) and the label are public; all other features are private. Each binary
feature is its own raw column (``feature_sources == feature_names``).

Note: the stand-in's construction (bins, clusters) reads all of the data; it
defines the benchmark and is not part of any training run's guarantee.

Encoding statistics (``statistics_from_data``): the binary features are used as
they are (no bounds, no category lists), so none is recorded for them. The class
list of Purchase-style is the fixed list of its ``N_CLUSTERS`` cluster ids; that of
Purchase100 is read from the file's labels unless ``classes=`` declares it
(recorded as from the data: it matters when the label is made private).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from featuredp._io import atomic_path
from featuredp._validate import check_int, check_open_unit
from featuredp.data.cache import cache_dir as _cache_dir
from featuredp.data.census import census_frames
from featuredp.data.tabular import TabularDataset, seeded_split
from featuredp.errors import DataValidationError

N_PUBLIC = 100
PURCHASE_STYLE_VERSION = 1
N_CLUSTERS = 100
N_BINS = 8
_BIN_THRESHOLD = 10  # numeric columns with more distinct values than this are binned


def public_feature_indices(n_features: int, n_public: int = N_PUBLIC, seed: int = 0) -> np.ndarray:
    """The sorted indices of the ``n_public`` public features (fixed seed)."""
    n_public = check_int("n_public", n_public, minimum=1)
    if n_public >= n_features:
        raise ValueError(f"n_public must be < the number of features ({n_features}), got {n_public}")
    return np.sort(np.random.default_rng(seed).choice(n_features, size=n_public, replace=False))


def binary_dataset(
    X: np.ndarray,
    y: np.ndarray,
    *,
    names: list[str],
    classes: list[str],
    name: str,
    description: str,
    n_public: int = N_PUBLIC,
    public_seed: int = 0,
    test_fraction: float = 0.2,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    statistics_from_data: Mapping[str, str] | None = None,
) -> tuple[TabularDataset, TabularDataset]:
    """Split a binary-feature table into (train, test) with ``n_public`` random public features.

    ``statistics_from_data`` is recorded on both parts (see :class:`TabularDataset`); the
    features themselves need no statistic, so it can only name the label's class list.
    """
    check_open_unit("test_fraction", test_fraction)
    pub = public_feature_indices(X.shape[1], n_public, public_seed)
    private = [names[i] for i in range(len(names)) if i not in set(pub.tolist())]
    tr_idx, te_idx = seeded_split(len(y), test_fraction, seed)
    rng = np.random.default_rng(seed + 1)
    for label, idx_name, n in (("train", "n_train", n_train), ("test", "n_test", n_test)):
        if n is None:
            continue
        n = check_int(idx_name, n, minimum=1)
        pool = tr_idx if label == "train" else te_idx
        if n > len(pool):
            raise ValueError(f"{idx_name} must be <= {len(pool)} (the {label} rows available), got {n}")
        chosen = np.sort(rng.choice(pool, size=n, replace=False))
        tr_idx, te_idx = (chosen, te_idx) if label == "train" else (tr_idx, chosen)
    desc = description + f" Public: {n_public} random features (seed {public_seed}) and the label; the rest private."
    common = dict(
        name=name,
        feature_names=list(names),
        feature_sources=list(names),
        label_name="label",
        classes=classes,
        description=desc,
        default_private=private,
        statistics_from_data=dict(statistics_from_data or {}),
    )
    train = TabularDataset(X=X[tr_idx].astype(np.float32), y=y[tr_idx], **common)  # type: ignore[arg-type]
    test = TabularDataset(X=X[te_idx].astype(np.float32), y=y[te_idx], **common)  # type: ignore[arg-type]
    return train, test


def read_purchase100(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read a Purchase100 file (CSV: label then features; NPZ: features/labels) as (X, raw labels)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path {str(p)!r} does not exist or is not a file")
    if p.suffix.lower() == ".npz":
        with np.load(p, allow_pickle=False) as z:
            keys = set(z.files)
            fx, fy = ("features", "labels") if {"features", "labels"} <= keys else ("X", "y")
            if not {fx, fy} <= keys:
                raise DataValidationError(
                    f"{p.name}: expected arrays 'features' and 'labels' (or 'X', 'y'), got {sorted(keys)}"
                )
            X, y = np.asarray(z[fx], dtype=np.float64), np.asarray(z[fy])
        if y.ndim == 2:  # one-hot labels
            y = y.argmax(axis=1)
    else:
        df = pd.read_csv(p, header=None)
        if df.shape[1] < 2:
            raise DataValidationError(
                f"{p.name}: expected a label column and feature columns, got {df.shape[1]} column(s)"
            )
        y = df.iloc[:, 0].to_numpy()
        X = df.iloc[:, 1:].apply(pd.to_numeric, errors="coerce").to_numpy(np.float64)
    if X.ndim != 2 or len(X) != len(y):
        raise DataValidationError(f"{p.name}: features of shape {X.shape} do not match {len(y)} labels")
    bad = ~np.isfinite(X)
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])
        raise DataValidationError(
            f"{p.name}: {int(bad.sum())} NaN, infinite or non-numeric feature value(s) in {rows.size} row(s) "
            f"(first rows {rows[:5].tolist()})"
        )
    return X, y


def load_purchase100(
    *,
    path: str | os.PathLike[str],
    n_public: int = N_PUBLIC,
    public_seed: int = 0,
    test_fraction: float = 0.2,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    classes: Sequence[object] | str | None = None,
) -> tuple[TabularDataset, TabularDataset]:
    """Your Purchase100 file as (train, test): 100 random features + label public, the rest private.

    ``classes`` declares the label's class list (e.g. ``range(1, 101)`` or ``"1,2,3"``; values are
    compared as strings, integral floats as integers); a label outside it is a
    DataValidationError. Without it the class list is the labels present in the
    file, recorded in ``statistics_from_data`` (a PrivacyLeakWarning if the label is
    made private for training).
    """
    X, y_raw = read_purchase100(path)
    from_data: dict[str, str] = {}
    if classes is not None:
        items = classes.split(",") if isinstance(classes, str) else classes  # "1,2,3" as on a command line
        declared = [str(c).strip() for c in items if str(c).strip()]
        if len(set(declared)) != len(declared) or len(declared) < 2:
            raise DataValidationError(f"classes must list at least two distinct label values, got {declared}")
        raw = _label_strings(y_raw)
        index = {c: i for i, c in enumerate(declared)}
        outside = sorted(set(raw.tolist()) - set(index))
        if outside:
            raise DataValidationError(
                f"{Path(path).name}: label values {outside[:5]} are not in the declared classes={declared}"
            )
        y = np.array([index[v] for v in raw], dtype=np.int64)
        class_names = declared
    else:
        values, y = np.unique(y_raw, return_inverse=True)
        if values.size < 2:
            raise DataValidationError(f"{Path(path).name}: the label has a single class {values.tolist()}")
        class_names = [str(v) for v in values]
        from_data["label"] = "classes"
    names = [f"f{i:03d}" for i in range(X.shape[1])]
    desc = f"Purchase100 from {Path(path).name} ({len(y)} records, {X.shape[1]} features, {len(class_names)} classes)."
    return binary_dataset(
        X, y.astype(np.int64), names=names, classes=class_names, name="purchase100", description=desc,
        n_public=n_public, public_seed=public_seed, test_fraction=test_fraction, n_train=n_train, n_test=n_test,
        seed=seed, statistics_from_data=from_data,
    )  # fmt: skip


def _label_strings(y_raw: np.ndarray) -> np.ndarray:
    """Labels as strings to compare with declared classes; integral numbers (``3.0``) as ``"3"``."""
    y = np.asarray(y_raw)
    if y.dtype.kind in "iub":
        return y.astype(np.int64).astype(str)
    if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
        return y.astype(np.int64).astype(str)
    return np.char.strip(y.astype(str))


def binarise_census(df: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Census frame (label dropped) -> uint8 indicator matrix and names (numeric cols binned into quantiles)."""
    blocks: list[np.ndarray] = []
    names: list[str] = []
    for col in df.columns:
        values = df[col]
        numeric = pd.api.types.is_numeric_dtype(values)
        if numeric and values.nunique() > _BIN_THRESHOLD:
            # Quantile bins; heavy ties at 0 merge bins (duplicates dropped), as in a plain qcut.
            codes = pd.qcut(values, N_BINS, labels=False, duplicates="drop")
            codes = np.asarray(codes, dtype=np.int64)
            levels = [f"{col}=q{k}" for k in range(int(codes.max()) + 1)]
        else:
            cat = pd.Categorical(values.astype(str))
            codes = cat.codes.astype(np.int64)
            levels = [f"{col}={c}" for c in cat.categories]
        block = np.zeros((len(df), len(levels)), dtype=np.uint8)
        block[np.arange(len(df)), codes] = 1
        blocks.append(block)
        names.extend(levels)
    return np.hstack(blocks), names


def build_purchase_style(frames: Sequence[pd.DataFrame], *, seed: int = 0, n_clusters: int = N_CLUSTERS
                         ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Binary features and k-means labels from raw census frames (label column dropped)."""
    from sklearn.cluster import MiniBatchKMeans

    df = pd.concat([f.drop(columns=["income"], errors="ignore") for f in frames], ignore_index=True)
    X, names = binarise_census(df)
    km = MiniBatchKMeans(n_clusters=n_clusters, random_state=seed, batch_size=4096, n_init=3)
    y = km.fit_predict(X.astype(np.float32)).astype(np.int64)
    return X, y, names


def purchase_style_cache(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache>/purchase-style/purchase_style_v<version>.npz``."""
    return _cache_dir(cache_dir) / "purchase-style" / f"purchase_style_v{PURCHASE_STYLE_VERSION}.npz"


def load_purchase_style(
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    n_public: int = N_PUBLIC,
    public_seed: int = 0,
    test_fraction: float = 0.2,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    frames: tuple[pd.DataFrame, pd.DataFrame] | None = None,
) -> tuple[TabularDataset, TabularDataset]:
    """Purchase-style (train, test); built once from Census-Income and cached.

    ``frames`` (raw census-shaped frames) builds from them without the cache (tests).
    """
    if frames is not None:
        X, y, names = build_purchase_style(frames)
    else:
        path = purchase_style_cache(cache_dir)
        if not path.is_file():
            frames_ = census_frames(cache_dir)  # downloaded on first use
            print(f"featuredp: building purchase-style (k-means labels, about 1-2 minutes, once) into {path}",
                  file=sys.stderr)  # fmt: skip
            X, y, names = build_purchase_style(frames_)
            # np.savez would append ".npz" to a bare temporary name, so write through a file object.
            with atomic_path(path) as tmp, open(tmp, "wb") as fh:
                    np.savez_compressed(fh, bits=np.packbits(X, axis=1), d=X.shape[1], y=y, names=np.array(names))
        else:
            with np.load(path, allow_pickle=False) as z:
                X = np.unpackbits(z["bits"], axis=1, count=int(z["d"]))
                y, names = z["y"], [str(s) for s in z["names"]]
    # The class list is the construction's fixed cluster ids, not the ids present: read from the
    # labels, a neighbouring dataset without the only member of the last cluster would drop a class.
    classes = [f"cluster{k:02d}" for k in range(N_CLUSTERS)]
    desc = (
        "Purchase-style: a Purchase100 stand-in built from Census-Income (KDD) (CC BY 4.0): "
        f"{X.shape[1]} binary features, {len(classes)} k-means classes."
    )
    return binary_dataset(
        X, y, names=names, classes=classes, name="purchase-style", description=desc, n_public=n_public,
        public_seed=public_seed, test_fraction=test_fraction, n_train=n_train, n_test=n_test, seed=seed,
    )  # fmt: skip
