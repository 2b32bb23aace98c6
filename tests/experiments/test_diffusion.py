"""End-to-end smoke run of the five-method comparison on tiny synthetic IDX data (through the engine)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from featuredp.experiments.diffusion import DIFFUSION_METHODS, load_model, main


def write_fake_fashion(root: Path, n_train: int, n_test: int) -> None:
    """Tiny Fashion-MNIST-shaped IDX files (uint8 images and labels), gzip-compressed."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        for kind, arr in (("images-idx3", rng.integers(0, 256, (n, 28, 28))), ("labels-idx1", np.arange(n) % 10)):
            header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
            (root / f"{prefix}-{kind}-ubyte.gz").write_bytes(gzip.compress(header + arr.astype(np.uint8).tobytes()))


def test_quick_compare_all_methods(tmp_path: Path) -> None:
    data = tmp_path / "fm"
    write_fake_fashion(data, n_train=48, n_test=24)
    out = tmp_path / "out"
    argv = ["--dataset", "fashion-mnist", "--dataset-path", str(data), "--out", str(out), "--quick",
            "--epsilon", "8", "--json"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    keys = [r.get("key") for r in summary["rows"] if "key" in r]
    assert keys == list(DIFFUSION_METHODS)
    assert summary["delta"] == pytest.approx(1 / (2 * 48))
    for m in DIFFUSION_METHODS:
        r = json.loads((out / m / "result.json").read_text())
        assert (out / m / "grid.png").stat().st_size > 0
        if m in ("dpsgd", "fdp_dpsgd", "fdp"):
            assert 0 < r["epsilon"] <= 8.0 and r["noise_multiplier"] > 0
        elif m == "public":
            assert r["epsilon"] == 0.0
    fdp = json.loads((out / "fdp" / "result.json").read_text())
    assert "public" in fdp["init"] and "blurred (public)" in fdp["rejection"]["threshold_source"]
    assert (out / "grids.png").exists() and "FDP (Alg. 1)" in (out / "summary.md").read_text()
    assert load_model(out / "fdp" / "model.pt").config.base_channels == 16
    # a second call reuses finished methods instead of retraining them
    stamp = (out / "dpsgd" / "model.pt").stat().st_mtime_ns
    assert main([*argv, "--methods", "dpsgd", "--no-summary"]) == 0
    assert (out / "dpsgd" / "model.pt").stat().st_mtime_ns == stamp


def test_bad_options_fail_before_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="methods"):
        main(["--out", str(tmp_path), "--methods", "nonprivate,magic"])
    with pytest.raises(ValueError, match="blur_sigma"):
        main(["--out", str(tmp_path), "--blur-sigma", "-1"])
    assert not any(tmp_path.iterdir())
