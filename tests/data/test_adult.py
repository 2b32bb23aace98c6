"""Bundled UCI Adult: standard split, fixed encoding, no private statistics."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from featuredp.data import load_dataset
from featuredp.data.adult import ADULT_CATEGORIES, ADULT_NUMERIC, adult_frames
from featuredp.errors import DataValidationError, PrivacyLeakWarning


@pytest.fixture(scope="module")
def adult():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)  # the encoding must read no private statistics
        return load_dataset("adult")


def test_standard_split_and_label(adult) -> None:
    train, test = adult
    assert (train.n, test.n) == (32_561, 16_281)
    assert train.classes == ["<=50K", ">50K"]
    # Known class balance of the release: 7,841 and 3,846 incomes above 50K.
    assert int(train.y.sum()) == 7_841 and int(test.y.sum()) == 3_846


def test_encoding_is_fixed_and_bounded(adult) -> None:
    train, test = adult
    n_onehot = sum(len(v) for v in ADULT_CATEGORIES.values()) + 3  # '?' for the three columns with missing values
    assert train.X.shape[1] == len(ADULT_NUMERIC) + n_onehot == test.X.shape[1]
    assert train.feature_names == test.feature_names
    assert np.all((train.X >= 0) & (train.X <= 1)) and np.all((test.X >= 0) & (test.X <= 1))
    cat = [i for i, s in enumerate(train.feature_sources) if s not in ADULT_NUMERIC]
    assert np.all(train.X[:, cat].sum(1) == len(ADULT_CATEGORIES))  # exactly one level per categorical column
    sex = [i for i, s in enumerate(train.feature_sources) if s == "sex"]
    assert [train.feature_names[i] for i in sex] == ["sex=Female", "sex=Male"]
    assert train.default_private == ["sex", "race"]
    assert "CC BY 4.0" in train.description and "Kohavi" in train.description


def test_missing_values_handled_explicitly() -> None:
    raw_train, _ = adult_frames("category")
    assert (raw_train["workclass"] == "?").sum() == 1_836
    dropped_train, dropped_test = adult_frames("drop")
    assert (len(dropped_train), len(dropped_test)) == (30_162, 15_060)
    train, _ = load_dataset("adult", missing="drop", categorical="codes")
    assert train.n == 30_162 and train.X.shape[1] == len(ADULT_NUMERIC)
    assert train.cat_sources == list(ADULT_CATEGORIES)
    # No '?' category and no value outside the codebook: the reserved unknown code never occurs.
    assert np.all(train.X_cat < np.array(train.cat_cardinalities) - 1)


def test_private_columns_option() -> None:
    train, _ = load_dataset("adult", private=["sex", "income"])
    assert train.default_private == ["sex", "income"]
    with pytest.raises(DataValidationError, match="unknown private column"):
        load_dataset("adult", private=["gender"])


def test_default_private_set_reads_no_statistics_at_training(adult) -> None:
    """Adult's bounds, categories and classes are fixed constants: nothing to warn about when training."""
    from featuredp.features import Columns, LabelPrivate

    train, test = adult
    assert train.statistics_from_data == {} == test.statistics_from_data
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        Columns(private=list(train.default_private)).bind(train)
        # Not only the default set: a numeric column or the label made private at training time too.
        Columns(private=["age", "capital_gain", "native_country"], label_private=True).bind(train)
        LabelPrivate().bind(train)
