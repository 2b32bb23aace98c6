"""``featuredp train --json`` says how it ran: device, precision and the number of processes."""

from __future__ import annotations

import json

import pytest
import torch

from _launch import run_torchrun
from featuredp.cli import main


def test_train_json_states_device_precision_and_processes(capsys):
    args = ["train", "--dataset", "adult", "--private", "sex", "--method", "fdp", "--epsilon", "2", "--epochs", "0.05",
            "--pretrain-epochs", "0", "--model", "logreg", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["device"], out["precision"], out["world_size"]) == ("cpu", "fp32", 1)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_train_json_under_torchrun_says_two_processes(tmp_path, sharding):
    done = run_torchrun("-m", "featuredp", "train", "--dataset", "adult", "--private", "sex", "--method", "dpsgd",
                        "--epsilon", "2", "--epochs", "0.05", "--sharding", sharding, "--out", str(tmp_path / "run"),
                        "--no-baselines", "--json", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    outs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(outs) == 1 and outs[0]["world_size"] == 2  # rank 0 prints, and says two processes ran
    assert outs[0]["sharding"] == sharding and outs[0]["epsilon"] <= 2.0
    config = json.loads((tmp_path / "run" / "run.json").read_text())["config"]
    assert config["sharding"] == sharding and config["world_size"] == 2
    weights = torch.load(tmp_path / "run" / "model.pt", weights_only=True)  # whole tensors, whatever the sharding
    assert all(type(v) is torch.Tensor for v in weights.values()) and weights["net.0.weight"].shape[1] > 100


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_train_text_under_torchrun_shards_the_language_model(tmp_path):
    # The text preset clips with vmap, which cannot run through FSDP's hooks: sharded, the run uses ghost (the same
    # clipped sums) and says so; the model.pt it saves holds whole tensors.
    done = run_torchrun("-m", "featuredp", "train", "--task", "text", "--method", "fdp", "--epsilon", "3", "--epochs",
                        "0.3", "--text-train-size", "40", "--max-len", "96", "--sharding", "fsdp", "--out",
                        str(tmp_path / "run"), "--json", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    outs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(outs) == 1 and (outs[0]["world_size"], outs[0]["sharding"]) == (2, "fsdp")
    assert outs[0]["strategy"] == "ghost" and outs[0]["epsilon"] <= 3.0 and outs[0]["perplexity"] > 1
    config = json.loads((tmp_path / "run" / "run.json").read_text())["config"]
    assert config["sharding"] == "fsdp" and config["world_size"] == 2
    weights = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert all(type(v) is torch.Tensor for v in weights.values())


def test_an_interrupt_says_how_to_resume(capsys, monkeypatch, tmp_path):
    import featuredp.cli.train as train_cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_cli, "_train", interrupted)
    assert main(["train", "--epsilon", "1", "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "--resume" in err and str(tmp_path / "run") in err


def test_train_reports_the_majority_and_public_only_references_and_the_training_loss(capsys):
    args = ["train", "--dataset", "adult", "--private", "sex,race", "--method", "fdp", "--epsilon", "2", "--epochs",
            "0.05", "--pretrain-epochs", "0", "--model", "logreg"]  # fmt: skip
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    refs = out["baselines"]
    assert 0.7 < refs["majority"] < 0.8  # Adult's test set: about 76% earn <= 50K
    assert 0.7 < refs["public_only"] <= 1.0
    assert out["train_loss"]["kind"] == "public_loss" and out["train_loss"]["value"] > 0
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "references        majority class 0.76" in text and "public only" in text and "training loss" in text
    assert main([*args, "--no-baselines", "--json"]) == 0
    assert "baselines" not in json.loads(capsys.readouterr().out)


def test_train_states_the_replacement_epsilon_in_json_run_json_and_text(capsys, tmp_path):
    """Both questions, both numbers: add/remove ε (the model vs one trained on Ψ of a record) and replace-one ε
    (telling two values of one record's private part apart), in --json, run.json and the printed summary."""
    base = ["train", "--dataset", "adult", "--private", "sex", "--method", "fdp", "--epsilon", "2", "--epochs", "0.05",
            "--pretrain-epochs", "0", "--model", "logreg", "--no-baselines"]  # fmt: skip
    assert main([*base, "--json", "--out", str(tmp_path / "run")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["relation"] == "add-remove" and 0 < out["epsilon"] <= 2.0
    assert out["replacement_epsilon"] > out["epsilon"]
    result = json.loads((tmp_path / "run" / "run.json").read_text())["result"]
    assert result["replacement_epsilon"] == pytest.approx(out["replacement_epsilon"])
    assert "add/remove: the model is indistinguishable from one trained on only the public view" in out["guarantee"]
    assert f"telling two values of one record's private part apart: ε = {out['replacement_epsilon']:.4g}" in (
        out["guarantee"])
    assert main(base) == 0
    text = capsys.readouterr().out
    assert "question        add/remove" in text and "replacement eps   " in text and "(replace-one: telling" in text


def test_relation_replace_one_calibrates_for_the_replacement_question(capsys):
    """--relation replace-one: the ε printed is the replace-one one, and it is within --epsilon."""
    args = ["train", "--dataset", "adult", "--private", "sex", "--method", "fdp", "--epsilon", "2", "--epochs", "0.05",
            "--pretrain-epochs", "0", "--model", "logreg", "--no-baselines", "--relation", "replace-one", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["relation"] == "replace-one" and out["replacement_epsilon"] == out["epsilon"] <= 2.0 + 1e-9
    assert "ε = " in out["guarantee"] and "(replace-one: telling two values" in out["guarantee"]


def test_dpsgd_states_the_pair_for_whole_records(capsys):
    args = ["train", "--dataset", "adult", "--method", "dpsgd", "--epsilon", "2", "--epochs", "0.05", "--model",
            "logreg", "--no-baselines", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["replacement_epsilon"] > out["epsilon"]
    assert "telling two values of one record apart: ε = " in out["guarantee"]
    assert "trained without any one record" in out["guarantee"]


def test_dpsgd_shows_no_private_loss(capsys):
    args = ["train", "--dataset", "adult", "--method", "dpsgd", "--epsilon", "2", "--epochs", "0.05", "--model",
            "logreg", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["baselines"]["majority"] > 0.7 and out["baselines"]["public_only"] > 0.7  # Adult's sex, race declared
    assert out["train_loss"] is None  # the private batches' loss is private: never shown


def test_a_users_file_is_named_by_its_file_name(capsys, tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    rows = ["age,sex,y"] + [f"{a:.1f},{'FM'[i % 2]},{'yn'[int(a > 40)]}" for i, a in enumerate(rng.normal(40, 9, 300))]
    path = tmp_path / "people_2026.csv"
    path.write_text("\n".join(rows) + "\n")
    args = ["train", "--data", str(path), "--label", "y", "--private", "sex", "--method", "fdp", "--epsilon", "2",
            "--epochs", "0.5", "--batch-size", "32", "--public-batch-size", "32", "--model", "logreg", "--no-baselines",
            "--json"]  # fmt: skip
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["dataset"] == "people_2026"


def test_a_small_table_trains_with_defaults_fitted_to_its_size(capsys, tmp_path):
    # Before: the Adult preset's batches (512, public 256) refused a table of a few hundred rows, and gave one of a
    # few thousand a few dozen private steps. Now a table without a preset gets batches of ~n/32 and ~600 steps.
    import numpy as np

    rng = np.random.default_rng(1)
    age, hours = rng.normal(40, 9, 300), rng.normal(40, 8, 300)
    sex = rng.choice(["F", "M"], 300)
    y = np.where(0.1 * (age - 40) + 0.1 * (hours - 40) + rng.normal(0, 1, 300) > 0, "yes", "no")
    rows = ["age,hours,sex,y"] + [f"{a:.1f},{h:.1f},{s},{t}" for a, h, s, t in zip(age, hours, sex, y)]
    path = tmp_path / "small.csv"
    path.write_text("\n".join(rows) + "\n")
    args = ["train", "--data", str(path), "--label", "y", "--private", "sex", "--method", "fdp", "--epsilon", "2",
            "--model", "logreg", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["batch_size"] == 32 and 500 <= out["steps"] <= 700
    assert out["accuracy"] >= out["baselines"]["majority"]


def test_bundled_datasets_keep_their_presets(monkeypatch):
    import featuredp.experiments.train_one as t1
    from featuredp.experiments.presets import PRESETS

    seen: dict = {}
    real = t1.Trainer

    class Spy(real):  # type: ignore[misc,valid-type]
        def __init__(self, *a, **k):
            seen.update(k)
            super().__init__(*a, **k)

    monkeypatch.setattr(t1, "Trainer", Spy)
    t1.train_one(method="fdp", dataset="adult", epsilon=2.0, epochs=0.02, pretrain_epochs=0, model="logreg",
                 progress=False)  # fmt: skip
    assert "adult" in PRESETS
    assert seen["batch_size"] == 512 and seen["public_batch_size"] == 256  # Adult's tuned preset, not the rule
