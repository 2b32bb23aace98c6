"""`featuredp audit` end to end on small Adult runs: JSON keys, report files, error handling."""

from __future__ import annotations

import json

import pytest

from featuredp.cli import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from featuredp.experiments.train_one import train_tabular

    root = tmp_path_factory.mktemp("audit_runs")
    train_tabular(method="nonprivate", out=root / "np", progress=False, epochs=0.3)
    train_tabular(method="fdp", out=root / "fdp", progress=False, noise_multiplier=1.0, epochs=0.1,
                  pretrain_epochs=0.1)  # fmt: skip
    return root


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_attribute_json_and_reports(runs, capsys):
    out = _json(capsys, ["audit", str(runs / "fdp"), "--attack", "attribute", "--attribute", "sex", "--json",
                         "--targets", "300"])  # fmt: skip
    assert out["attack"] == "attribute" and out["attribute"] == "sex"
    assert out["epsilon_claimed"] > 0 and out["theorem4_applies"]
    assert out["ball"] <= out["bound"] <= 1.0
    assert {"advantage", "accuracy", "verdict"} <= set(out)
    for f in ("attribute_sex.md", "attribute_sex.png", "attribute.json"):
        assert (runs / "fdp" / "audit" / f).stat().st_size > 0


def test_membership_json_and_roc(runs, capsys):
    out = _json(capsys, ["audit", str(runs / "np"), "--attack", "membership", "--json", "--targets", "300"])
    assert out["attack"] == "membership" and 0 <= out["auc"] <= 1
    assert set(out["tpr_at_fpr"]) == {"0.1", "0.01", "0.001"}
    assert out["epsilon_claimed"] is None and "not private" in out["verdict"]
    assert (runs / "np" / "audit" / "membership_roc.png").stat().st_size > 0


def test_canary_feature_json(runs, capsys):
    out = _json(capsys, ["audit", str(runs / "fdp"), "--attack", "canary", "--canaries", "60", "--train-size", "400",
                         "--steps", "5", "--json"])  # fmt: skip
    assert out["attack"] == "canary" and out["kind"] == "feature"
    assert 0 <= out["epsilon_lower_bound"] <= out["ceiling"]
    assert out["epsilon_claimed"] > 0 and "cannot certify more than" in out["verdict"]
    assert (runs / "fdp" / "audit" / "canary_feature.md").exists()


def test_canary_gradient_json(runs, capsys):
    out = _json(capsys, ["audit", str(runs / "fdp"), "--attack", "canary", "--canary-kind", "gradient", "--json"])
    assert out["kind"] == "gradient" and out["epsilon_lower_bound"] <= out["epsilon_claimed"]


def test_errors_exit_2_with_named_parameter(runs, tmp_path, capsys):
    assert main(["audit", str(runs / "fdp"), "--attribute", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["audit", str(tmp_path), "--attack", "membership"]) == 2
    assert "run.json" in capsys.readouterr().err
    assert main(["audit", str(runs / "fdp"), "--targets", "3"]) == 2
    assert "--targets" in capsys.readouterr().err


def test_membership_with_shadows(runs, capsys):
    out = _json(capsys, ["audit", str(runs / "np"), "--attack", "membership", "--json", "--targets", "100",
                         "--shadows", "2", "--train-size", "400", "--steps", "5",
                         "--out", str(runs / "np_sh")])  # fmt: skip
    assert {"loss threshold", "LiRA online", "LiRA offline", "Shokri shadow"} <= set(out["metrics"])
    assert out["shadows"] == 2


def test_canary_multi_run_design(runs, capsys):
    out = _json(capsys, ["audit", str(runs / "fdp"), "--attack", "canary", "--canaries", "1", "--runs", "6",
                         "--train-size", "200", "--steps", "2", "--json", "--quiet"])  # fmt: skip
    assert out["runs"] == 6 and "multi_run" in out
    assert out["multi_run"]["ceiling"] < 2.0  # 6 trials cannot certify much: the ceiling says so


# ---------------------------------------------------------------------------------------------------------
# Issue 17: more targets than the data holds is refused (not clamped); broken runs are one line
# ---------------------------------------------------------------------------------------------------------
def test_more_targets_than_the_data_holds_is_refused(runs, capsys):
    assert main(["audit", str(runs / "fdp"), "--attribute", "sex", "--targets", "1e7"]) == 2
    err = capsys.readouterr().err
    assert "--targets must be <= 8,141" in err and "half of the 16,281-row test split" in err
    assert main(["audit", str(runs / "np"), "--attack", "membership", "--targets", "20000"]) == 2
    assert "--targets must be <= 16,281" in capsys.readouterr().err


def test_broken_run_files_are_one_line_naming_the_file(runs, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(runs / "np", broken)
    data = (broken / "model.pt").read_bytes()
    (broken / "model.pt").write_bytes(data[: len(data) // 2])
    assert main(["audit", str(broken), "--attack", "membership"]) == 2
    err = capsys.readouterr().err
    assert "model.pt" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    (broken / "run.json").write_text('{"method": "nonprivate", ')
    assert main(["audit", str(broken), "--attack", "membership"]) == 2
    err = capsys.readouterr().err
    assert "run.json" in err and "not valid JSON" in err and len(err.strip().splitlines()) == 1


def test_audit_out_naming_a_file_is_refused(runs, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["audit", str(runs / "np"), "--attack", "membership", "--out", str(tmp_path / "f")]) == 2
    assert "--out must be a folder" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# Issue 24: stdout names the attribute, the success, the baseline's interval, the bound and the verdict;
# an audit too small to bound anything says "inconclusive" and why instead of printing a bound as a result
# ---------------------------------------------------------------------------------------------------------
def test_attribute_stdout_names_success_baseline_interval_bound_and_verdict(runs, tmp_path, capsys):
    assert main(["audit", str(runs / "fdp"), "--attribute", "sex", "--targets", "300", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "attribute.json").read_text())
    assert "[attribute] sex: success of the best attack" in out and f"{100 * res['accuracy']:.1f}%" in out
    assert (f"baseline without the model ({res['baseline_imputer']}, 5-fold cross-fitted on "
            f"{res['imputer_rows']:,} rows): {100 * res['baseline_accuracy']:.1f}%, 95% interval "
            f"[{100 * res['baseline_lcl']:.1f}%, {100 * res['baseline_ucl']:.1f}%]") in out  # fmt: skip
    assert f"Theorem 4 bound from the baseline's upper limit: {res['bound']:.3f}" in out
    assert res["bound_verdict"] in ("within", "exceeds", "inconclusive") and f"verdict: {res['bound_verdict']}" in out
    assert res["ball"] == res["baseline_ucl"] and res["baseline_lcl"] <= res["baseline_accuracy"] <= res["ball"]


def test_attribute_audit_with_30_targets_is_inconclusive(runs, tmp_path, capsys):
    assert main(["audit", str(runs / "fdp"), "--attribute", "sex", "--targets", "30", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "verdict: inconclusive: 30 targets per group (fewer than 100)" in out
    assert "within Theorem 4's bound" not in out and "INCONCLUSIVE" in out
    res = json.loads((tmp_path / "attribute.json").read_text())
    assert res["bound_verdict"] == "inconclusive" and res["groups"]["members"]["within_bound"] is None


# ---------------------------------------------------------------------------------------------------------
# Issue 42: attribute inference attacks the run's private columns only. A public column was released with the
# model (Ψ(x) holds it): "inferring" it measures nothing, yet the audit used to run and write a report for it.
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("given", ["age", "sex,age", "education"])
def test_a_public_attribute_is_refused_naming_the_flag_and_the_private_columns(runs, tmp_path, capsys, given):
    assert main(["audit", str(runs / "fdp"), "--attribute", given, "--targets", "100", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    public = next(c for c in given.split(",") if c != "sex")
    assert len(err.splitlines()) == 1 and "--attribute" in err and repr(public) in err
    assert "(sex, race)" in err  # what can be attacked
    assert not list(tmp_path.iterdir())  # refused before any attack or report


def test_attribute_with_another_attack_is_refused(runs, capsys):
    assert main(["audit", str(runs / "np"), "--attack", "membership", "--attribute", "sex"]) == 2
    assert "--attribute is for --attack attribute" in capsys.readouterr().err
