"""Schema files: ``featuredp data schema``'s starting schema and loading a table with one."""

from __future__ import annotations

import contextlib
import json
import warnings

import numpy as np
import pandas as pd
import pytest

from featuredp.data import load_dataset, read_schema
from featuredp.data.files import load_table, schema_for_table
from featuredp.errors import DataValidationError, PrivacyLeakWarning
from featuredp.features import Columns


def _people(n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"age": rng.integers(18, 80, n), "hours": rng.normal(40, 8, n).round(1),
                         "job": rng.choice(["clerk", "engineer", "nurse", "sales"], n), "sex": rng.integers(0, 2, n),
                         "income": rng.choice(["<=50K", ">50K"], n)})  # fmt: skip


def _write(tmp_path, df: pd.DataFrame, name: str = "people.csv"):
    path = tmp_path / name
    df.to_csv(path, index=False)
    return path


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


# -- schema files ------------------------------------------------------------------------------------------


def test_schema_for_table_never_reads_the_private_columns(tmp_path, monkeypatch) -> None:
    df = _people()
    path = _write(tmp_path, df)
    import featuredp.data.files as files

    read = []
    real = files.read_table
    monkeypatch.setattr(files, "read_table",
                        lambda p, columns=None, **kw: read.append(columns) or real(p, columns, **kw))
    schema, todo = schema_for_table(path, label="income", private=["sex"])
    assert read == [["age", "hours", "job", "income"]]
    assert todo == ["sex (type, bounds, categories)"]
    assert schema["columns"]["age"] == {"type": "numeric", "private": False, "bounds": [18, 79], "from_data": True}
    assert schema["columns"]["job"]["categories"] == ["clerk", "engineer", "nurse", "sales"]
    assert schema["label"]["classes"] == ["<=50K", ">50K"]
    assert schema["columns"]["sex"]["type"].startswith("FILL IN")
    # A private label's classes are a placeholder too.
    _, todo = schema_for_table(path, label="income", private=["sex", "income"], categorical=["sex"])
    assert todo == ["sex (categories)", "income (classes)"]


def test_loading_with_a_schema(tmp_path) -> None:
    path = _write(tmp_path, _people())
    schema, _ = schema_for_table(path, label="income", private=["sex"])
    spath = tmp_path / "schema.json"
    spath.write_text(json.dumps(schema))
    with pytest.raises(DataValidationError, match=r"placeholders for sex \(type\).*docs/own-data.md"):
        load_table(path, schema=spath)
    schema["columns"]["sex"].update(type="categorical")
    spath.write_text(json.dumps(schema))
    with pytest.raises(DataValidationError, match=r"placeholders for sex \(categories\)"):
        load_table(path, schema=spath)
    schema["columns"]["sex"].update(categories=[0, 1])  # the numeric-type placeholder for bounds is ignored
    spath.write_text(json.dumps(schema))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        train, _ = load_dataset("csv", path=str(path), schema=str(spath))
    assert train.default_private == ["sex"] and train.label_name == "income"
    assert train.column_types == {"age": "numeric", "hours": "numeric", "job": "categorical", "sex": "categorical"}
    assert train.inferred_types == []
    # What `data schema` read from the public columns is recorded as from the data: making one of them
    # private later still warns, although the schema gave the values.
    assert train.statistics_from_data == {"age": "bounds", "hours": "bounds", "job": "categories",
                                          "income": "classes"}  # fmt: skip
    with pytest.warns(PrivacyLeakWarning, match=r"age \(bounds"):
        Columns(private=["sex", "age"]).bind(train)
    # Public knowledge (no from_data flag) is not recorded; null computes from the data (and warns if private).
    schema["columns"]["age"] = {"type": "numeric", "bounds": [0, 120]}
    schema["columns"]["sex"] = {"type": "categorical", "private": True, "categories": None}
    spath.write_text(json.dumps(schema))
    with pytest.warns(PrivacyLeakWarning, match=r"sex \(category list\)"):
        train2, _ = load_table(path, schema=spath)
    assert "age" not in train2.statistics_from_data and train2.statistics_from_data["sex"] == "categories"


def test_schema_errors_name_the_file_column_and_key(tmp_path) -> None:
    path = _write(tmp_path, _people())
    base = {"featuredp_schema": 1, "label": {"name": "income"},
            "columns": {"age": "numeric", "hours": "numeric", "job": "categorical", "sex": "categorical"}}  # fmt: skip
    read_schema(base)
    with pytest.raises(DataValidationError, match="featuredp_schema"):
        read_schema({**base, "featuredp_schema": 2})
    with pytest.raises(DataValidationError, match=r"column 'age': type must be one of"):
        read_schema({**base, "columns": {**base["columns"], "age": "number"}})
    with pytest.raises(DataValidationError, match=r"column 'age': bounds must be \[low, high\]"):
        read_schema({**base, "columns": {**base["columns"], "age": {"type": "numeric", "bounds": [5, 1]}}})
    with pytest.raises(DataValidationError, match=r"column 'age' has unknown key\(s\) \['bound'\]"):
        read_schema({**base, "columns": {**base["columns"], "age": {"type": "numeric", "bound": [0, 1]}}})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataValidationError, match=r"schema '.*bad.json': not valid JSON"):
        read_schema(bad)
    # The schema and the file must agree on the columns; private columns come from the schema or the call.
    with pytest.raises(DataValidationError, match=r"schema does not match 'people.csv'.*does not list: job"):
        load_table(path, schema={**base, "columns": {k: v for k, v in base["columns"].items() if k != "job"}})
    with pytest.raises(ValueError, match="give private="):
        load_table(path, schema=base)
    with _quiet():
        train, _ = load_table(path, schema={**base, "columns": {**base["columns"], "job": "drop"}}, private=["sex"])
    assert train.raw_columns == ["age", "hours", "sex"]
