"""A raw CSV/Parquet file (issue #24): missing values, repeated headers, identifiers and copies of the label."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from featuredp.data.files import MISSING_CATEGORY, ColumnWarning, flag_columns, load_table, schema_for_table
from featuredp.data.schema import read_schema
from featuredp.errors import DataValidationError, PrivacyLeakWarning


def _people(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 80, n).astype(float)
    hours = rng.normal(40, 8, n).round(1)
    job = rng.choice(["clerk", "engineer", "nurse", "sales"], n).astype(object)
    sex = rng.choice(["F", "M"], n).astype(object)
    score = 0.05 * (age - 45) + 0.08 * (hours - 40) + (job == "engineer") + rng.normal(0, 1, n)
    return pd.DataFrame({"age": age, "hours": hours, "job": job, "sex": sex,
                         "income": np.where(score > 0, ">50K", "<=50K")})  # fmt: skip


def _raw(n: int = 400) -> pd.DataFrame:
    """_people with gaps: 20 ages, 10 hours, 15 jobs and 5 sexes missing."""
    df = _people(n)
    rng = np.random.default_rng(1)
    for col, k in (("age", 20), ("hours", 10), ("job", 15), ("sex", 5)):
        df.loc[rng.choice(n, k, replace=False), col] = np.nan
    return df


def _write(tmp_path, df: pd.DataFrame, name: str = "people.csv"):
    path = tmp_path / name
    df.to_csv(path, index=False) if name.endswith(".csv") else df.to_parquet(path, index=False)
    return path


def _load(path, **kw):
    kw.setdefault("label", "income")
    kw.setdefault("private", ["sex"])
    kw.setdefault("categories", {"sex": ["F", "M"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return load_table(path, **kw)


# -- 1. every column with missing values in one error ---------------------------------------------------


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_every_column_with_missing_values_is_named_in_one_error(tmp_path, suffix) -> None:
    path = _write(tmp_path, _raw(), "raw" + suffix)
    # Before: one round per column ("column 'age' ... has 20 NaN"), then 'hours', then 'job', ...
    with pytest.raises(DataValidationError) as err:
        _load(path)
    msg = str(err.value)
    for col, k in (("age", 20), ("hours", 10), ("job", 15), ("sex", 5)):
        assert f"{col} ({k} missing)" in msg
    assert "--missing drop" in msg and "\n" not in msg


# -- 2. --missing drop | impute | category -------------------------------------------------------------


def test_missing_drop_drops_the_rows_and_says_how_many(tmp_path) -> None:
    df = _raw()
    path = _write(tmp_path, df)
    lost = int(df[["age", "hours", "job", "sex"]].isna().any(axis=1).sum())
    with pytest.warns(UserWarning, match=rf"dropped {lost} of 400 rows"):
        train, test = load_table(path, label="income", private=["sex"], categories={"sex": ["F", "M"]},
                                 missing="drop")  # fmt: skip
    assert train.n + test.n == 400 - lost


def test_dropping_rows_for_a_missing_private_value_is_a_privacy_leak_warning(tmp_path) -> None:
    path = _write(tmp_path, _raw())
    # Whether a record is trained on would depend on its private value: outside the guarantee.
    with pytest.warns(PrivacyLeakWarning, match=r"depends on its private value of \['sex'\]"):
        load_table(path, label="income", private=["sex"], categories={"sex": ["F", "M"]}, missing="drop")


def test_impute_fills_public_numbers_with_their_median_and_categories_with_their_own(tmp_path) -> None:
    df = _raw()
    path = _write(tmp_path, df)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)  # only public statistics are computed
        train, test = _load(path, missing="impute", bounds={"age": (0, 100)})
    assert train.n + test.n == 400
    assert f"job={MISSING_CATEGORY}" in train.feature_names
    assert f"sex={MISSING_CATEGORY}" in train.feature_names  # declared F/M, plus the missing category
    age = np.concatenate([train.X[:, train.feature_names.index("age")], test.X[:, test.feature_names.index("age")]])
    median = float(df["age"].median()) / 100
    assert np.isclose(age, median).sum() >= 20


def test_imputing_a_private_column_from_the_data_warns_and_a_public_fill_does_not(tmp_path) -> None:
    path = _write(tmp_path, _raw())
    priv = ["sex", "age"]
    with pytest.warns(PrivacyLeakWarning, match=r"fill value \(median\) of private column\(s\) \['age'\]"):
        load_table(path, label="income", private=priv, categories={"sex": ["F", "M"]}, bounds={"age": (0, 100)},
                   missing="impute")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        train, _ = load_table(path, label="income", private=priv, categories={"sex": ["F", "M"]},
                              bounds={"age": (0, 100)}, missing="impute", fill={"age": 50})  # fmt: skip
    assert np.isclose(train.X[:, train.feature_names.index("age")], 0.5).sum() > 0


def test_schema_missing_and_fill_entries(tmp_path) -> None:
    path = _write(tmp_path, _raw())
    schema = {"featuredp_schema": 1, "label": {"name": "income", "classes": ["<=50K", ">50K"]}, "missing": "category",
              "columns": {"age": {"type": "numeric", "bounds": [0, 100], "fill": 40},
                          "hours": {"type": "numeric", "bounds": [0, 100], "missing": "drop"},
                          "job": {"type": "categorical", "categories": ["clerk", "engineer", "nurse", "sales"]},
                          "sex": {"type": "categorical", "private": True, "categories": ["F", "M"]}}}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        warnings.simplefilter("ignore", UserWarning)
        train, test = load_table(path, schema=schema)
    assert train.n + test.n == 390  # the 10 rows without hours
    assert f"sex={MISSING_CATEGORY}" in train.feature_names
    with pytest.raises(DataValidationError, match=r"column 'job' is categorical but gives fill"):
        read_schema({**schema, "columns": {**schema["columns"], "job": {"type": "categorical", "fill": 1}}})
    with pytest.raises(DataValidationError, match=r"'missing' must be one of"):
        read_schema({**schema, "missing": "zero"})


def test_the_encoding_of_a_private_column_does_not_reveal_whether_a_value_is_missing(tmp_path) -> None:
    # An attacker reading the feature names (run.json lists them) must not learn that some
    # record's private value is missing: the missing category is there either way.
    full = _people()
    gap = full.copy()
    gap.loc[7, "sex"] = np.nan
    a, _ = _load(_write(tmp_path, full, "full.csv"), missing="category")
    b, _ = _load(_write(tmp_path, gap, "gap.csv"), missing="category")
    assert a.feature_names == b.feature_names and f"sex={MISSING_CATEGORY}" in a.feature_names
    assert "sex" not in a.statistics_from_data and "sex" not in b.statistics_from_data


def test_category_on_a_numeric_column_is_an_error(tmp_path) -> None:
    path = _write(tmp_path, _raw())
    with pytest.raises(DataValidationError, match=r"numeric column\(s\) \['age', 'hours'\] have missing values"):
        _load(path, missing="category")


def test_a_shard_may_not_compute_a_fill_value(tmp_path) -> None:
    path = _write(tmp_path, _raw())
    with pytest.raises(DataValidationError, match=r"age \(fill\)"):
        _load(path, missing="impute", rows=(0, 200))


def test_rows_with_a_missing_label_are_dropped(tmp_path) -> None:
    df = _people()
    df.loc[[3, 4], "income"] = np.nan
    with pytest.raises(DataValidationError, match=r"income \(2 missing\)"):
        _load(_write(tmp_path, df))
    train, test = _load(_write(tmp_path, df), missing="impute")
    assert train.n + test.n == 398


# -- 3. repeated column names ------------------------------------------------------------------------------


def test_a_repeated_column_name_is_an_error(tmp_path) -> None:
    path = tmp_path / "dup.csv"
    df = _people()
    # pandas would read the copy as 'age.1' and train on both
    path.write_text("age,hours,job,sex,age,income\n" + df.assign(a2=df["age"])[
        ["age", "hours", "job", "sex", "a2", "income"]].to_csv(index=False, header=False))  # fmt: skip
    for call in (lambda: _load(path), lambda: schema_for_table(path, label="income", private=["sex"])):
        with pytest.raises(DataValidationError, match=r"repeats the column name\(s\) \['age'\]"):
            call()


# -- 4. identifiers and copies of the label -------------------------------------------------------------


def _with_identifiers(n: int = 400) -> pd.DataFrame:
    df = _people(n)
    return df.assign(
        record=np.arange(5000, 5000 + n),
        name=[f"Person {i:04d}" for i in range(n)],
        visit=[f"2021-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(n)],
        comment=[f"called back on day {i} about the bill" for i in range(n)],
        income_band=np.where(df["income"] == ">50K", "high", "low"),
    )


@pytest.mark.filterwarnings("ignore:.*typed from their dtypes")
def test_identifiers_and_copies_of_the_label_are_flagged_with_a_drop_hint(tmp_path) -> None:
    path = _write(tmp_path, _with_identifiers())
    with pytest.warns(ColumnWarning) as rec:
        load_table(path, label="income", private=["sex"], categories={"sex": ["F", "M"]},
                   categorical=["name", "visit", "comment", "job"])  # the issue: one-hot encoding identifiers
    flagged = next(w.message for w in rec if isinstance(w.message, ColumnWarning))
    assert set(flagged.columns) == {"record", "name", "visit", "comment", "income_band"}
    assert "--drop record,name,visit,comment,income_band" in str(flagged) and "\n" not in str(flagged)
    assert "Person" not in str(flagged)  # reasons name counts, never values
    # Left out, nothing is flagged.
    with warnings.catch_warnings():
        warnings.simplefilter("error", ColumnWarning)
        _load(path, drop=["record", "name", "visit", "comment", "income_band"])


def test_ordinary_columns_are_not_flagged() -> None:
    df = _people(2000)
    assert flag_columns(df, "income", ["age", "hours", "job", "sex"], public=["age", "hours", "job"]) == {}


def test_a_numeric_threshold_of_the_label_is_flagged_and_a_private_label_is_not_compared() -> None:
    df = _people(1000)
    rng = np.random.default_rng(3)
    high, low = rng.uniform(50_001, 90_000, 1000), rng.uniform(10_000, 50_000, 1000)
    df["salary"] = np.where(df["income"] == ">50K", high, low)
    assert "salary" in flag_columns(df, "income", ["salary"], public=["salary"])
    assert flag_columns(df, "income", ["salary"], public=[]) == {}


# -- 5. data schema never copies identifier values ------------------------------------------------------


def test_schema_drops_identifiers_without_copying_their_values(tmp_path) -> None:
    path = _write(tmp_path, _with_identifiers())
    with pytest.warns(ColumnWarning):
        schema, _ = schema_for_table(path, label="income", private=["sex"])
    text = json.dumps(schema)
    assert "Person 0001" not in text and "2021-01-01" not in text and "called back" not in text  # before: all there
    for col in ("record", "name", "visit", "comment"):
        assert schema["columns"][col]["type"] == "drop" and schema["columns"][col]["note"]
    assert "copy of the label" in schema["columns"]["income_band"]["note"]
    assert schema["columns"]["job"]["type"] == "categorical"
    read_schema(schema)
