"""``featuredp train`` and ``featuredp demo`` end to end on bundled Adult (short runs)."""

from __future__ import annotations

import json

import pytest

from featuredp.cli import main


def test_train_json_has_the_documented_fields(capsys, tmp_path):
    rc = main(["train", "--dataset", "adult", "--private", "sex,race", "--method", "fdp", "--epsilon", "2",
               "--delta", "1e-5", "--epochs", "0.1", "--pretrain-epochs", "0.1", "--model", "logreg",
               "--out", str(tmp_path / "run"), "--json"])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("method", "accuracy", "epsilon", "delta", "noise_multiplier", "sampling_rate", "steps"):
        assert key in out
    assert out["method"] == "fdp" and out["private_columns"] == ["sex", "race"]
    assert 0 < out["epsilon"] <= 2.0 and out["delta"] == 1e-5 and out["accuracy"] > 0.7
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint.pt", "model.pt", "run.json"]
    from featuredp.runs import load_run

    run = load_run(tmp_path / "run")
    assert run.private_columns == ["sex", "race"] and run.dataset["name"] == "adult"


def test_train_unknown_column_exits_2_with_a_message(capsys):
    rc = main(["train", "--private", "sex,gender", "--epsilon", "1", "--epochs", "0.1", "--json"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown column(s) ['gender']" in err and "available columns" in err and "Traceback" not in err


def test_train_private_method_needs_a_budget(capsys):
    assert main(["train", "--method", "dpsgd", "--epochs", "0.1", "--json"]) == 2
    assert "--epsilon" in capsys.readouterr().err


def test_train_nonprivate_reports_no_epsilon(capsys):
    assert main(["train", "--method", "nonprivate", "--epochs", "0.2", "--model", "logreg", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epsilon"] is None and out["noise_multiplier"] is None


@pytest.mark.slow
def test_demo_full(capsys):
    assert main(["demo", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "nonprivate" in out and "dpsgd" in out and "fdp" in out


def test_demo_short_json(capsys):
    assert main(["demo", "--epochs", "0.1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in out["rows"]] == ["nonprivate", "dpsgd", "fdp"]
    assert all(r["epsilon"] is None or r["epsilon"] <= 1.0 for r in out["rows"])


def test_train_private_label_uses_the_label_dp_split(capsys):
    rc = main(["train", "--private", "income", "--method", "fdp", "--epsilon", "1", "--epochs", "0.2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label_private"] and out["private_columns"] == []
    assert out["max_grad_norm"] == 5.0 and out["alpha"] == 1.0 and out["pretrain_steps"] == 0
    assert "the label 'income'" in out["guarantee"]
