"""``--data FILE --label COL`` on pate, cloak, convex and icl (issue #24), and what --dataset refuses.

Before, these commands knew only their built-in datasets: ``--data people.csv`` was silently read as
an abbreviation of ``--dataset`` (an "invalid choice" about a dataset nobody named), and a file given
to ``--dataset`` was looked up as a name.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from featuredp.cli import main

N_ROWS = 400


@pytest.fixture
def people(tmp_path, monkeypatch):
    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEATUREDP_OFFLINE", raising=False)
    rng = np.random.default_rng(0)
    age = rng.integers(18, 80, N_ROWS)
    hours = rng.normal(40, 10, N_ROWS).round(1)
    job = rng.choice(["clerk", "engineer", "nurse", "sales"], N_ROWS)
    sex = rng.choice(["F", "M"], N_ROWS)
    score = 0.05 * (age - 45) + 0.06 * (hours - 40) + 1.2 * (job == "engineer") + 0.8 * (sex == "M")
    df = pd.DataFrame({"age": age, "hours": hours, "job": job, "sex": sex,
                       "earns": np.where(score + rng.normal(0, 1, N_ROWS) > 0.3, "high", "low")})  # fmt: skip
    path = tmp_path / "people.csv"
    df.to_csv(path, index=False)
    return path


def _run(capsys, argv):
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out)


def _own(out, people):
    assert out["dataset"] == "csv"
    assert out["data"]["path"] == str(people.resolve()) and out["data"]["label"] == "earns"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_pate_on_your_table(people, capsys) -> None:
    out = _run(capsys, ["pate", "--data", str(people), "--label", "earns", "--teachers", "8", "--queries", "30",
                        "--epsilon", "2", "--json"])  # fmt: skip
    _own(out, people)
    assert out["data"]["rows"] == N_ROWS and out["n_private"] + out["n_public"] + out["n_test"] == N_ROWS
    assert out["n_classes"] == 2 and out["queries_asked"] == 30


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_cloak_measures_your_private_column(people, capsys) -> None:
    out = _run(capsys, ["cloak", "--data", str(people), "--label", "earns", "--private", "sex", "--epochs", "1",
                        "--json"])  # fmt: skip
    _own(out, people)
    assert out["data"]["train_rows"] + out["data"]["test_rows"] == N_ROWS
    assert list(out["attribute_inference"]) == ["sex"]
    assert {row["column"] for row in out["feature_table"]} == {"age", "hours", "job", "sex"}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("method", ["objective", "lp-2st"])
def test_convex_on_your_table(people, capsys, method) -> None:
    out = _run(capsys, ["convex", "--data", str(people), "--label", "earns", "--method", method, "--epsilon", "1",
                        "--json"])  # fmt: skip
    _own(out, people)
    assert out["data"]["train_rows"] + out["data"]["test_rows"] == N_ROWS


def test_convex_label_dp_refuses_other_private_columns(people, capsys) -> None:
    # rr protects the label only: sex would be released unprotected while the user declared it private.
    assert main(["convex", "--data", str(people), "--label", "earns", "--private", "sex", "--method", "rr",
                 "--epsilon", "1"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--private sex" in err and "only the label" in err and err.count("\n") == 1


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_icl_on_your_table(people, capsys) -> None:
    out = _run(capsys, ["icl", "--data", str(people), "--label", "earns", "--learner", "logreg", "--prompts", "10",
                        "--queries", "10", "--epsilon", "3", "--json"])  # fmt: skip
    _own(out, people)
    assert out["data"]["demonstrations"] + out["data"]["query_pool"] == N_ROWS and out["n_classes"] == 2


@pytest.mark.parametrize("command", ["pate", "cloak", "convex", "icl"])
def test_dataset_given_a_file_points_to_data(people, capsys, command) -> None:
    extra = ["--method", "rr"] if command == "convex" else []
    with pytest.raises(SystemExit) as exc:  # argparse: before the command's list of dataset names
        main([command, "--dataset", "people.csv", "--epsilon", "1", *extra])
    assert exc.value.code == 2
    assert "--dataset takes a dataset name; for your own file use --data people.csv --label COL" in (
        capsys.readouterr().err)


def test_train_dataset_given_a_file_points_to_data(people, capsys) -> None:
    assert main(["train", "--dataset", str(people), "--epsilon", "1"]) == 2  # resolve_data, one line
    err = capsys.readouterr().err
    assert err == (f"featuredp train: error: --dataset takes a dataset name; for your own file use --data {people} "
                   "--label COL\n")


@pytest.mark.parametrize("command", ["pate", "cloak", "convex", "icl", "train", "compare"])
@pytest.mark.parametrize("prefix", ["--dat", "--datas"])  # --datas: a prefix of --dataset only
def test_flag_prefix_is_refused(people, capsys, command, prefix) -> None:
    extra = {"convex": ["--method", "rr"], "compare": ["--out", "x"]}.get(command, [])
    with pytest.raises(SystemExit) as exc:
        main([command, prefix, str(people), "--epsilon", "1", *extra])
    assert exc.value.code == 2
    assert f"unrecognized arguments: {prefix}" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["pate", "--teachers", "8", "--queries", "30", "--epsilon", "2"],
    ["icl", "--learner", "logreg", "--prompts", "10", "--queries", "10", "--epsilon", "3"],
    ["convex", "--method", "objective", "--epsilon", "1"],
])  # fmt: skip
def test_record_level_mechanisms_warn_about_statistics_read_from_your_file(people, capsys, command) -> None:
    # PATE, DP-ICL and DP-ERM protect whole records: every column's bounds and categories read from the file escape
    # their guarantee (for FDP only the private columns' do), so they must be declared in a schema or warned about.
    import warnings

    from featuredp.errors import PrivacyLeakWarning

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main([*command, "--data", str(people), "--label", "earns", "--json"]) == 0
    capsys.readouterr()
    leaks = [str(w.message) for w in seen if issubclass(w.category, PrivacyLeakWarning)]
    assert any("protects whole records" in m and "age (bounds)" in m for m in leaks), leaks
