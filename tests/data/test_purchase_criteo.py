"""Purchase100 / Criteo file loaders (tiny files the tests write) and the census-based stand-ins."""

from __future__ import annotations

import numpy as np
import pytest
from census_synth import census_frames_synth

from featuredp.data.criteo import CAT_COLUMNS, INT_COLUMNS, hash_bucket, load_criteo, load_criteo_style
from featuredp.data.purchase import load_purchase100, load_purchase_style, public_feature_indices
from featuredp.errors import DataValidationError


def _purchase_arrays(n: int = 200, d: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.random((n, d)) < 0.1).astype(np.int64), rng.integers(1, 11, n)


def test_purchase100_csv_and_npz_agree(tmp_path) -> None:
    X, y = _purchase_arrays()
    csv = tmp_path / "dataset_purchase"
    np.savetxt(csv, np.column_stack([y, X]), fmt="%d", delimiter=",")
    npz = tmp_path / "purchase100.npz"
    np.savez(npz, features=X, labels=np.eye(11)[y])  # one-hot labels, as some copies ship them
    a_tr, a_te = load_purchase100(path=csv)
    b_tr, _ = load_purchase100(path=npz)
    assert a_tr.X.shape == (160, 600) and a_te.n == 40
    np.testing.assert_array_equal(a_tr.X, b_tr.X)
    # Same records, labels mapped to 0..K-1 in both (CSV labels 1..10, NPZ argmax 1..10).
    np.testing.assert_array_equal(a_tr.y, b_tr.y)
    assert len(a_tr.default_private) == 500 and a_tr.feature_sources == a_tr.feature_names
    public = sorted(set(a_tr.feature_names) - set(a_tr.default_private))
    assert public == [f"f{i:03d}" for i in public_feature_indices(600, 100, 0)]


def test_purchase100_errors(tmp_path) -> None:
    X, y = _purchase_arrays(20, 5)
    Xf = X.astype(float)
    Xf[2, 3] = np.nan
    bad = tmp_path / "bad.npz"
    np.savez(bad, features=Xf, labels=y)
    with pytest.raises(DataValidationError, match=r"1 NaN.*first rows \[2\]"):
        load_purchase100(path=bad)
    one = tmp_path / "one.npz"
    np.savez(one, features=X, labels=np.ones(20))
    with pytest.raises(DataValidationError, match="single class"):
        load_purchase100(path=one)
    keys = tmp_path / "keys.npz"
    np.savez(keys, a=X)
    with pytest.raises(DataValidationError, match="expected arrays 'features'"):
        load_purchase100(path=keys)


def _criteo_lines(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        ints = ["" if rng.random() < 0.2 else str(int(rng.integers(-2, 500))) for _ in INT_COLUMNS]
        cats = ["" if rng.random() < 0.1 else f"{int(rng.integers(0, 40)):08x}" for _ in CAT_COLUMNS]
        lines.append("\t".join([str(int(rng.random() < 0.25)), *ints, *cats]))
    return lines


def test_criteo_tsv_transform_and_hashing(tmp_path) -> None:
    path = tmp_path / "day_0_sample.txt"
    lines = _criteo_lines(100)
    path.write_text("\n".join(lines) + "\n")
    train, test = load_criteo(path=path, hash_buckets=64, seed=0)
    assert train.X.shape == (80, 13) and train.X_cat.shape == (80, 26) and test.n == 20
    assert train.cat_cardinalities == [65] * 26 and train.X_cat.max() < 64
    assert train.default_private == CAT_COLUMNS
    # Numeric transform: log1p(x) for x > 0 and 0 otherwise (missing too), then / training max.
    fields = [line.split("\t") for line in lines]
    raw = np.array([[float(v) if v else 0.0 for v in f[1:14]] for f in fields])
    t = np.where(raw > 0, np.log1p(np.maximum(raw, 0)), 0.0)
    rows = np.sort(np.random.default_rng(0).permutation(100)[20:])
    expected = t[rows] / t[rows].max(axis=0)
    np.testing.assert_allclose(train.X, expected, rtol=1e-5, atol=1e-6)
    # Hashing is stable and data-independent.
    vals = [f[14] for f in fields]
    np.testing.assert_array_equal(train.X_cat[:, 0], hash_bucket("C1", [vals[r] for r in rows], 64))


def test_criteo_errors(tmp_path) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text("1\t2\t3\n")
    with pytest.raises(DataValidationError, match="expected 40 tab-separated fields"):
        load_criteo(path=path)
    lines = _criteo_lines(10)
    lines[4] = "7" + lines[4][1:]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataValidationError, match=r"1 label value\(s\) are not 0/1 \(rows \[4\]\)"):
        load_criteo(path=path)


def test_purchase_style_builder_on_synthetic_census() -> None:
    frames = census_frames_synth(900, 300)
    train, test = load_purchase_style(frames=frames, n_public=20, test_fraction=0.25)
    d = train.X.shape[1]
    assert set(np.unique(train.X)) <= {0.0, 1.0}
    assert train.n == 900 and test.n == 300 and len(train.default_private) == d - 20
    # Every census column contributes exactly one indicator per row.
    assert np.all(train.X.sum(1) == 40)
    assert 50 <= len(train.classes) <= 100  # k-means with 100 clusters (some may be empty on tiny data)
    again, _ = load_purchase_style(frames=frames, n_public=20, test_fraction=0.25)
    np.testing.assert_array_equal(train.y, again.y)  # fixed seed: the same labels


def test_criteo_style_split() -> None:
    frames = census_frames_synth(500, 200)
    train, test = load_criteo_style(frames=frames, n_train=300, n_test=100)
    assert train.name == "criteo-style" and train.n == 300 and test.n == 100
    assert train.X.shape[1] == 7 and train.X_cat.shape[1] == 33
    assert set(train.default_private) == set(train.cat_sources)
    assert not set(train.default_private) & set(train.feature_sources)
