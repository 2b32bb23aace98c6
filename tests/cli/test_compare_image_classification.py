"""`featuredp compare --task image-classification`: a real quick grid on a tiny IDX fixture, offline; flag errors."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import featuredp.data.images as images
from featuredp.cli import main
from featuredp.methods import METHOD_NAMES


def _write_idx(path: Path, arr: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    path.write_bytes(gzip.compress(header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()))


@pytest.fixture
def tiny_fashion(tmp_path: Path, monkeypatch) -> Path:
    """Fake Fashion-MNIST IDX files in a fresh cache (the loader finds them there; nothing is downloaded)."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "cache" / "fashion-mnist"
    folder.mkdir(parents=True)
    for prefix, n in (("train", 600), ("t10k", 300)):
        y = np.arange(n) % 10
        # a class-dependent bright band (coarse: it survives the blur) plus noise
        x = rng.normal(30, 20, (n, 28, 28))
        for i, c in enumerate(y):
            x[i, 2 * c : 2 * c + 6] += 150
        _write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", np.clip(x, 0, 255))
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", y)
    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")  # a test never downloads
    monkeypatch.delenv("FEATUREDP_FASHION_MNIST", raising=False)
    monkeypatch.setattr(images, "FASHION_MNIST_DIRS", ())
    return folder


def test_quick_grid_runs_offline_in_ci_time(tiny_fashion: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    t0 = time.process_time()
    assert main(["compare", "--task", "image-classification", "--quick", "--out", str(out), "--quiet"]) == 0
    assert time.process_time() - t0 < 40  # CI budget: one core
    df = pd.read_csv(out / "results.csv")
    assert set(df["method"]) == set(METHOD_NAMES) and len(df) == 2 + 3 * 2  # references once, ε ∈ {2, 8}
    assert (df["dataset"] == "fashion-mnist").all() and df["accuracy"].between(0, 1).all()
    assert (df.loc[df["method"] == "nonprivate", "accuracy"] > 0.5).all()  # the fixture is learnable
    md = (out / "summary.md").read_text()
    assert "quick mode" in md and "Gaussian blur (σ=1 px)" in md and "Train/test rows: 512 / 256" in md
    assert (out / "privacy_utility.png").is_file()
    printed = capsys.readouterr().out
    assert "FDP (Alg. 1)" in printed and "wrote" in printed


def test_pixelate_and_json(tiny_fashion: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "pix"
    assert main(["compare", "--task", "image-classification", "--quick", "--feature-map", "pixelate",
                 "--pixelate-factor", "7", "--methods", "public,fdp", "--epsilon", "4", "--train-size", "200",
                 "--out", str(out), "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert result["meta"]["private"] == ["the image detail within each 7×7 pixel block (all but the block means)"]
    assert result["meta"]["train_rows"] == 200
    assert [s["method"] for s in result["summary"]] == ["public", "fdp"]


def test_tune_gives_every_private_method_the_same_budget(tiny_fashion: Path, tmp_path: Path, capsys) -> None:
    """--tune on images: each private method gets the same number of candidates per ε, scored on the validation
    split of the training images, and the summary says the methods were tuned alike."""
    out = tmp_path / "tuned"
    assert main(["compare", "--task", "image-classification", "--quick", "--tune", "--methods", "dpsgd,fdp_dpsgd,fdp",
                 "--epsilon", "4", "--train-size", "200", "--out", str(out), "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert result["meta"]["tuning_budget"] == {"dpsgd": 3, "fdp_dpsgd": 3, "fdp": 3}
    trials = {
        json.loads(f.read_text())["method"]: json.loads(f.read_text())["trials"]
        for f in (out / "tuning").glob("*.json")
    }
    assert {m: len(t) for m, t in trials.items()} == {"dpsgd": 3, "fdp_dpsgd": 3, "fdp": 3}
    assert "Tuned alike" in (out / "summary.md").read_text()


def test_noise_arms_on_images(tiny_fashion: Path, tmp_path: Path, capsys) -> None:
    """--noise independent,bandmf,blt on images (issue 27): DP-SGD with each noise, each cell planned with its noise
    (BandMF with the grid's bands, BLT with none)."""
    out = tmp_path / "noise"
    assert main(["compare", "--task", "image-classification", "--quick", "--methods", "public,dpsgd", "--epsilon", "8",
                 "--train-size", "200", "--noise", "independent,bandmf,blt", "--bands", "2", "--out", str(out),
                 "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert [(s["method"], s["noise"], s["bands"]) for s in result["summary"]] == [
        ("public", None, None), ("dpsgd", "independent", None), ("dpsgd", "bandmf", [2]), ("dpsgd", "blt", None)]
    df = pd.read_csv(out / "results.csv")
    assert df.loc[df.noise == "bandmf", "bands"].tolist() == [2] and df.loc[df.noise == "blt", "bands"].isna().all()
    for kind in ("bandmf", "blt"):
        (cell,) = (out / "cells").glob(f"dpsgd__{kind}__*.json")
        assert f"noise {kind}" in json.loads(cell.read_text())["guarantee"]
    md = (out / "summary.md").read_text()
    assert "| DP-SGD + BandMF |" in md and "| DP-SGD + BLT |" in md


@pytest.mark.parametrize(("argv", "message"), [
    (["--dataset", "adult"], "--dataset must be one of fashion-mnist"),
    (["--private", "sex"], "--private is for tabular data"),
    (["--feature-map", "pixelate", "--pixelate-factor", "0"], "--pixelate-factor must be >= 1"),
    (["--blur-sigma", "-1"], "--blur-sigma must be"),
    (["--dataset", "folder"], "--dataset folder needs --dataset-path"),
])  # fmt: skip
def test_flag_errors_are_one_line_before_any_work(tiny_fashion: Path, tmp_path: Path, capsys, argv, message) -> None:
    out = tmp_path / "never"
    assert main(["compare", "--task", "image-classification", "--quick", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_missing_data_offline_names_the_fetch_command(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")
    monkeypatch.delenv("FEATUREDP_FASHION_MNIST", raising=False)
    monkeypatch.setattr(images, "FASHION_MNIST_DIRS", ())
    assert main(["compare", "--task", "image-classification", "--quick", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "`featuredp data fetch fashion-mnist`" in err and err.count("\n") == 1
