"""``featuredp train --json`` says how it ran: device, precision and the number of processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from featuredp.cli import main


def test_train_json_states_device_precision_and_processes(capsys):
    args = ["train", "--dataset", "adult", "--private", "sex", "--method", "fdp", "--epsilon", "2", "--epochs", "0.05",
            "--pretrain-epochs", "0", "--model", "logreg", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["device"], out["precision"], out["world_size"]) == ("cpu", "fp32", 1)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_train_json_under_torchrun_says_two_processes(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={port}", "-m", "featuredp", "train", "--dataset", "adult", "--private", "sex", "--method",
           "dpsgd", "--epsilon", "2", "--epochs", "0.05", "--model", "logreg", "--json"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    outs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(outs) == 1 and outs[0]["world_size"] == 2  # rank 0 prints, and says two processes ran


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
