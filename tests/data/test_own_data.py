"""Your own CSV/Parquet file: column typing (issue #17 defects 4, 5, 7) and schema files."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pandas as pd
import pytest

from featuredp.attacks.tabular import attribute_block
from featuredp.data import load_dataset
from featuredp.data.files import load_table
from featuredp.errors import DataValidationError, PrivacyLeakWarning


def _people(n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 80, n)
    hours = rng.normal(40, 8, n).round(1)
    job = rng.choice(["clerk", "engineer", "nurse", "sales"], n)
    sex = rng.integers(0, 2, n)  # a 0/1 flag: numeric dtype
    score = 0.05 * (age - 45) + 0.08 * (hours - 40) + (job == "engineer") + 0.5 * sex + rng.normal(0, 1, n)
    return pd.DataFrame({"age": age, "hours": hours, "job": job, "sex": sex,
                         "income": np.where(score > 0, ">50K", "<=50K")})  # fmt: skip


def _write(tmp_path, df: pd.DataFrame, name: str = "people.csv"):
    path = tmp_path / name
    df.to_csv(path, index=False) if name.endswith(".csv") else df.to_parquet(path, index=False)
    return path


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # PrivacyLeakWarning and the typing report
        yield


# -- defect 4: categorical= without numeric= dropped every unlisted column -----------------------------


def test_unlisted_columns_are_typed_from_dtypes_not_dropped(tmp_path) -> None:
    path = _write(tmp_path, _people())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train, _ = load_table(path, label="income", categorical=["job"], private=["sex"], categories={"sex": [0, 1]})
    assert train.raw_columns == ["age", "hours", "job", "sex"]  # before: only 'job' and 'sex' survived
    assert [str(w.message) for w in caught if "typed from their dtypes: age numeric" in str(w.message)]
    assert train.column_types == {"age": "numeric", "hours": "numeric", "job": "categorical", "sex": "categorical"}
    assert train.inferred_types == ["age", "hours"]
    assert "typed from dtypes: age numeric" in train.description
    # drop= leaves a column out on purpose.
    with pytest.warns(UserWarning, match="hours numeric"):
        dropped, _ = load_table(path, label="income", categorical=["job"], private=["sex"], drop=["age"],
                                categories={"sex": [0, 1]})  # fmt: skip
    assert "age" not in dropped.raw_columns


# -- defect 5: one text value turned a numeric column into one-hot columns ------------------------------


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_text_value_in_a_numeric_column_is_an_error_naming_column_row_and_value(tmp_path, suffix) -> None:
    df = _people()
    df["hours"] = df["hours"].astype(str)  # a text column, as a spreadsheet export would write it
    df.loc[17, "hours"] = "unknown"
    path = _write(tmp_path, df, "people" + suffix)
    where = r"row 17 \(line 19 of the file\)" if suffix == ".csv" else "row 17"
    with pytest.raises(DataValidationError, match=rf"'hours' looks numeric.*{where} holds 'unknown'.*--numeric hours"):
        load_table(path, label="income", private=["sex"])
    # Declaring the type settles it: categorical keeps the text, numeric names the value to fix.
    with _quiet():
        train, _ = load_table(path, label="income", private=["sex"], categorical=["hours"])
    assert train.column_types["hours"] == "categorical"
    with _quiet(), pytest.raises(DataValidationError, match=r"numeric column 'hours' in 'people.*row 17: 'unknown'"):
        load_table(path, label="income", private=["sex"], numeric=["hours"])


# -- defect 7: a binary sensitive column loaded with the defaults could not be audited -------------------


def test_a_binary_private_column_is_categorical_and_can_be_attacked(tmp_path) -> None:
    path = _write(tmp_path, _people())
    with pytest.warns(PrivacyLeakWarning, match=r"sex \(category list\).*schema"):
        train, _ = load_dataset("csv", path=str(path), label="income", private=["sex"])
    assert train.column_types["sex"] == "categorical"
    cols, names = attribute_block(train, "sex")  # at HEAD: "encoded in a single numeric column"
    assert names == ["0", "1"] and len(cols) == 2
    # Declared categories (any spelling of the numbers) read nothing from the data.
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        fixed, _ = load_dataset("csv", path=str(path), label="income", private=["sex"], categories={"sex": [0.0, 1]})
    assert "sex" not in fixed.statistics_from_data
    np.testing.assert_array_equal(fixed.X, train.X)
    # A public 0/1 column, or a private one with many values, stays numeric.
    df = _people()
    df["level"] = np.arange(len(df)) % 11  # more distinct values than LOW_CARDINALITY (10)
    with _quiet():
        other, _ = load_table(_write(tmp_path, df, "more.csv"), label="income", private=["level"])
    assert other.column_types["sex"] == "numeric" and other.column_types["level"] == "numeric"
