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
    from featuredp.experiments.runs import load_run

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


# ---------------------------------------------------------------------------------------------------------
# Secret randomness and the ledger from the command line (issue 12)
# ---------------------------------------------------------------------------------------------------------
_SHORT = ["train", "--method", "dpsgd", "--epsilon", "2", "--epochs", "0.05", "--model", "logreg", "--json"]


def test_train_default_writes_no_seed_and_two_runs_differ(capsys, tmp_path):
    models = []
    for name in ("a", "b"):
        assert main([*_SHORT, "--public-seed", "3", "--out", str(tmp_path / name)]) == 0
        out = json.loads(capsys.readouterr().out)
        assert "seed" not in out and out["seeded"] is False and out["public_seed"] == 3
        info = json.loads((tmp_path / name / "run.json").read_text())
        assert "seed" not in info["config"] and info["config"]["seeded"] is False
        models.append((tmp_path / name / "model.pt").read_bytes())
    assert models[0] != models[1]  # same public seed, fresh secret noise


def test_train_seed_warns_and_is_not_written(capsys, tmp_path):
    assert main([*_SHORT, "--seed", "987654", "--out", str(tmp_path / "r")]) == 0
    cap = capsys.readouterr()
    assert "987654" not in cap.out and "987654" not in (tmp_path / "r" / "run.json").read_text()
    assert json.loads(cap.out)["seeded"] is True


def test_train_secure_rng(capsys):
    assert main([*_SHORT, "--secure-rng"]) == 0
    assert json.loads(capsys.readouterr().out)["secure_rng"] is True


def test_train_ledger_overspend_exits_2_before_training(capsys, tmp_path):
    from featuredp.accounting import BudgetLedger

    path = tmp_path / "budget.json"
    BudgetLedger(path, total_epsilon=1.0, delta=1e-5)
    before = path.read_bytes()
    rc = main([*_SHORT, "--ledger", str(path), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "budget" in err and "Traceback" not in err
    assert path.read_bytes() == before and not (tmp_path / "r" / "model.pt").exists()


def test_train_ledger_records_the_run(capsys, tmp_path):
    from featuredp.accounting import BudgetLedger

    path = tmp_path / "budget.json"
    ledger = BudgetLedger(path, total_epsilon=5.0, delta=1e-5)
    assert main([*_SHORT, "--ledger", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert ledger.spent() == pytest.approx(out["epsilon"], rel=1e-6)
    assert not ledger.pending()


# ---------------------------------------------------------------------------------------------------------
# --device: an absent device is refused up front with one line (exit 2), before any data is loaded
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["train", "--method", "dpsgd", "--epsilon", "1", "--epochs", "0.1", "--json"],
    ["demo", "--epochs", "0.1", "--json"],
    ["compare", "--quick", "--out", "{tmp}"],
    ["compare", "--task", "diffusion", "--quick", "--out", "{tmp}"],
    ["benchmark", "--rounds", "1", "--json"],
])  # fmt: skip
def test_device_cuda_without_a_gpu_exits_2_naming_cuda(argv, capsys, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")

    def no_data(*args, **kwargs):
        raise AssertionError("data loaded before the device was checked")

    monkeypatch.setattr("featuredp.data.load_dataset", no_data)
    argv = [a.replace("{tmp}", str(tmp_path / "out")) for a in argv]
    assert main([*argv, "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "CUDA" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
