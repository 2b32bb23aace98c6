"""What a new user hit training on their own tables (issue 36 item 5): a private label, a constant column, a
semicolon-separated file, a schema of another file. Each is fixed or a one-line error (exit 2) before any work."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from featuredp.cli import main


@pytest.fixture
def table(tmp_path, monkeypatch):
    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(1)
    n = 1000
    x1, x2 = rng.normal(0, 1, n), rng.normal(0, 1, n)
    c = rng.choice(list("pqrs"), n)
    y = np.digitize(x1 + 0.5 * x2 + rng.normal(0, 0.5, n), [-1.2, -0.4, 0.4, 1.2])
    df = pd.DataFrame({"x1": x1.round(3), "x2": x2.round(3), "c": c, "y": [f"k{v}" for v in y]})
    path = tmp_path / "multi.csv"
    df.to_csv(path, index=False)
    return path, df


def test_a_private_label_trains_and_reports_no_public_only_accuracy(table, capsys):
    """With the label private the public-only reference was trained on logsumexp alone (16.9 % against a
    majority class of 28 %): now it says why there is none."""
    path, _ = table
    assert main(["train", "--data", str(path), "--label", "y", "--private", "y", "--method", "fdp_dpsgd",
                 "--epsilon", "2", "--epochs", "2", "--quiet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label_private"] is True and out["baselines"]["public_only"] is None
    assert "majority class" in out["baselines"]["public_only_note"]
    assert main(["train", "--data", str(path), "--label", "y", "--private", "y", "--method", "fdp",
                 "--epsilon", "2", "--epochs", "1", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "public only: not trained (the label is private" in text


@pytest.mark.parametrize("method", ["fdp", "fdp_dpsgd"])
def test_pretraining_with_a_private_label_is_a_one_line_error(table, capsys, method):
    path, _ = table
    assert main(["train", "--data", str(path), "--label", "y", "--private", "y", "--method", method,
                 "--epsilon", "2", "--pretrain-epochs", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--pretrain-epochs" in err and "private label" in err


@pytest.mark.parametrize("sep", [";", "|", "\t"])
def test_a_file_with_another_delimiter_is_read_with_a_note(table, tmp_path, capsys, recwarn, sep):
    _, df = table
    path = tmp_path / "other.csv"
    df.to_csv(path, index=False, sep=sep)
    assert main(["data", "info", "--data", str(path), "--label", "y", "--private", "c"]) == 0
    assert "x1" in capsys.readouterr().out
    assert any(f"-separated: read with {sep!r}" in str(w.message) for w in recwarn)
    recwarn.clear()
    # --sep given: no guess, no note
    flag = "tab" if sep == "\t" else sep
    assert main(["data", "info", "--data", str(path), "--label", "y", "--private", "c", "--sep", flag]) == 0
    assert "x1" in capsys.readouterr().out
    assert not any("-separated" in str(w.message) for w in recwarn)


def test_a_wrong_sep_and_a_bad_sep_are_one_line_errors(table, capsys):
    path, _ = table
    assert main(["train", "--data", str(path), "--label", "y", "--private", "c", "--sep", ";", "--epsilon", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--label y: no such column" in err and "check --sep" in err
    assert main(["train", "--data", str(path), "--label", "y", "--private", "c", "--sep", "x", "--epsilon", "1"]) == 2
    assert "--sep 'x'" in capsys.readouterr().err


def test_a_schema_of_another_file_is_one_line_naming_both_files_and_the_columns(table, tmp_path, capsys):
    path, df = table
    schema = tmp_path / "s.json"
    assert main(["data", "schema", str(path), "--label", "y", "--private", "c", "--out", str(schema)]) == 0
    other = tmp_path / "other.csv"
    df.rename(columns={"x1": "a1", "x2": "a2"}).to_csv(other, index=False)
    capsys.readouterr()
    assert main(["train", "--data", str(other), "--schema", str(schema), "--epsilon", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "s.json" in err and "other.csv" in err and "x1, x2" in err and "a1, a2" in err


@pytest.mark.parametrize("column", [
    [5.0] * 40,  # constant
    [-3.0] * 40,  # negative constant
    [np.nan] * 39 + [7.5],  # all missing but one
])
def test_data_schema_writes_what_train_accepts_for_one_valued_columns(tmp_path, capsys, column):
    rng = np.random.default_rng(2)
    df = pd.DataFrame({"x": rng.normal(0, 1, 40).round(3), "odd": column, "s": rng.integers(0, 2, 40),
                       "y": rng.integers(0, 2, 40)})  # fmt: skip
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    schema = tmp_path / "t.json"
    assert main(["data", "schema", str(path), "--label", "y", "--private", "s", "--categorical", "s",
                 "--missing", "impute", "--out", str(schema)]) == 0
    written = json.loads(schema.read_text())
    lo, hi = written["columns"]["odd"]["bounds"]
    assert lo < hi and "one value" in written["columns"]["odd"]["note"]
    written["columns"]["s"]["categories"] = ["0", "1"]
    schema.write_text(json.dumps(written))
    capsys.readouterr()
    assert main(["train", "--data", str(path), "--schema", str(schema), "--method", "nonprivate", "--epochs", "1",
                 "--quiet", "--no-baselines"]) == 0


def test_data_schema_of_a_single_row_is_accepted_back(tmp_path):
    from featuredp.data import read_schema
    from featuredp.data.files import schema_for_table

    path = tmp_path / "one.csv"
    pd.DataFrame({"x": [2.5], "n": [-1], "k": ["b"], "c": ["a"], "y": [1]}).to_csv(path, index=False)
    schema, todo = schema_for_table(path, label="y", private=["c"])
    read_schema(schema)
    assert schema["columns"]["x"]["bounds"] == [2.5, 3.5] and schema["columns"]["n"]["bounds"] == [-1, 0]
    assert schema["columns"]["k"]["categories"] == ["b"]
    assert any(t.startswith("y (classes") for t in todo)  # one label value: the classes are left to fill in


def test_fdp_with_a_private_label_trains_with_the_defaults(tmp_path, capsys):
    """The user's crash: `train --data FILE --label y --private y` (fdp, the fitted schedule) diverged to weights
    of 1e18 and stopped with "the model (MLP) mixes examples across the batch" (2 of 2 runs on this table)."""
    rng = np.random.default_rng(1)
    n = 2000
    x1, x2 = rng.normal(0, 1, n), rng.normal(0, 1, n)
    y = np.digitize(x1 + 0.5 * x2 + rng.normal(0, 0.5, n), [-1.2, -0.4, 0.4, 1.2])
    path = tmp_path / "five.csv"
    pd.DataFrame({"x1": x1.round(3), "x2": x2.round(3), "c": rng.choice(list("pqrs"), n),
                  "y": [f"k{v}" for v in y]}).to_csv(path, index=False)  # fmt: skip
    assert main(["train", "--data", str(path), "--label", "y", "--private", "y", "--epsilon", "2", "--quiet",
                 "--json", "--no-baselines"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label_private"] is True and 0.0 <= out["accuracy"] <= 1.0
