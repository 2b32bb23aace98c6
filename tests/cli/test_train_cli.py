"""``featuredp train`` and ``featuredp demo`` end to end on bundled Adult (short runs)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

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
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model.pt", "run.json"]
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
def test_demo_full(capsys, tmp_path):
    assert main(["demo", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "nonprivate" in out and "dpsgd" in out and "fdp" in out and "Theorem 4 allows at most" in out
    assert (tmp_path / "demo.png").is_file()


def test_demo_short_json(capsys, tmp_path):
    assert main(["demo", "--epochs", "0.1", "--audit-targets", "200", "--out", str(tmp_path / "d"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in out["rows"]] == ["nonprivate", "dpsgd", "fdp", "dpsgd", "fdp"]
    assert [r["target_epsilon"] for r in out["rows"]] == [None, 0.1, 0.1, 1.0, 1.0]
    assert all(r["epsilon"] is None or r["epsilon"] <= r["target_epsilon"] for r in out["rows"])
    assert out["target_epsilons"] == [0.1, 1.0] and out["epsilon"] == 0.1 and out["delta"] == 1e-5
    audit = out["audit"]
    assert audit["attribute"] == "sex" and audit["targets"] == 200
    assert 0 <= audit["baseline"] <= 1 and 0 <= audit["success"] <= 1 and audit["ball"] <= audit["bound"] <= 1
    assert (tmp_path / "d" / "demo.png").read_bytes()[:4] == b"\x89PNG"
    assert "Theorem 4" in (tmp_path / "d" / "results.md").read_text()
    assert json.loads((tmp_path / "d" / "results.json").read_text())["audit"]["attribute"] == "sex"


@pytest.mark.parametrize("argv,needle", [
    (["--epsilon", "0"], "--epsilon must be > 0, got 0"),
    (["--epsilons", "0.1,1e6"], "--epsilons must be <= 1000"),
    (["--audit-attribute", "age"], "--audit-attribute must be one of the --private columns"),
    (["--delta", "2"], "--delta must be in (0, 1)"),
])  # fmt: skip
def test_demo_bad_values_exit_2_before_training(argv, needle, capsys, tmp_path, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("data loaded before the flags were checked")

    monkeypatch.setattr("featuredp.data.load_dataset", no_data)
    assert main(["demo", "--out", str(tmp_path / "d"), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------------------
# Issue 17: --out holding a run, --overwrite, --resume, values checked up front with the flag's name
# ---------------------------------------------------------------------------------------------------------
_TINY = ["train", "--method", "dpsgd", "--epsilon", "2", "--epochs", "0.02", "--model", "logreg", "--json"]


def test_train_refuses_an_out_holding_a_run_and_overwrite_replaces_it_whole(capsys, tmp_path):
    run = tmp_path / "run"
    assert main([*_TINY, "--out", str(run)]) == 0
    (run / "audit").mkdir()
    (run / "audit" / "attribute.json").write_text("{}")  # reports of `featuredp audit` on the old model
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main([*_TINY, "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--overwrite" in err and "--resume" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # nothing touched

    assert main([*_TINY, "--out", str(run), "--overwrite", "--private", "nope"]) == 2  # fails: the old run stays
    capsys.readouterr()
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert (run / "audit" / "attribute.json").exists()

    assert main([*_TINY, "--out", str(run), "--overwrite"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in run.iterdir()) == ["model.pt", "run.json"]  # no stale audit
    assert (run / "model.pt").read_bytes() != before["model.pt"]


@pytest.mark.parametrize("extra,needle", [
    (["--out", "{file}"], "--out must be a folder"),
    (["--out", "{file}/run"], "is a file"),
    (["--out", "{tmp}/none", "--resume"], "--resume: --out"),
    (["--resume"], "--resume needs --out"),
    (["--keep-checkpoint"], "--keep-checkpoint needs --out"),
    (["--out", "{tmp}/r", "--resume", "--overwrite"], "not both"),
    (["--epochs", "1e12"], "--epochs must be <= 10000"),
    (["--epsilon", "1e6"], "--epsilon must be <= 1000"),
    (["--epsilon", "0"], "--epsilon must be > 0"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--max-grad-norm", "-1"], "--max-grad-norm must be > 0"),
])  # fmt: skip
def test_train_bad_flags_exit_2_before_any_data(extra, needle, capsys, tmp_path, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("data loaded before the flags were checked")

    monkeypatch.setattr("featuredp.data.load_dataset", no_data)
    monkeypatch.setattr("featuredp.experiments.train_one.load_dataset", no_data)
    (tmp_path / "file").write_text("x")
    extra = [a.replace("{file}", str(tmp_path / "file")).replace("{tmp}", str(tmp_path)) for a in extra]
    assert main([*_TINY, *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "none").exists()


def test_train_resume_of_a_truncated_checkpoint_is_one_line_naming_it(capsys, tmp_path):
    run = tmp_path / "run"
    assert main([*_TINY, "--out", str(run), "--keep-checkpoint"]) == 0
    checkpoint = Path(json.loads(capsys.readouterr().out)["checkpoint"])
    data = checkpoint.read_bytes()
    for broken in (data[: len(data) // 3], b"hello, not a checkpoint"):
        checkpoint.write_bytes(broken)
        assert main([*_TINY, "--out", str(run), "--resume"]) == 2
        err = capsys.readouterr().err
        assert "checkpoint.pt" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_train_library_errors_name_flags(capsys):
    assert main([*_TINY, "--batch-size", "100000"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size must be <= the number of records" in err and "batch_size" not in err


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
    # the run's entry records its replace-one ε beside ε; the budget is charged in add/remove
    assert ledger.records[-1]["replacement_epsilon"] == pytest.approx(out["replacement_epsilon"], rel=1e-3)


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


# ---------------------------------------------------------------------------------------------------------
# Issue 23: keys and RNG states never sit in the run folder; run.json lists no private category value
# ---------------------------------------------------------------------------------------------------------
_SECRET_KEYS = {"streams", "noise", "private_sampler", "fingerprint", "draws", "ranks"}


def _secret_keys_in_run_folder(folder):
    """What an attacker holding the released run folder finds: every .pt, loaded safely, searched for RNG state."""
    import torch

    found = {}
    for path in folder.rglob("*.pt"):
        obj = torch.load(path, map_location="cpu", weights_only=True)
        keys = set(obj) if isinstance(obj, dict) else set()
        if keys & _SECRET_KEYS:
            found[path.name] = sorted(keys & _SECRET_KEYS)
    return found


@pytest.fixture
def private_root(tmp_path, monkeypatch):
    root = tmp_path / "private-state"
    monkeypatch.setenv("FEATUREDP_PRIVATE_DIR", str(root))
    return root


def test_train_out_holds_no_noise_or_sampler_state_and_the_checkpoint_is_deleted(capsys, tmp_path, private_root):
    run = tmp_path / "run"
    assert main([*_TINY, "--secure-rng", "--out", str(run)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert _secret_keys_in_run_folder(run) == {}  # before: checkpoint.pt with the noise and sampler keys, mode 0644
    checkpoint = Path(out["checkpoint"])
    assert out["checkpoint_kept"] is False and not checkpoint.exists() and not checkpoint.parent.exists()
    assert private_root in checkpoint.parents and run.resolve() not in checkpoint.parents
    assert private_root.stat().st_mode & 0o777 == 0o700
    assert str(checkpoint.parent.name) not in (run / "run.json").read_text()


def test_train_keep_checkpoint_is_owner_only_outside_out_and_resume_finds_it(capsys, tmp_path, private_root):
    run = tmp_path / "run"
    text = ["train", "--method", "dpsgd", "--epsilon", "2", "--epochs", "0.02", "--model", "logreg", "--quiet"]
    assert main([*text, "--out", str(run), "--keep-checkpoint"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("checkpoint"))
    assert line.endswith("(private, kept: --keep-checkpoint)")
    checkpoint = Path(line.split()[1])
    assert checkpoint.is_file() and checkpoint.stat().st_mode & 0o777 == 0o600
    assert checkpoint.parent.stat().st_mode & 0o777 == 0o700 and private_root.stat().st_mode & 0o777 == 0o700
    assert _secret_keys_in_run_folder(run) == {} and not (run / "checkpoint.pt").exists()
    # --resume finds it from --out alone (here: a relative spelling of the same folder)
    import os

    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert main([*_TINY, "--out", "./run/../run", "--resume"]) == 0
    finally:
        os.chdir(cwd)
    out = json.loads(capsys.readouterr().out)
    assert Path(out["checkpoint"]) == checkpoint and not checkpoint.exists()  # deleted at the end of this run


def test_train_resume_without_a_checkpoint_names_resume_and_the_expected_path(capsys, tmp_path, private_root):
    from featuredp.experiments.runs import private_checkpoint

    run = tmp_path / "run"
    assert main([*_TINY, "--out", str(run)]) == 0  # finished: its checkpoint is gone
    capsys.readouterr()
    assert main([*_TINY, "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--resume" in err and str(private_checkpoint(run)) in err
    assert "moved" in err  # a moved run directory cannot be resumed: the message says so


def test_train_interrupted_run_keeps_its_private_checkpoint_and_out_is_refused_without_resume(
        capsys, tmp_path, private_root, monkeypatch):  # fmt: skip
    import featuredp.experiments.train_one as train_one_module
    from featuredp.experiments.runs import private_checkpoint, save_run

    run = tmp_path / "run"

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_one_module, "save_run", crash)
    assert main([*_TINY, "--out", str(run)]) != 0  # Ctrl-C after training, before run.json is written
    monkeypatch.setattr(train_one_module, "save_run", save_run)
    assert private_checkpoint(run).is_file() and not (run / "checkpoint.pt").exists()
    capsys.readouterr()
    assert main([*_TINY, "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and str(private_checkpoint(run)) in err
    assert main([*_TINY, "--out", str(run), "--resume"]) == 0
    assert not private_checkpoint(run).exists() and (run / "model.pt").is_file()


def test_train_overwrite_removes_the_old_runs_private_checkpoint(capsys, tmp_path, private_root):
    from featuredp.experiments.runs import private_checkpoint

    run = tmp_path / "run"
    assert main([*_TINY, "--out", str(run), "--keep-checkpoint"]) == 0
    old = private_checkpoint(run).read_bytes()
    assert main([*_TINY, "--out", str(run), "--overwrite", "--private", "nope"]) == 2  # fails: the old run stays
    assert private_checkpoint(run).read_bytes() == old
    assert main([*_TINY, "--out", str(run), "--overwrite"]) == 0
    assert not private_checkpoint(run).exists()
    assert [p.name for p in private_root.iterdir()] == []  # nothing of the old run set aside either


def test_train_resume_refuses_a_legacy_checkpoint_unless_accepted_then_moves_it(capsys, tmp_path, private_root):
    import shutil

    from featuredp.errors import PrivacyRiskWarning
    from featuredp.experiments.runs import private_checkpoint

    run = tmp_path / "run"
    assert main([*_TINY, "--out", str(run), "--keep-checkpoint"]) == 0
    shutil.move(str(private_checkpoint(run)), str(run / "checkpoint.pt"))  # where featuredp used to write it
    capsys.readouterr()
    # the run folder is shareable: whoever read that file holds its noise keys. Refused, one line, the file named
    assert main([*_TINY, "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(run / "checkpoint.pt") in err and "--accept-legacy-checkpoint" in err
    assert (run / "checkpoint.pt").exists() and not private_checkpoint(run).exists()  # nothing moved or trained
    assert main([*_TINY, "--out", str(run), "--accept-legacy-checkpoint"]) == 2  # the flag needs --resume
    assert "--accept-legacy-checkpoint is for --resume" in capsys.readouterr().err
    with pytest.warns(PrivacyRiskWarning, match="moved the checkpoint"):
        assert main([*_TINY, "--out", str(run), "--resume", "--accept-legacy-checkpoint", "--keep-checkpoint"]) == 0
    assert not (run / "checkpoint.pt").exists() and private_checkpoint(run).stat().st_mode & 0o777 == 0o600


def _csv_with_one_rare_diagnosis(path):
    import numpy as np

    rng = np.random.default_rng(0)
    n = 300
    age = rng.integers(17, 91, n)
    diag = rng.choice(np.array(["flu", "cold", "none"], dtype=object), n)
    diag[7] = "HIV-positive"  # held by one record
    y = np.where(0.04 * (age - 40) + rng.normal(0, 1, n) > 0, "yes", "no")
    lines = ["age,city,diag,y"] + [f"{a},{'AB'[i % 2]},{d},{t}" for i, (a, d, t) in enumerate(zip(age, diag, y))]
    path.write_text("\n".join(lines) + "\n")


def test_train_run_folder_and_output_never_list_a_private_category_read_from_the_data(capsys, tmp_path,
                                                                                      private_root):
    from featuredp.errors import PrivacyLeakWarning
    from featuredp.experiments.runs import load_run

    data = tmp_path / "people.csv"
    _csv_with_one_rare_diagnosis(data)
    run = tmp_path / "run"
    base = ["train", "--data", str(data), "--label", "y", "--private", "diag", "--method", "fdp", "--epsilon", "2",
            "--epochs", "1", "--batch-size", "32", "--public-batch-size", "32", "--model", "logreg"]
    with pytest.warns(PrivacyLeakWarning, match="diag"):  # the categories were read from the data (warned)
        assert main([*base, "--out", str(run), "--json"]) == 0
    printed = capsys.readouterr().out
    with pytest.warns(PrivacyLeakWarning):
        assert main([*base, "--quiet"]) == 0
    printed += capsys.readouterr().out
    assert "HIV" not in printed
    for path in run.rglob("*"):  # before: run.json listed "diag=HIV-positive" among the private encoded columns
        assert b"HIV" not in path.read_bytes(), path
    info = json.loads((run / "run.json").read_text())
    described = info["result"]["privacy_report"]["feature_map"]
    assert described["private_encoded_columns"] == [f"diag=<category {i} of 4>" for i in (1, 2, 3, 4)]
    assert described["private_categories"] == {"diag": "4 read from the data (not listed: private)"}
    assert load_run(run).model is not None  # the model is still rebuilt from run.json


# ---------------------------------------------------------------------------------------------------------
# `train --ledger` reports where the ledger stands after the run (issue 24)
# ---------------------------------------------------------------------------------------------------------
def test_train_ledger_prints_spent_and_left(capsys, tmp_path):
    from featuredp.accounting import BudgetLedger

    path = tmp_path / "budget.json"
    assert main(["ledger", "create", str(path), "--total-epsilon", "5", "--delta", "1e-5"]) == 0
    BudgetLedger(path).spend("an earlier count", epsilon=0.5)
    capsys.readouterr()
    assert main([*_SHORT, "--ledger", str(path)]) == 0
    book = json.loads(capsys.readouterr().out)["ledger"]
    ledger = BudgetLedger(path)
    assert book["path"] == str(path) and book["total_epsilon"] == 5.0 and book["delta"] == 1e-5
    # the earlier spend and this run together, as the ledger itself counts them
    assert book["spent_epsilon"] == pytest.approx(ledger.spent()) and book["spent_epsilon"] > 0.5
    assert book["left_epsilon"] == pytest.approx(ledger.remaining()) and book["left_epsilon"] < 4.5
    assert main([s for s in _SHORT if s != "--json"] + ["--quiet", "--ledger", str(path)]) == 0
    text = capsys.readouterr().out
    spent, left = BudgetLedger(path).spent(), BudgetLedger(path).remaining()
    assert f"ledger            {path}: epsilon spent {spent:.4g}, left {left:.4g} of 5" in text


def test_train_without_ledger_has_no_ledger_key(capsys):
    assert main(_SHORT) == 0
    assert "ledger" not in json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------------------------------------------------
# featuredp train --noise blt (BandMF's own CLI tests are in tests/test_engine_bandmf.py)
# ---------------------------------------------------------------------------------------------------------
# Adult at m = 8192: epochs of ⌊32561/8192⌋ = 3 steps, so one epoch's 4 steps put a record in 2 of them
_BLT = ["train", "--method", "fdp", "--epsilon", "4", "--epochs", "1", "--batch-size", "8192", "--pretrain-epochs", "0",
        "--model", "logreg", "--no-baselines", "--quiet", "--noise", "blt"]  # fmt: skip


def test_train_blt_end_to_end_plans_accounts_and_prints_blt(capsys, tmp_path):
    run = tmp_path / "run"
    assert main([*_BLT, "--out", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    block = out["correlated_noise"]
    assert out["noise"] == "blt" and out["bands"] is None and 0 < out["epsilon"] <= 4.0
    assert block["noise"] == "blt" and block["min_separation"] == 3 and block["participations"] == 2
    assert 1 <= block["buffers"] <= 4 and block["sensitivity"] > 1  # two participations: more than one step's norm
    assert "noise blt" in out["guarantee"] and "no amplification" in out["guarantee"]
    info = json.loads((run / "run.json").read_text())
    assert info["config"]["noise"] == "blt" and info["config"]["bands"] is None
    assert info["plan"]["noise"]["kind"] == "blt" and info["plan"]["noise"].get("bands") is None
    assert info["plan"]["noise"]["coeffs"] == [*block["buf_decay"], *block["output_scale"]]
    assert info["result"]["privacy_report"]["correlated_noise"] == block

    assert main(_BLT) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("noise "))
    assert line.startswith("noise             blt, ") and " buffer" in line and "epochs of 3 steps" in line
    assert "cyclic sampling over 3 partitions (each record in at most 2 steps)" in line
    assert "one Gaussian at sensitivity" in line and line.endswith("(no amplification)")
    assert "noise multiplier" not in line and "bands" not in line


@pytest.mark.parametrize("kind", ["bandmf", "blt"])
@pytest.mark.parametrize("tune", ["private", "public"])
def test_train_tunes_with_correlated_noise_and_the_run_is_that_noise(kind, tune, capsys):
    argv = [*_BLT[:-1], kind, "--tune", tune, "--tune-trials", "2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["noise"] == kind and out["correlated_noise"]["noise"] == kind and out["tuning"]["mode"] == tune
    assert 0 < out["epsilon"] <= 4.0


def _no_data(monkeypatch) -> None:
    def no_data(*args, **kwargs):
        raise AssertionError("data loaded before the flags were checked")

    # the module itself: ``featuredp.experiments.train_one`` as an attribute is the function once the package has
    # re-exported it
    monkeypatch.setattr(importlib.import_module("featuredp.experiments.train_one"), "load_dataset", no_data)
    monkeypatch.setattr("featuredp.data.load_dataset", no_data)


@pytest.mark.parametrize("kind", ["bandmf", "blt"])
@pytest.mark.parametrize(("extra", "needle"), [
    (["--method", "nonprivate"], "--noise {kind} is for the private methods dpsgd, fdp_dpsgd, fdp, got --method "
                                 "nonprivate"),
    (["--method", "public"], "--noise {kind} is for the private methods"),
])  # fmt: skip
def test_train_correlated_noise_refusals_exit_2_before_any_data(kind, extra, needle, capsys, monkeypatch):
    _no_data(monkeypatch)
    argv = [*_BLT[:-1], kind, *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle.format(kind=kind) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("noise", ["blt", "independent"])
def test_train_bands_without_bandmf_is_refused(noise, capsys, monkeypatch):
    # BLT chooses its own strategy: a --bands given with it would be silently unused, so it is refused up front
    _no_data(monkeypatch)
    assert main([*_BLT[:-1], noise, "--bands", "4"]) == 2
    err = capsys.readouterr().err
    assert f"--bands is for --noise bandmf, got --bands 4 with --noise {noise}" in err
    assert len(err.strip().splitlines()) == 1
