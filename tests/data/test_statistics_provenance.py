"""Attacker-style tests: encoding statistics read from private data are caught at training time.

The private set used for training (the Ψ bound to the data) may differ from the one
declared when the dataset was loaded. Each dataset records which encoding statistics
(bounds, category lists, the class list) were computed from the data
(``statistics_from_data``); binding Ψ re-checks them against the columns it makes private.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from census_synth import census_frames_synth

from featuredp.data import TabularDataset, load_dataset
from featuredp.data.census import load_census_income
from featuredp.data.criteo import INT_COLUMNS, load_criteo, load_criteo_style
from featuredp.data.purchase import N_CLUSTERS, load_purchase100, load_purchase_style
from featuredp.data.tabular import TableSpec, encode_frames
from featuredp.errors import DataValidationError, PrivacyLeakWarning
from featuredp.features import Columns, LabelPrivate

PUBLIC_KNOWLEDGE = {
    "bounds": {"age": (0, 100), "hours": (0, 80)},
    "categories": {"sex": ["F", "M"], "job": ["a", "b", "c"]},
}


@contextmanager
def no_leak_warning() -> Iterator[None]:
    """Turn any PrivacyLeakWarning into an error inside the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        yield


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


def _csv(tmp_path, df: pd.DataFrame, name: str = "people.csv") -> str:
    path = tmp_path / name
    df.to_csv(path, index=False)
    return str(path)


def _encode_nothing_private(**spec_options) -> TabularDataset:
    """The frame encoded with no column declared private at load time (so nothing warns then)."""
    df = _frame()
    spec = TableSpec(label="label", numeric=("age", "hours"), categorical=("sex", "job"), **spec_options)
    with no_leak_warning():
        train, _ = encode_frames(df[:40], df[40:], spec, name="t")
    return train


# -- the record ------------------------------------------------------------------------------------------


def test_encoder_records_where_every_statistic_came_from() -> None:
    train = _encode_nothing_private()
    assert train.statistics_from_data == {
        "label": "classes", "age": "bounds", "hours": "bounds", "sex": "categories", "job": "categories",
    }  # fmt: skip
    fixed = _encode_nothing_private(**PUBLIC_KNOWLEDGE, classes=["no", "yes"])
    assert fixed.statistics_from_data == {}
    partly = _encode_nothing_private(bounds={"age": (0, 100)}, categories={"job": ["a", "b", "c"]})
    assert partly.statistics_from_data == {"label": "classes", "hours": "bounds", "sex": "categories"}


def test_record_survives_subset_and_replace_and_is_not_shared() -> None:
    train = _encode_nothing_private(bounds={"age": (0, 100)})
    sub = train.subset([0, 1, 2])
    renamed = replace(train, name="renamed")
    assert sub.statistics_from_data == train.statistics_from_data == renamed.statistics_from_data
    sub.statistics_from_data["age"] = "bounds"  # mutating a copy must not rewrite the parent's record
    assert "age" not in train.statistics_from_data
    with pytest.raises(DataValidationError, match="statistics_from_data values must be one of"):
        replace(train, statistics_from_data={"age": "mean"})


# -- the attack: a column made private only at training time --------------------------------------------


def test_column_made_private_at_training_warns_about_its_bounds(tmp_path) -> None:
    path = _csv(tmp_path, _frame(200))
    # Loaded with only 'sex' private (its categories public): nothing is read from private data yet.
    with no_leak_warning():
        train, _ = load_dataset("csv", path=path, label="label", private=["sex"], categories={"sex": ["F", "M"]})
    # The attack: 'age' becomes private only for training, but its scaling is the private min/max.
    with pytest.warns(PrivacyLeakWarning, match=r"age \(bounds.*\).*bounds=") as record:
        Columns(private=["age"]).bind(train)
    message = str(record[0].message)
    assert "hours" not in message and "sex" not in message  # public columns are not reported
    # Public bounds given at load: nothing to report.
    with no_leak_warning():
        fixed, _ = load_dataset(
            "csv", path=path, label="label", private=["sex"], categories={"sex": ["F", "M"]}, bounds={"age": (0, 120)}
        )
        Columns(private=["age"]).bind(fixed)


def test_encoder_with_no_private_set_then_private_bounds_at_training() -> None:
    train = _encode_nothing_private()
    with pytest.warns(PrivacyLeakWarning, match=r"age \(bounds"):
        Columns(private=["age"]).bind(train)
    with no_leak_warning():
        Columns(private=["age"]).bind(_encode_nothing_private(bounds={"age": (0, 100)}))


def test_column_made_private_at_training_warns_about_its_category_list(tmp_path) -> None:
    path = _csv(tmp_path, _frame(200))
    with no_leak_warning():
        train, _ = load_dataset("csv", path=path, label="label", private=["sex"], categories={"sex": ["F", "M"]})
    with pytest.warns(PrivacyLeakWarning, match=r"job \(category list\).*categories="):
        Columns(private=["job"]).bind(train)
    # The public form of the declaration is checked the same way (every column not listed is private).
    with pytest.warns(PrivacyLeakWarning, match=r"job \(category list\)"):
        Columns(public=["age", "hours", "sex"]).bind(train)
    with no_leak_warning():
        fixed, _ = load_dataset(
            "csv", path=path, label="label", private=["sex"],
            categories={"sex": ["F", "M"], "job": ["a", "b", "c"]},
        )  # fmt: skip
        Columns(private=["job"]).bind(fixed)


def test_codes_encoding_is_checked_too() -> None:
    df = _frame()
    spec = TableSpec(label="label", numeric=("age",), categorical=("sex", "job"), bounds={"age": (0, 100)})
    train, _ = encode_frames(df[:40], df[40:], spec, name="t", categorical="codes")
    with pytest.warns(PrivacyLeakWarning, match=r"job \(category list\)"):
        Columns(private=["job"]).bind(train)


def test_label_made_private_at_training_warns_about_its_class_list(tmp_path) -> None:
    path = _csv(tmp_path, _frame(200))
    opts = dict(path=path, label="label", private=["sex"], categories={"sex": ["F", "M"]})
    with no_leak_warning():
        train, _ = load_dataset("csv", **opts)
    assert train.statistics_from_data["label"] == "classes"
    for fmap in (Columns(private=["sex", "label"]), Columns(private=["sex"], label_private=True), LabelPrivate()):
        with pytest.warns(PrivacyLeakWarning, match=r"label \(class list\).*classes="):
            fmap.bind(train)
    # A public label's class list is a function of public data: no warning.
    with no_leak_warning():
        Columns(private=["sex"]).bind(train)
    # Declared classes: nothing read from the data.
    with no_leak_warning():
        fixed, _ = load_dataset("csv", **opts, classes=["no", "yes"])
        assert "label" not in fixed.statistics_from_data
        Columns(private=["sex", "label"]).bind(fixed)
        LabelPrivate().bind(fixed)


def test_one_warning_lists_every_column_and_statistic() -> None:
    train = _encode_nothing_private(bounds={"age": (0, 100)})
    with pytest.warns(PrivacyLeakWarning) as record:
        Columns(private=["age", "hours", "job", "label"]).bind(train)
    assert len(record) == 1
    message = str(record[0].message)
    for part in ("hours (bounds", "job (category list)", "label (class list)", "bounds= / categories= / classes="):
        assert part in message
    assert "age" not in message  # its bounds are public


def test_private_statistics_are_in_the_privacy_report() -> None:
    train = _encode_nothing_private(bounds={"age": (0, 100)})
    with pytest.warns(PrivacyLeakWarning):
        fmap = Columns(private=["hours", "sex"]).bind(train)
    assert fmap.describe()["private_statistics_from_data"] == {"hours": "bounds", "sex": "categories"}
    with no_leak_warning():
        clean = Columns(private=["age"]).bind(train)
    assert "private_statistics_from_data" not in clean.describe()


# -- no double warning, no missed one ---------------------------------------------------------------------


def test_load_time_warning_is_not_repeated_but_new_columns_are_reported() -> None:
    df = _frame()
    spec = TableSpec(label="label", numeric=("age", "hours"), categorical=("sex", "job"), private=("hours",),
                     categories={"sex": ["F", "M"], "job": ["a", "b", "c"]})  # fmt: skip
    with pytest.warns(PrivacyLeakWarning, match=r"hours \(min/max\)"):
        train, test = encode_frames(df[:40], df[40:], spec, name="t")
    assert train.statistics_warned == ["hours"]
    with no_leak_warning():  # the same private set as at load time: already said
        Columns(private=["hours"]).bind(train)
        Columns(private=["hours"]).bind(train.subset([0, 1]))
    with pytest.warns(PrivacyLeakWarning) as record:  # 'age' is new: reported, 'hours' not again
        fmap = Columns(private=["hours", "age"]).bind(train)
    assert len(record) == 1 and "age (bounds" in str(record[0].message) and "hours" not in str(record[0].message)
    with no_leak_warning():  # binding the same map again (the trainer does) says nothing new
        fmap.bind(train)
        fmap.bind(test)
    assert fmap.describe()["private_statistics_from_data"] == {"hours": "bounds", "age": "bounds"}


def test_a_dataset_built_by_hand_claiming_no_warning_still_warns() -> None:
    train = _encode_nothing_private()
    hand = replace(train, statistics_warned=[])  # e.g. rebuilt without the loader's record of its warnings
    with pytest.warns(PrivacyLeakWarning, match=r"age \(bounds"):
        Columns(private=["age"]).bind(hand)


# -- classes= on the generic loader -------------------------------------------------------------------------


def test_declared_classes_order_and_labels_outside_them(tmp_path) -> None:
    path = _csv(tmp_path, _frame(200))
    base = dict(path=path, label="label", private=["sex"], categories={"sex": ["F", "M"]})
    train, test = load_dataset("csv", **base, classes=["yes", "no"])
    assert train.classes == ["yes", "no"]  # the declared order, not sorted
    raw = _frame(200)["label"].to_numpy()
    assert set(np.unique(train.y)) == {0, 1} and (train.y == 0).sum() + (test.y == 0).sum() == (raw == "yes").sum()
    assert load_dataset("csv", **base, classes="no,yes")[0].classes == ["no", "yes"]
    with pytest.raises(DataValidationError, match=r"\['yes'\].*classes=\['no', 'maybe'\]"):
        load_dataset("csv", **base, classes=["no", "maybe"])
    with pytest.raises(DataValidationError, match="classes must list at least two distinct"):
        load_dataset("csv", **base, classes=["no", "no"])
    with pytest.raises(TypeError, match="classes must be a list"):
        load_dataset("csv", **base, classes={"no": 0, "yes": 1})


def test_private_label_inferred_at_load_still_warns_at_load(tmp_path) -> None:
    path = _csv(tmp_path, _frame(200))
    with pytest.warns(PrivacyLeakWarning, match=r"label \(class list\).*classes="):
        load_dataset("csv", path=path, label="label", private=["sex", "label"], categories={"sex": ["F", "M"]})
    with no_leak_warning():
        load_dataset("csv", path=path, label="label", private=["sex", "label"], categories={"sex": ["F", "M"]},
                     classes=["no", "yes"])  # fmt: skip


def test_neighbouring_datasets_with_a_rare_private_class(tmp_path) -> None:
    """One record is the only one of its class; removing it must not change the encoding."""
    df = _frame(80)
    df.loc[17, "label"] = "rare"
    test_path = _csv(tmp_path, _frame(30, seed=1), "test.csv")
    full_path = _csv(tmp_path, df, "full.csv")
    neighbour_path = _csv(tmp_path, df.drop(index=17).reset_index(drop=True), "neighbour.csv")
    opts = dict(label="label", private=["sex", "label"], test=test_path, **PUBLIC_KNOWLEDGE)

    # The leak being fixed: inferred, the class list (and so the model's output size) reveals the record.
    with pytest.warns(PrivacyLeakWarning):
        leaky_full, _ = load_dataset("csv", path=full_path, **opts)
    with pytest.warns(PrivacyLeakWarning):
        leaky_nb, _ = load_dataset("csv", path=neighbour_path, **opts)
    assert leaky_full.classes != leaky_nb.classes

    with no_leak_warning():
        full, full_test = load_dataset("csv", path=full_path, classes=["no", "yes", "rare"], **opts)
        nb, nb_test = load_dataset("csv", path=neighbour_path, classes=["no", "yes", "rare"], **opts)
        Columns(private=["sex", "label"]).bind(full)
        Columns(private=["sex", "label"]).bind(nb)
    assert full.classes == nb.classes == ["no", "yes", "rare"]
    assert full.X.shape[1] == nb.X.shape[1] and full.feature_names == nb.feature_names
    assert full.statistics_from_data == nb.statistics_from_data == {}
    # Everything declared: the neighbour's encoding is the full one minus that record.
    np.testing.assert_array_equal(nb.X, np.delete(full.X, 17, axis=0))
    np.testing.assert_array_equal(nb.y, np.delete(full.y, 17))
    np.testing.assert_array_equal(full_test.X, nb_test.X)
    # A neighbour where the private label happens to be constant still loads (the declared list decides).
    constant = df.assign(label="no")
    train_const, _ = load_dataset("csv", path=_csv(tmp_path, constant, "constant.csv"), classes=["no", "yes", "rare"],
                                  **opts)  # fmt: skip
    assert train_const.classes == full.classes


# -- every loader fills the record in ---------------------------------------------------------------------------


def test_census_and_criteo_style_read_no_statistics() -> None:
    frames = census_frames_synth(300, 100)
    with no_leak_warning():
        train, _ = load_census_income(frames=frames)
        assert train.statistics_from_data == {}
        Columns(private=["age", "education", "sex"], label_private=True).bind(train)  # codebook + fixed classes
        style, _ = load_criteo_style(frames=frames, n_train=200, n_test=50)
        assert style.statistics_from_data == {}


def _criteo_file(tmp_path, n: int = 60) -> str:
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(n):
        ints = [str(int(rng.integers(0, 500))) for _ in INT_COLUMNS]
        cats = [f"{int(rng.integers(0, 40)):08x}" for _ in range(26)]
        lines.append("\t".join([str(int(rng.random() < 0.3)), *ints, *cats]))
    path = tmp_path / "day.tsv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_criteo_integer_columns_scaled_from_data_are_recorded(tmp_path) -> None:
    path = _criteo_file(tmp_path)
    with no_leak_warning():  # the default private set is the hashed categoricals: nothing read from them
        train, _ = load_criteo(path=path, hash_buckets=16)
    assert train.statistics_from_data == dict.fromkeys(INT_COLUMNS, "bounds")
    with pytest.warns(PrivacyLeakWarning, match=r"I1 \(bounds"):
        Columns(private=["I1", "C1"]).bind(train)
    with no_leak_warning():
        fixed, _ = load_criteo(path=path, hash_buckets=16, bounds={"I1": (0, 1e6)})
        assert "I1" not in fixed.statistics_from_data
        Columns(private=["I1", "C1"]).bind(fixed)


def test_purchase100_class_list_read_from_labels_unless_declared(tmp_path) -> None:
    rng = np.random.default_rng(0)
    X, y = (rng.random((100, 30)) < 0.1).astype(np.int64), rng.integers(1, 6, 100)
    path = tmp_path / "purchase.npz"
    np.savez(path, features=X, labels=y.astype(np.float64))
    with no_leak_warning():
        train, _ = load_purchase100(path=path, n_public=10)
    assert train.statistics_from_data == {"label": "classes"}
    with pytest.warns(PrivacyLeakWarning, match=r"label \(class list\)"):
        Columns(private=["f000"], label_private=True).bind(train)
    with no_leak_warning():
        fixed, _ = load_purchase100(path=path, n_public=10, classes=range(1, 8))
        Columns(private=["f000"], label_private=True).bind(fixed)
    assert fixed.statistics_from_data == {} and fixed.classes == [str(k) for k in range(1, 8)]
    np.testing.assert_array_equal(fixed.y, train.y)  # labels 1..5 map to the same indices 0..4
    with pytest.raises(DataValidationError, match=r"\['5'\].*classes="):
        load_purchase100(path=path, classes=range(1, 5))


def test_purchase_style_class_list_is_the_fixed_cluster_ids() -> None:
    train, test = load_purchase_style(frames=census_frames_synth(400, 100), n_public=20, test_fraction=0.25)
    assert train.classes == test.classes == [f"cluster{k:02d}" for k in range(N_CLUSTERS)]
    assert train.statistics_from_data == {}  # binary features used as they are; fixed class ids
