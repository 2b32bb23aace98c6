"""Tabular public feature maps Ψ (Columns, LabelPrivate, FunctionMap): binding, views, errors.

The properties every map keeps (Disclosure, per example, no private read) are in test_feature_map_contract.py.
"""

from __future__ import annotations

import pytest
import torch

from _fdp_synth import make_tabular
from featuredp.engine import as_batch
from featuredp.errors import DataValidationError
from featuredp.features import Columns, FunctionMap, LabelPrivate


def test_columns_bind_maps_raw_names_to_encoded_columns():
    data = make_tabular(20)
    fmap = Columns(["sex", "race"]).bind(data)
    assert fmap.private_entries()["x"].tolist() == [False, False, True, True, True, True, True]
    desc = fmap.describe()
    assert desc.details["private_columns"] == ["sex", "race"] and desc.details["public_columns"] == ["age", "hours"]
    assert desc.details["private_encoded_columns"] == ["sex=F", "sex=M", "race=a", "race=b", "race=c"]
    assert "label" in desc.reveals and not desc.details["label_private"]
    assert desc.hides == "the private columns ['sex', 'race']"


def test_view_zeroes_private_columns_and_keeps_the_input_intact():
    data = make_tabular(20)
    batch = as_batch(data)
    original = batch["x"].clone()
    view = Columns(["race"]).bind(data)(batch)
    assert torch.equal(batch["x"], original)
    assert torch.all(view["x"][:, 4:7] == 0)
    assert torch.equal(view["x"][:, :4], original[:, :4])
    assert torch.equal(view["y"], batch["y"])


def test_view_masks_private_codes_and_drops_a_private_label():
    data = make_tabular(20, codes=True)
    batch = as_batch(data)
    fmap = Columns(["sex", "label"]).bind(data)
    view = fmap(batch)
    assert fmap.label_private and "y" not in view
    assert torch.all(view["x_cat"][:, 0] == -1) and torch.equal(view["x_cat"][:, 1], batch["x_cat"][:, 1])
    assert torch.equal(view["x"], batch["x"])  # numeric columns are public


def test_public_list_form():
    data = make_tabular(20)
    fmap = Columns(public=["age", "hours", "race"]).bind(data)
    assert fmap.private_columns == ["sex"]


def test_unknown_column_lists_available_columns():
    data = make_tabular(20)
    with pytest.raises(DataValidationError, match=r"unknown column\(s\) \['gender'\].*available columns: age, hours"):
        Columns(["gender"]).bind(data)


def test_empty_or_total_private_sets_are_refused():
    data = make_tabular(20)
    with pytest.raises(DataValidationError, match="private set is empty"):
        Columns([]).bind(data)
    with pytest.raises(DataValidationError, match="every feature column is private"):
        Columns(["age", "hours", "sex", "race"]).bind(data)
    with pytest.raises(ValueError, match="exactly one of private"):
        Columns()
    with pytest.raises(TypeError, match="not a string"):
        Columns("sex")
    Columns([], label_private=True).bind(data)  # label-only privacy is a valid declaration


def test_unbound_columns_refuse_to_run():
    with pytest.raises(RuntimeError, match=r"bind\(dataset\)"):
        Columns(["sex"])({"x": torch.zeros(2, 7)})


def test_label_private_and_function_map():
    batch = {"x": torch.ones(3, 2), "y": torch.zeros(3, dtype=torch.long)}
    assert set(LabelPrivate()(batch)) == {"x"}
    assert LabelPrivate().describe().details["label_private"]
    fm = FunctionMap(lambda b: {"x": b["x"][:, :1]}, "the first column only")
    assert fm(batch)["x"].shape == (3, 1) and fm.describe().reveals == "the first column only"
    with pytest.raises(ValueError, match="description"):
        FunctionMap(lambda b: b, " ")
    with pytest.raises(TypeError, match="dict of tensors"):
        FunctionMap(lambda b: b["x"], "x")(batch)


def test_training_entry_point_checks_the_private_set_it_trains_with():
    """`featuredp train --private age` on a dataset loaded with other private columns: warned when Ψ is bound."""
    import numpy as np
    import pandas as pd

    from featuredp.data.tabular import TableSpec, encode_frames
    from featuredp.errors import PrivacyLeakWarning
    from featuredp.experiments.train_one import train_tabular

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"age": rng.integers(18, 80, 80), "sex": rng.choice(["F", "M"], 80),
                       "label": rng.choice(["no", "yes"], 80)})  # fmt: skip
    spec = TableSpec(label="label", numeric=("age",), categorical=("sex",), private=("sex",),
                     categories={"sex": ["F", "M"]})  # fmt: skip
    data = encode_frames(df[:60], df[60:], spec, name="people")
    with pytest.warns(PrivacyLeakWarning, match=r"age \(bounds") as record:
        train_tabular(data=data, private=["age"], method="nonprivate", epochs=1, progress=False, model="logreg",
                     batch_size=16)
    assert sum("age (bounds" in str(w.message) for w in record) == 1  # bound twice (caller, trainer), said once


def test_maps_on_datasets_without_a_provenance_record_do_not_warn():
    import warnings

    from featuredp.errors import PrivacyLeakWarning

    data = make_tabular(20)  # built by hand: statistics_from_data is None (nothing recorded to check)
    assert data.statistics_from_data is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        Columns(["age"], label_private=True).bind(data)
        LabelPrivate().bind(data)
