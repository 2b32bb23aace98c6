"""``featuredp cloak``: JSON keys (each documented), the no-guarantee statement, flag errors, Fashion-MNIST absent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from featuredp.cli import main
from featuredp.cli.cloak import NO_GUARANTEE
from featuredp.errors import PrivacyRiskWarning
from featuredp.mechanisms.cloak import GUARANTEE

DOC = Path(__file__).resolve().parents[2] / "docs" / "cloak.md"


@pytest.fixture
def small_adult(monkeypatch):
    """The command on 1,500 training / 1,200 test rows of Adult, so that a run takes seconds."""
    from featuredp.data import load_dataset
    from featuredp.experiments import cloak_runs

    train, test = load_dataset("adult")
    rng = np.random.default_rng(0)
    data = train.subset(rng.choice(train.n, 1500, replace=False)), test.subset(rng.choice(test.n, 1200, replace=False))
    monkeypatch.setattr(cloak_runs, "load_cloak_data", lambda dataset, path=None: data)
    return data


def test_json_has_the_promised_keys_each_documented_and_writes_the_results(small_adult, tmp_path, capsys):
    out = tmp_path / "res"
    with pytest.warns(PrivacyRiskWarning, match="seed=5"):  # the research seed warns
        rc = main(["cloak", "--dataset", "adult", "--lambda", "10", "--lambdas", "1,100", "--epochs", "2", "--json",
                   "--public-seed", "0", "--seed", "5", "--out", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    res = json.loads(captured.out)
    for key in ("suppression_ratio", "accuracy_loss", "kept_features", "lambda", "clean_accuracy", "cloaked_accuracy",
                "attribute_inference", "guarantee", "sweep", "feature_table"):  # fmt: skip
        assert key in res, key
    assert res["guarantee"] == GUARANTEE == "none (empirical suppression only)"
    assert res["lambda"] == 10 and [r["lambda"] for r in res["sweep"]] == [1, 10, 100]
    assert 0 <= res["suppression_ratio"] <= 1 and res["accuracy_loss"] == pytest.approx(
        res["clean_accuracy"] - res["cloaked_accuracy"])
    assert res["kept_features"] and all(isinstance(f, str) for f in res["kept_features"])
    assert set(res["attribute_inference"]) == {"sex", "race"}
    for a in ("sex", "race"):
        ai = res["attribute_inference"][a]
        assert 0 <= ai["attack_accuracy"] <= 1 and 0 <= ai["imputation_baseline"] <= 1
        assert set(ai["variants"]) == {"withheld", "averaged_10"}
    # Every key the command prints is documented in docs/cloak.md (as `key`), nested ones included.
    doc = DOC.read_text(encoding="utf-8")
    keys = set(res) | set(res["attribute_inference"]["sex"]) | set(res["sweep"][0]) | set(res["feature_table"][0])
    per_attribute = ("sex_", "race_")  # documented once as `<attribute>_attack_accuracy` etc.
    missing = sorted(k for k in keys if not re.search(rf"`{re.escape(k)}`", doc) and not k.startswith(per_attribute))
    assert missing == [], f"undocumented --json keys: {missing}"
    assert "`<attribute>_attack_accuracy`" in doc
    # The seed is never written; the results are there.
    written = json.loads((out / "adult.json").read_text())
    assert "seed" not in written and written["seeded"] is True and written["guarantee"] == GUARANTEE
    for name in ("adult_sweep.csv", "adult_curve.png", "adult_features.csv", "adult_features.png", "summary.md"):
        assert (out / name).is_file(), name
    assert "no formal guarantee" in (out / "summary.md").read_text().lower()


def test_text_output_says_there_is_no_guarantee(small_adult, capsys):
    assert main(["cloak", "--dataset", "adult", "--epochs", "1", "--attributes", "sex"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == NO_GUARANTEE
    assert "No formal guarantee" in NO_GUARANTEE and "suppression ratio" in out and "sex from the cloaked query" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dataset", "adult", "--lambda", "-1"], "--lambda must be > 0"),
        (["--dataset", "adult", "--lambdas", "1,x"], "--lambdas must be comma-separated numbers"),
        (["--dataset", "adult", "--lambdas", "1,0"], "--lambdas must be > 0"),
        (["--dataset", "adult", "--epochs", "0"], "--epochs must be > 0"),
        (["--dataset", "adult", "--threshold", "5"], "--threshold must be < --max-noise"),
        (["--dataset", "adult", "--attributes", "age"], "--attributes must be categorical Adult columns"),
        (["--dataset", "fashion-mnist", "--attributes", "sex"], "--attributes applies to --dataset adult only"),
        (["--dataset", "fashion-mnist", "--compare-fdp"], "--compare-fdp applies to --dataset adult only"),
        (["--dataset", "adult", "--fdp-epsilon", "0"], "--fdp-epsilon must be > 0"),
        (["--dataset", "adult", "--seed", "-3"], "--seed must be >= 0"),
        (["--dataset", "adult", "--dataset-path", "."], "--dataset-path applies to --dataset fashion-mnist only"),
    ],
)
def test_bad_flags_are_one_line_errors_before_any_work(flags, message, monkeypatch, capsys):
    from featuredp.experiments import cloak_runs

    def no_work(*args, **kwargs):
        raise AssertionError("data loaded although a flag is bad")

    monkeypatch.setattr(cloak_runs, "load_cloak_data", no_work)
    assert main(["cloak", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_out_naming_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["cloak", "--dataset", "adult", "--out", str(f)]) == 2
    assert "--out must be a folder" in capsys.readouterr().err


def test_fashion_mnist_absent_offline_names_the_fetch_command(tmp_path, monkeypatch, capsys):
    from featuredp.data import images

    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")
    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path))
    monkeypatch.setenv("FEATUREDP_FASHION_MNIST", str(tmp_path / "nowhere"))
    monkeypatch.setattr(images, "FASHION_MNIST_DIRS", (), raising=False)
    assert main(["cloak", "--dataset", "fashion-mnist"]) == 2
    err = capsys.readouterr().err
    assert "featuredp data fetch fashion-mnist" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_adult_json_on_the_full_data(capsys):
    """The command exactly as documented (≈ 30 s on one core)."""
    assert main(["cloak", "--dataset", "adult", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["accuracy_loss"] < 0.02 and 0.3 < res["suppression_ratio"] < 0.9
    assert res["guarantee"] == GUARANTEE and "sex=Male" in res["kept_features"]
