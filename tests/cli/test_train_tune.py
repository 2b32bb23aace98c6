"""``featuredp train --tune private|public``: the CLI contract, and bad combinations refused before any work."""

from __future__ import annotations

import json

import pytest

from featuredp.cli import main

_BASE = ["train", "--dataset", "adult", "--private", "sex,race", "--epsilon", "2", "--epochs", "0.05",
         "--pretrain-epochs", "0", "--model", "logreg", "--no-baselines"]  # fmt: skip


def test_tune_private_reports_the_whole_search_epsilon_and_the_choice(capsys, tmp_path):
    ledger = tmp_path / "budget.json"
    assert main(["ledger", "create", str(ledger), "--total-epsilon", "3", "--delta", "1e-5"]) == 0
    capsys.readouterr()
    assert main([*_BASE, "--method", "fdp", "--tune", "private", "--tune-trials", "1.5", "--ledger", str(ledger),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tuning"]["mode"] == "private" and out["tuning"]["covered_by_epsilon"] is True
    assert 1.9 < out["epsilon"] <= 2.0 and out["epsilon"] == pytest.approx(out["tuning"]["epsilon"])
    assert set(out["tuning"]["chosen"]) == {"lr", "max_grad_norm", "alpha"}
    assert out["ledger"]["spent_epsilon"] == pytest.approx(out["epsilon"], rel=1e-6)
    assert main([*_BASE, "--method", "dpsgd", "--tune", "private", "--tune-trials", "1"]) == 0
    text = capsys.readouterr().out
    assert "tuned             privately: lr=" in text and "the number of trials is secret" in text


def test_tune_public_is_free_and_says_so(capsys):
    assert main([*_BASE, "--method", "fdp_dpsgd", "--tune", "public", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tuning"]["mode"] == "public" and out["tuning"]["epsilon"] == 0.0
    assert out["epsilon"] <= 2.0 and len(out["tuning"]["trials"]) == out["tuning"]["candidates"] == 9


@pytest.mark.parametrize("extra,needle", [
    (["--method", "nonprivate", "--tune", "private"], "--tune needs a private method"),
    (["--method", "dpsgd", "--tune", "public"], "--tune public needs an FDP method"),
    (["--method", "fdp", "--tune", "private", "--seed", "3"], "leave --seed out"),
    (["--method", "fdp", "--tune", "private", "--noise-multiplier", "1"], "--noise-multiplier"),
    (["--method", "fdp", "--tune", "private", "--tune-trials", "0.5"], "--tune-trials"),
])
def test_bad_tuning_flags_are_one_line_errors(capsys, extra, needle):
    assert main([*_BASE, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1]


def test_an_unknown_tuning_mode_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit) as exc:
        main([*_BASE, "--method", "fdp", "--tune", "bayes"])
    assert exc.value.code == 2 and "argument --tune: invalid choice: 'bayes'" in capsys.readouterr().err


def test_fdp_auto_reports_which_method_it_ran(capsys):
    assert main([*_BASE, "--method", "fdp_auto", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "fdp_auto" and out["tuning"]["mode"] == "public" and out["ran"]["choice_epsilon"] == 0.0
    assert out["ran"]["public_weight"] in (0.0, 0.5, 1.0) and out["epsilon"] <= 2.0
    assert main([*_BASE, "--method", "fdp_auto", "--public-weight", "0.5"]) == 2
    assert "--public-weight" in capsys.readouterr().err


def test_tune_public_prints_progress_with_public_quantities_only(capsys):
    """--tune public took 8-10 minutes silently on a user's table: a line per candidate on stderr (i of k, its
    public-view score, the best so far, elapsed, the time left), then the choice; never a loss."""
    assert main([*_BASE, "--method", "fdp_dpsgd", "--tune", "public"]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if "candidate" in ln or ln.startswith("tuning")]
    steps = [ln for ln in lines if ln.strip().startswith("candidate ")]
    assert len(steps) == 9 and steps[0].strip().startswith("candidate 1/9")
    assert all("public-view validation accuracy" in ln and "best so far" in ln and "elapsed" in ln for ln in steps)
    assert all("left for the candidates" in ln for ln in steps[:-1])
    assert any(ln.startswith("tuning: chose") for ln in lines)
    assert "loss" not in err.lower()  # no training loss of any batch (a private batch's would leak)
    assert main([*_BASE, "--method", "fdp_dpsgd", "--tune", "public", "--quiet"]) == 0
    assert "candidate" not in capsys.readouterr().err
