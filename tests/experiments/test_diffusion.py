"""End-to-end smoke run of the five-method comparison on tiny synthetic IDX data (through the engine)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from featuredp.experiments.diffusion import DIFFUSION_METHODS, load_model, main


def write_fake_fashion(root: Path, n_train: int, n_test: int, *, grouped: bool = False) -> None:
    """Tiny Fashion-MNIST-shaped IDX files (uint8 images and labels), gzip-compressed; ``grouped``
    stores the images sorted by class (as some loaders do)."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = np.sort(np.arange(n) % 10) if grouped else np.arange(n) % 10
        for kind, arr in (("images-idx3", rng.integers(0, 256, (n, 28, 28))), ("labels-idx1", labels)):
            header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
            (root / f"{prefix}-{kind}-ubyte.gz").write_bytes(gzip.compress(header + arr.astype(np.uint8).tobytes()))


@pytest.mark.slow  # 16 s: every method's quick diffusion compare (CI time; run with `pytest -m slow`)
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
    with pytest.raises(ValueError, match="public_weight"):
        main(["--out", str(tmp_path), "--public-weight", "step:1.5"])
    with pytest.raises(ValueError, match="resolution"):
        main(["--out", str(tmp_path), "--resolution", "2"])
    with pytest.raises(ValueError, match="checkpoint_every"):
        main(["--out", str(tmp_path), "--checkpoint-every", "0"])
    assert not any(tmp_path.iterdir())


def test_resume_refuses_a_legacy_checkpoint_in_the_results_folder_before_any_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import featuredp.experiments.diffusion as diffusion

    def no_training(*a: object, **k: object) -> None:
        raise AssertionError("trained before the refusal")

    monkeypatch.setattr(diffusion, "_train_method", no_training)
    out = tmp_path / "out"
    (out / "fdp").mkdir(parents=True)
    (out / "fdp" / "checkpoint.pt").write_bytes(b"an older featuredp's state, in the shareable folder")
    argv = ["--out", str(out), "--quick", "--methods", "public,fdp", "--no-summary"]
    with pytest.raises(ValueError, match=r"fdp/checkpoint\.pt is a checkpoint an older featuredp left.*--accept"):
        main([*argv, "--resume"])
    with pytest.raises(ValueError, match="--accept-legacy-checkpoint is for --resume"):
        main([*argv, "--accept-legacy-checkpoint"])
    # accepted: the refusal is passed (the training stand-in is reached, for the first method)
    with pytest.raises(AssertionError, match="trained before"):
        main([*argv, "--resume", "--accept-legacy-checkpoint"])


def test_resolution_checkpoint_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import featuredp.experiments.diffusion as diffusion

    data = tmp_path / "fm"
    write_fake_fashion(data, n_train=48, n_test=24)
    out = tmp_path / "out"
    argv = ["--dataset-path", str(data), "--out", str(out), "--quick", "--resolution", "16", "--methods", "public",
            "--checkpoint-every", "1", "--no-summary"]

    # a crash after training but before the model is saved leaves the (secret) checkpoint behind
    def crash(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(diffusion, "_save_model", crash)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    from featuredp.experiments.runs import private_checkpoint

    checkpoint = private_checkpoint(out / "public")  # outside the results folder, owner-only
    assert checkpoint.exists() and not (out / "public" / "result.json").exists()
    assert checkpoint.parent.stat().st_mode & 0o777 == 0o700 and not (out / "public" / "checkpoint.pt").exists()
    monkeypatch.undo()
    # it is neither silently overwritten nor silently continued
    with pytest.raises(FileExistsError, match="--resume"):
        main(argv)
    assert main([*argv, "--resume"]) == 0
    r = json.loads((out / "public" / "result.json").read_text())
    assert r["resumed"] is True and r["steps"] == 3
    assert not checkpoint.exists() and not checkpoint.parent.exists()  # the private RNG state is not left behind
    assert np.load(out / "public" / "samples.npz")["samples"].shape[-2:] == (16, 16)
    assert main(["--dataset-path", str(data), "--out", str(out), "--quick", "--resolution", "16",
                 "--methods", "public", "--json"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["image_shape"] == [1, 16, 16]
    row = next(r for r in summary["rows"] if r.get("key") == "public")
    assert row["domain_fid_ci"][0] <= row["domain_fid_ci"][1] and "sharpness" in row and "domain_kid" in row


def test_timestep_weight_reaches_only_algorithm_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import featuredp.experiments.diffusion as diffusion

    seen: dict[str, object] = {}
    real_trainer = diffusion.Trainer

    def spy(model: object, method: str, **kw: object) -> object:
        seen[method] = kw["loss_split"].public_weight  # type: ignore[attr-defined]
        return real_trainer(model, method, **kw)

    monkeypatch.setattr(diffusion, "Trainer", spy)
    data = tmp_path / "fm"
    write_fake_fashion(data, n_train=48, n_test=24)
    assert main(["--dataset-path", str(data), "--out", str(tmp_path / "o"), "--quick", "--methods", "fdp,fdp_dpsgd",
                 "--public-weight", "step:0.5", "--no-summary"]) == 0
    assert seen["public"] is None and seen["fdp_dpsgd"] is None
    assert seen["fdp"] is not None and seen["fdp"].threshold == 0.5  # type: ignore[attr-defined]


def test_a_method_being_trained_by_another_process_is_waited_for_not_trained_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess
    import sys

    import featuredp.experiments.diffusion as diffusion

    monkeypatch.setattr(diffusion, "_POLL_S", 0.01)
    out = tmp_path / "public"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    real_alive, checks = diffusion._pid_alive, [0]

    def alive_then_done(pid: int) -> bool:
        # the other process "finishes" on the third look: counted in polls, not seconds, so a busy machine
        # cannot make the result appear before the wait began (no timer thread racing the first check)
        checks[0] += 1
        if checks[0] == 3:
            (out / "result.json").write_text('{"method": "public"}')
        return real_alive(pid)

    monkeypatch.setattr(diffusion, "_pid_alive", alive_then_done)
    try:
        out.mkdir()
        (out / "train.lock").write_text(str(other.pid))
        assert diffusion._claim(out, "public") is False  # waited, then found the other's result
        assert checks[0] == 3
        assert f"waiting for process {other.pid}" in capsys.readouterr().err
    finally:
        other.kill()
        other.wait()
    # a lock whose process has died is taken over
    (out / "result.json").unlink()
    assert diffusion._claim(out, "public") is True
    assert (out / "train.lock").read_text() == str(__import__("os").getpid())


def test_real_reference_rows_cover_every_class_when_the_data_is_grouped_by_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from featuredp.metrics.domain import DomainMetrics

    seen: list[np.ndarray] = []
    real_report = DomainMetrics.report

    def spy(self: DomainMetrics, images: object, labels: object = None, **kw: object) -> dict:
        seen.append(np.asarray(labels))
        return real_report(self, images, labels, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(DomainMetrics, "report", spy)
    data = tmp_path / "fm"
    write_fake_fashion(data, n_train=48, n_test=24, grouped=True)
    assert main(["--dataset-path", str(data), "--out", str(tmp_path / "o"), "--quick", "--methods", "public"]) == 0
    real_row, blurred_row = seen[0], seen[1]
    assert set(real_row.tolist()) == set(range(10)) and set(blurred_row.tolist()) == set(range(10))


def test_inception_rows_have_intervals_and_features_follow_the_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Inception weights are not in CI: a stand-in network (4 image statistics) exercises the path.
    # Features are cached per set, keyed by the images themselves: samples replaced by a retrain
    # (--overwrite) must be scored anew, not by the old samples' cached features.
    from featuredp.experiments import diffusion

    calls: list[int] = []

    class FakeInception:
        def __call__(self, images: np.ndarray) -> np.ndarray:
            x = np.asarray(images, np.float64).reshape(len(images), -1)
            calls.append(len(x))
            return np.stack([x.mean(1), x.std(1), x[:, : x.shape[1] // 2].mean(1), x[:, ::3].mean(1)], 1)

    monkeypatch.setattr(diffusion, "InceptionFeatures", FakeInception)
    data, out = tmp_path / "fm", tmp_path / "o"
    write_fake_fashion(data, n_train=64, n_test=40)
    assert main(["--dataset-path", str(data), "--out", str(out), "--quick", "--methods", "public"]) == 0
    argv = ["--dataset-path", str(data), "--out", str(out), "--methods", "public", "--steps", "3",
            "--public-steps", "3", "--batch-size", "16", "--samples", "20", "--ddim-steps", "3",
            "--inception-samples", "12", "--inception-reference", "30"]
    assert main(argv) == 0
    assert calls == [30, 12, 12]  # test reference, real training rows, the public samples
    rows = {r["method"]: r for r in json.loads((out / "summary.json").read_text())["rows"]}
    for name in ("real (train vs test)", diffusion.label("public")):
        lo, hi = rows[name]["inception_fid_ci"]
        assert rows[name]["n_inception"] == 12 and 0 <= lo <= hi and rows[name]["inception_fid"] >= 0
    assert "Inception FID: the first 12 samples (balanced over classes) against 30 real test images" in (
        out / "summary.md").read_text()
    assert main(argv) == 0 and calls == [30, 12, 12]  # nothing new: all three sets cached
    z = dict(np.load(out / "public" / "samples.npz"))
    z["samples"] = 255 - z["samples"]  # what a retrain leaves: other samples under the same name
    np.savez_compressed(out / "public" / "samples.npz", **z)
    assert main(argv) == 0 and calls == [30, 12, 12, 12]
