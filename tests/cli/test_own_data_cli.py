"""Your own CSV end to end on the command line (issue #17 part B, defects 6 and 7).

A CSV written here → ``data schema`` → ``train --data`` → ``audit`` → ``compare --quick``, on a
fresh cache; and the one-line errors that name the flag and the value.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from featuredp.cli import main


@pytest.fixture
def people(tmp_path, monkeypatch):
    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEATUREDP_OFFLINE", raising=False)
    rng = np.random.default_rng(0)
    n = 1500
    age = rng.integers(18, 80, n)
    hours = rng.normal(40, 10, n).round(1)
    job = rng.choice(["clerk", "engineer", "nurse", "sales"], n)
    sex = rng.integers(0, 2, n)  # a binary sensitive column, 0/1
    score = 0.05 * (age - 45) + 0.06 * (hours - 40) + 1.2 * (job == "engineer") + 0.8 * sex + rng.normal(0, 1, n)
    df = pd.DataFrame({"age": age, "hours": hours, "job": job, "sex": sex,
                       "income": np.where(score > 0.3, ">50K", "<=50K")})  # fmt: skip
    path = tmp_path / "people.csv"
    df.to_csv(path, index=False)
    return path


def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_csv_to_schema_to_train_to_audit_to_compare(people, tmp_path, capsys) -> None:
    schema = tmp_path / "schema.json"
    assert main(["data", "schema", str(people), "--label", "income", "--private", "sex", "--out", str(schema),
                 "--json"]) == 0  # fmt: skip
    assert _json(capsys)["fill_in"] == ["sex (type, bounds, categories)"]
    data = ["--data", str(people), "--schema", str(schema)]
    # The placeholders must be filled in first: a one-line error naming the column, before any work.
    assert main(["train", *data, "--epsilon", "2", "--json"]) == 2
    err = capsys.readouterr().err
    assert "placeholders for sex (type)" in err and err.count("\n") == 1
    spec = json.loads(schema.read_text())
    spec["columns"]["sex"] = {"type": "categorical", "private": True, "categories": [0, 1]}
    schema.write_text(json.dumps(spec))

    assert main(["data", "info", *data, "--json"]) == 0
    info = _json(capsys)
    assert info["default_private"] == ["sex"] and info["column_types"]["sex"] == "categorical"
    assert "sex" not in info["statistics_from_data"]

    run = tmp_path / "run"
    assert main(["train", *data, "--epsilon", "2", "--epochs", "2", "--out", str(run), "--json"]) == 0
    out = _json(capsys)
    assert out["private_columns"] == ["sex"] and out["epsilon"] <= 2 and out["accuracy"] > 0.6
    recorded = json.loads((run / "run.json").read_text())["dataset"]
    assert recorded["name"] == "csv"
    assert recorded["options"] == {"path": str(people.resolve()), "schema": str(schema.resolve())}

    # The audit reloads the data from run.json alone.
    assert main(["audit", str(run), "--attack", "attribute", "--targets", "100", "--json"]) == 0
    audit = _json(capsys)
    assert audit["attribute"] == "sex" and "verdict" in audit

    cmp_out = tmp_path / "cmp"
    assert main(["compare", *data, "--quick", "--methods", "nonprivate,dpsgd,fdp", "--epsilons", "2",
                 "--out", str(cmp_out), "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    results = pd.read_csv(cmp_out / "results.csv")
    assert sorted(results["method"]) == ["dpsgd", "fdp", "nonprivate"]
    assert not (tmp_path / "cache").exists()  # your own file needs no cache


def test_binary_private_column_with_the_defaults_can_be_audited(people, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    with pytest.warns(UserWarning, match=r"sex \(category list\)"):
        rc = main(["train", "--data", str(people), "--label", "income", "--private", "sex", "--epsilon", "2",
                   "--epochs", "1", "--out", str(run), "--json"])  # fmt: skip
    assert rc == 0
    capsys.readouterr()
    assert main(["audit", str(run), "--attack", "attribute", "--targets", "100", "--json"]) == 0
    assert _json(capsys)["attribute"] == "sex"  # before: "encoded in a single numeric column"
    # The data moved: the audit says so and takes --data.
    moved = tmp_path / "moved.csv"
    people.rename(moved)
    assert main(["audit", str(run), "--attack", "attribute", "--targets", "100", "--json"]) == 2
    assert "give the data with --data FILE" in capsys.readouterr().err
    assert main(["audit", str(run), "--attack", "attribute", "--targets", "100", "--json", "--data", str(moved),
                 "--label", "income"]) == 0  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "csv"], "--dataset csv reads your own file: give it with --data FILE"),
        (["--data", "{dir}/nope.csv", "--label", "income", "--private", "sex"], "--data {dir}/nope.csv: no such file"),
        (["--data", "{csv}", "--private", "sex"], "--data needs --label COL"),
        (["--data", "{csv}", "--label", "incme", "--private", "sex"], "--label incme: no such column"),
        (["--data", "{csv}", "--label", "income"], "--data needs --private A,B"),
        (["--data", "{csv}", "--label", "income", "--private", "sex,gender"], "--private sex,gender: no column"),
        (["--data", "{csv}", "--label", "income", "--private", "sex", "--numeric", "x"], "--numeric x: no column 'x'"),
        (["--data", "{csv}", "--label", "income", "--private", "sex", "--schema", "{dir}/s.json"], "--schema"),
        (["--schema", "{dir}/s.json"], "--schema describes your own table: give it with --data FILE"),
        (["--dataset", "adult", "--data", "{csv}"], "cannot be combined with --dataset adult"),
    ],
)
def test_bad_data_flags_exit_2_naming_the_flag_and_value(people, tmp_path, capsys, argv, message) -> None:
    argv = [a.format(dir=tmp_path, csv=people) for a in argv]
    message = message.format(dir=tmp_path)
    for command in (["train", "--epsilon", "1"], ["compare", "--quick", "--out", str(tmp_path / "o")],
                    ["data", "info"]):  # fmt: skip
        if command[0] == "data" and argv[:2] == ["--dataset", "csv"]:
            continue  # `data info` takes the dataset as NAME
        if command[0] == "data" and argv[:1] == ["--dataset"]:
            argv = [argv[1], *argv[2:]]
        assert main([*command, *argv]) == 2, command
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (command, err)
    assert not (tmp_path / "o").exists()


# -- issue #24: a raw file (missing values, identifiers, copies of the label) -------------------------------


@pytest.fixture
def raw(people, tmp_path):
    df = pd.read_csv(people)
    n = len(df)
    rng = np.random.default_rng(5)
    df.loc[rng.choice(n, 30, replace=False), "hours"] = np.nan
    df.loc[rng.choice(n, 20, replace=False), "job"] = np.nan
    df["name"] = [f"Person {i:05d}" for i in range(n)]
    df["record"] = np.arange(n)
    df["income_band"] = np.where(df["income"] == ">50K", "high", "low")
    path = tmp_path / "raw.csv"
    df.to_csv(path, index=False)
    return path


def test_raw_file_missing_values_are_one_error_then_handled_by_missing(raw, capsys) -> None:
    data = ["--data", str(raw), "--label", "income", "--private", "sex"]
    assert main(["data", "info", *data]) == 2
    err = capsys.readouterr().err.splitlines()
    error = [line for line in err if "error" in line]
    assert len(error) == 1 and "hours (30 missing)" in error[0] and "job (20 missing)" in error[0]
    assert "--missing" in error[0]
    with pytest.warns(UserWarning):
        assert main(["data", "info", *data, "--missing", "impute", "--json"]) == 0
    info = _json(capsys)
    assert info["train_rows"] + info["test_rows"] == 1500
    assert set(info["flagged_columns"]) == {"name", "record", "income_band"}
    assert main(["data", "info", "--missing", "drop"]) == 2
    assert "--missing describes your own table" in capsys.readouterr().err


def test_train_warns_about_identifiers_and_keeps_them_out_of_run_json(raw, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    with pytest.warns(UserWarning, match=r"--drop name,record,income_band"):
        rc = main(["train", "--data", str(raw), "--label", "income", "--private", "sex", "--missing", "impute",
                   "--epsilon", "2", "--epochs", "1", "--out", str(run), "--json"])  # fmt: skip
    assert rc == 0
    capsys.readouterr()
    recorded = (run / "run.json").read_text()
    assert json.loads(recorded)["dataset"]["options"]["missing"] == "impute"
    assert "identifier" not in recorded and "by itself" not in recorded


def test_data_schema_drops_identifiers_and_copies_no_names(raw, tmp_path, capsys) -> None:
    out = tmp_path / "s.json"
    with pytest.warns(UserWarning, match="look like identifiers"):
        assert main(["data", "schema", str(raw), "--label", "income", "--private", "sex", "--out", str(out),
                     "--json"]) == 0  # fmt: skip
    printed = _json(capsys)
    assert set(printed["flagged"]) == {"name", "record", "income_band"}
    text = out.read_text()
    assert "Person 00001" not in text  # before: every name was listed as a category
    spec = json.loads(text)
    assert spec["columns"]["name"]["type"] == "drop" and spec["columns"]["record"]["type"] == "drop"


def test_data_schema_takes_the_missing_values_mode_the_error_suggests(raw, tmp_path, capsys) -> None:
    """The missing-value error says --missing; following it on `data schema` must work and carry into `train`."""
    schema = tmp_path / "raw.schema.json"
    with pytest.warns(UserWarning):
        assert main(["data", "schema", str(raw), "--label", "income", "--private", "sex", "--missing", "category",
                     "--out", str(schema)]) == 0  # fmt: skip
    written = json.loads(schema.read_text())
    assert written["missing"] == "category"
    written["columns"]["sex"].update(type="categorical", categories=["Female", "Male"], bounds=None)
    written["columns"]["hours"]["missing"] = "impute"  # numeric: a category cannot stand in for a number
    written["columns"]["hours"]["fill"] = 40
    schema.write_text(json.dumps(written))
    capsys.readouterr()
    with pytest.warns(UserWarning):
        assert main(["data", "info", "--data", str(raw), "--schema", str(schema), "--json"]) == 0
    info = _json(capsys)
    assert info["train_rows"] + info["test_rows"] == 1500  # no row dropped: job's gaps became a category


# Issue 42: `compare --quick` on a user's table trained DP-SGD for 88 steps where `train` fits about 600 to the
# table (62.1 % against 72.8 %), so the comparison showed numbers no `train` run gives. Both now take one schedule.
# (Without --quick: tests/experiments/test_grid.py checks the same parameters without training.)
@pytest.mark.slow  # 20 s of training (CI time; run with `pytest -m slow`)
@pytest.mark.filterwarnings("ignore:.*encoding statistics")
def test_compare_quick_on_a_users_table_trains_with_trains_fitted_schedule(people, tmp_path, capsys) -> None:
    data = ["--data", str(people), "--label", "income", "--private", "sex", "--categorical", "sex"]
    trained = {}
    for method in ("dpsgd", "fdp"):
        run = tmp_path / method
        assert main(["train", *data, "--method", method, "--epsilon", "2", "--no-baselines", "--out", str(run),
                     "--json"]) == 0  # fmt: skip
        summary = _json(capsys)
        config = json.loads((run / "run.json").read_text())["config"]
        trained[method] = (summary["steps"], summary["batch_size"], config["lr"], summary["pretrain_steps"])
    out = tmp_path / "cmp"
    assert main(["compare", *data, "--quick", "--methods", "dpsgd,fdp", "--epsilons", "2", "--out", str(out),
                 "--quiet", "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    rows = pd.read_csv(out / "results.csv").set_index("method")
    for method, (steps, batch, lr, pretrain) in trained.items():
        row = rows.loc[method]
        compared = (int(row["steps"]), float(row["batch_size"]), json.loads(row["params"])["lr"],
                    int(row["pretrain_steps"]))  # fmt: skip
        assert compared == (steps, pytest.approx(batch), lr, pretrain), method
