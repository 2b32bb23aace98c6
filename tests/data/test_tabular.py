"""The tabular encoder, the CSV/Parquet loader and their errors."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from featuredp.data import TabularDataset, available_datasets, dataset_info, load_dataset
from featuredp.data.files import load_table
from featuredp.data.tabular import TableSpec, check_private_set, encode_frames
from featuredp.errors import DataValidationError, PrivacyLeakWarning


def _frame(n: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "age": rng.integers(18, 80, n),
            "hours": rng.normal(40, 5, n).round(1),
            "sex": rng.choice(["F", "M"], n),
            "job": rng.choice(["a", "b", "c"], n),
            "label": rng.choice(["no", "yes"], n),
        }
    )


def test_encoding_shapes_sources_and_scaling() -> None:
    df = _frame()
    spec = TableSpec(label="label", numeric=("age", "hours"), categorical=("sex", "job"), private=("sex",),
                     bounds={"age": (0, 100)}, categories={"sex": ["F", "M"]})  # fmt: skip
    train, test = encode_frames(df[:40], df[40:], spec, name="t")
    assert train.X.dtype == np.float32 and train.y.dtype == np.int64
    assert train.feature_names == ["age", "hours", "sex=F", "sex=M", "job=a", "job=b", "job=c"]
    assert train.feature_sources == ["age", "hours", "sex", "sex", "job", "job", "job"]
    # Fixed bounds: age/100 exactly, not the data's min-max.
    np.testing.assert_allclose(train.X[:, 0], df["age"][:40].to_numpy() / 100, rtol=1e-6)
    # Data-derived scaling of a public column reaches exactly 0 and 1 on the training data.
    assert train.X[:, 1].min() == 0.0 and train.X[:, 1].max() == 1.0
    assert np.all((test.X >= 0) & (test.X <= 1))
    assert np.all(train.X[:, 2:4].sum(1) == 1) and np.all(train.X[:, 4:].sum(1) == 1)
    assert train.classes == ["no", "yes"] and train.default_private == ["sex"]


def test_codes_mode_and_unknown_category_slot() -> None:
    df = _frame()
    test_df = df[40:].copy()
    test_df.loc[test_df.index[0], "job"] = "zzz"  # unseen at training time
    spec = TableSpec(label="label", numeric=("age",), categorical=("sex", "job"), private=("job",),
                     categories={"job": ["a", "b", "c"]})  # fmt: skip
    train, test = encode_frames(df[:40], test_df, spec, name="t", categorical="codes")
    assert train.X.shape == (40, 1) and train.X_cat.shape == (40, 2)
    assert train.cat_sources == ["sex", "job"] and train.cat_cardinalities == [3, 4]
    assert test.X_cat[0, 1] == 3  # the reserved "unknown" code
    assert train.X_cat.max(axis=0).tolist() <= [1, 2]


def test_private_statistics_from_data_warn_and_public_ones_do_not() -> None:
    df = _frame()
    spec = TableSpec(label="label", numeric=("age", "hours"), categorical=("sex", "job"), private=("hours", "job"))
    with pytest.warns(PrivacyLeakWarning, match=r"hours \(min/max\).*job \(category list\)"):
        encode_frames(df[:40], df[40:], spec, name="t")
    fixed = TableSpec(label="label", numeric=("age", "hours"), categorical=("sex", "job"), private=("hours", "job"),
                      bounds={"hours": (0, 100)}, categories={"job": ["a", "b", "c"]})  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        encode_frames(df[:40], df[40:], fixed, name="t")


def test_nan_inf_errors_say_how_many_and_where() -> None:
    df = _frame()
    df["hours"] = df["hours"].astype(float)
    df.loc[[3, 7], "hours"] = np.nan
    df.loc[11, "hours"] = np.inf
    spec = TableSpec(label="label", numeric=("hours",), private=("hours",), bounds={"hours": (0, 99)})
    with pytest.raises(DataValidationError, match=r"'hours'.*3 NaN or infinite.*rows 3, 7, 11"):
        encode_frames(df, df, spec, name="t")


def test_one_class_label_and_unknown_columns() -> None:
    df = _frame()
    df["label"] = "yes"
    with pytest.raises(DataValidationError, match="single class"):
        encode_frames(df, df, TableSpec(label="label", numeric=("age",)), name="t")
    with pytest.raises(DataValidationError, match=r"unknown column\(s\) \['nope'\]"):
        encode_frames(df, df, TableSpec(label="label", numeric=("nope",)), name="t")


def test_private_set_checks() -> None:
    with pytest.raises(DataValidationError, match="empty"):
        check_private_set([], ["a", "b"], "y")
    with pytest.raises(DataValidationError, match="every feature column is private"):
        check_private_set(["a", "b"], ["a", "b"], "y")
    with pytest.raises(DataValidationError, match=r"unknown private column\(s\) \['c'\]"):
        check_private_set(["c"], ["a", "b"], "y")
    assert check_private_set(["y"], ["a", "b"], "y") == ["y"]  # label-only privacy is allowed


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_load_table_csv_and_parquet(tmp_path, suffix: str) -> None:
    df = _frame(200)
    path = tmp_path / f"people{suffix}"
    df.to_csv(path, index=False) if suffix == ".csv" else df.to_parquet(path, index=False)
    with pytest.warns(PrivacyLeakWarning):  # the private 'sex' category list comes from the data
        train, test = load_table(path, label="label", private=["sex"])
    assert train.n == 160 and test.n == 40
    assert set(train.feature_sources) == {"age", "hours", "sex", "job"}  # inferred by dtype
    assert train.default_private == ["sex"]
    train2, _ = load_table(path, label="label", public=["age", "hours", "job"], categories={"sex": ["F", "M"]})
    assert train2.default_private == ["sex"]
    np.testing.assert_array_equal(train.X, train2.X)  # same fixed split, same encoding


def test_load_table_errors(tmp_path) -> None:
    path = tmp_path / "t.csv"
    _frame().to_csv(path, index=False)
    with pytest.raises(DataValidationError, match="unknown label column 'income'"):
        load_table(path, label="income", private=["sex"])
    with pytest.raises(DataValidationError, match="empty"):
        load_table(path, label="label", private=[])
    with pytest.raises(DataValidationError, match="every feature column is private"):
        load_table(path, label="label", private=["age", "hours", "sex", "job"])
    with pytest.raises(DataValidationError, match=r"both list \['sex'\]"):
        load_table(path, label="label", private=["sex", "job"], public=["age", "hours", "sex"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_table(tmp_path / "missing.csv", label="label", private=["sex"])
    with pytest.raises(ValueError, match="give private="):
        load_table(path, label="label")


def test_dataset_container_validates_and_subsets() -> None:
    X = np.zeros((4, 2), np.float32)
    with pytest.raises(DataValidationError, match="y must have shape"):
        TabularDataset("t", X, np.zeros(3), ["a", "b"], ["a", "b"], "y", ["0", "1"])
    ds = TabularDataset("t", X, np.array([0, 1, 1, 0]), ["a", "b"], ["a", "b"], "y", ["0", "1"])
    sub = ds.subset([1, 2])
    assert sub.n == 2 and sub.y.tolist() == [1, 1] and ds.n == 4


def test_registry() -> None:
    names = available_datasets()
    assert {"adult", "census-income", "purchase-style", "criteo-style", "purchase100", "criteo", "csv"} <= set(names)
    assert dataset_info("adult").default_private == ("sex", "race")
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_dataset("nope")
