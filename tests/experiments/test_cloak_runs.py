"""Cloak experiments (featuredp.experiments.cloak_runs): the feature table, the attribute audit, Fashion-MNIST."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from featuredp.data import load_dataset
from featuredp.data.tabular import TabularDataset
from featuredp.experiments import cloak_runs as cr
from featuredp.mechanisms.cloak import GUARANTEE, Cloak


def _set_noise(cloak: Cloak, nu: list[float]) -> Cloak:
    """Give ``cloak`` exactly the relative noise ``nu`` (ν = max_noise · sigmoid(ρ))."""
    p = torch.tensor(nu) / cloak.max_noise
    with torch.no_grad():
        cloak.rho.copy_(torch.log(p / (1 - p)))
    return cloak


def test_feature_table_aggregates_one_hot_columns_per_raw_column():
    names = ["age", "sex=Female", "sex=Male", "race=White", "race=Black", "race=Other"]
    ds = TabularDataset(name="toy", X=np.random.default_rng(0).random((20, 6)), y=np.zeros(20, int),
                        feature_names=names, feature_sources=[n.split("=")[0] for n in names], label_name="y",
                        classes=["a", "b"])  # fmt: skip
    cloak = _set_noise(Cloak.from_data(ds.X), [0.1, 3.9, 3.9, 0.1, 3.9, 3.0])
    rows = {r["column"]: r for r in cr.adult_feature_table(cloak, ds)}
    assert rows["age"]["status"] == "kept" and rows["age"]["kept_columns"] == 1
    assert rows["sex"]["status"] == "suppressed" and rows["sex"]["kept"] == []
    assert rows["race"]["status"] == "partly kept" and rows["race"]["kept"] == ["White"]
    assert rows["race"]["encoded_columns"] == 3 and rows["race"]["mean_relative_noise"] == pytest.approx(7.0 / 3, 1e-5)
    assert cr.kept_features(cloak, ds) == ["age", "race=White"]


@pytest.fixture(scope="module")
def adult_small():
    train, test = load_dataset("adult")
    rng = np.random.default_rng(0)
    return train.subset(rng.choice(train.n, 2000, replace=False)), test.subset(rng.choice(test.n, 3000, replace=False))


def test_attribute_audit_controls(adult_small):
    train, test = adult_small
    # A transparent cloak (ν ≈ 0, no mask): the server reads sex off the query.
    clear = _set_noise(Cloak.from_data(train.X), [1e-6] * train.X.shape[1])
    r = cr.cloak_attribute_audit(clear, train, test, "sex", attackers=("logistic",))
    assert r["attack_accuracy"] > 0.99 and r["advantage_ci"][0] > 0.1 and r["verdict"].startswith("ABOVE")
    assert r["imputation_baseline"] > r["majority_baseline"]
    assert r["attribute_columns_kept"] == ["sex=Female", "sex=Male"]
    assert r["guarantee"] == GUARANTEE
    # Withheld sex and race, the rest in the clear: exactly the imputation baseline's knowledge.
    w = cr.cloak_attribute_audit(clear, train, test, "sex", withhold=True, attackers=("logistic",))
    assert abs(w["advantage"]) < 0.01 and w["verdict"].startswith("at the imputation baseline")
    # Everything masked: the query is a constant, the attacker can only guess the majority value.
    dark = Cloak.from_data(train.X)
    dark.keep.fill_(False)
    dark.masked = True
    d = cr.cloak_attribute_audit(dark, train, test, "race", attackers=("logistic", "boosting"))
    assert d["attack_accuracy"] == pytest.approx(d["majority_baseline"])
    assert d["advantage_ci"][1] < 0 and d["verdict"].startswith("below the imputation baseline")
    with pytest.raises(ValueError, match="attackers must be one of"):
        cr.cloak_attribute_audit(dark, train, test, "race", attackers=("oracle",))


def _write_idx(path: Path, arr: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    path.write_bytes(gzip.compress(header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()))


def test_fashion_mnist_path_gives_a_heat_map(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 60), ("t10k", 30)):
        img = rng.integers(0, 256, (n, 28, 28))
        img[:, :, :4] = 0  # a constant border, as in the real images
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", img)
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    train, test = cr.load_cloak_data("fashion-mnist", tmp_path)
    assert train.X.shape == (60, 784) and train.X.min() >= 0 and train.X.max() <= 1
    assert train.feature_names[29] == "px1_1"
    res = cr.run_cloak("fashion-mnist", lam=1.0, epochs=100, public_seed=0, data=(train, test))
    assert res["attribute_inference"] == {} and len(res["relative_noise"]) == 784 and res["guarantee"] == GUARANTEE
    # Constant pixels end up suppressed: f cannot need them, so the noise term alone drives their ν up.
    keep = np.asarray(res["keep"]).reshape(28, 28)
    assert not keep[:, :4].any()
    files = cr.write_results(res, tmp_path / "out")
    assert {Path(f).name for f in files} >= {"fashion-mnist_heatmap.png", "fashion-mnist_curve.png", "summary.md"}
    assert "## fashion-mnist" in (tmp_path / "out" / "summary.md").read_text()


def test_fashion_mnist_absent_names_the_fetch_command(tmp_path, monkeypatch):
    from featuredp.data import images

    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")
    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path))
    monkeypatch.setenv("FEATUREDP_FASHION_MNIST", str(tmp_path / "nowhere"))
    monkeypatch.setattr(images, "FASHION_MNIST_DIRS", (), raising=False)
    for where in (None, tmp_path):  # nothing anywhere; a folder without the files
        with pytest.raises(FileNotFoundError) as info:
            cr.load_cloak_data("fashion-mnist", where)
        assert cr.FETCH_COMMAND in str(info.value) and "\n" not in str(info.value)


def test_fdp_reference_is_the_audit_of_an_fdp_model(adult_small):
    train, test = adult_small
    ref = cr.fdp_attribute_reference(("sex",), epsilon=1.0, n_targets=200, data=(train, test))
    assert ref["epsilon"] == pytest.approx(1.0, abs=0.02) and ref["private_columns"] == ["sex"]
    s = ref["attributes"]["sex"]
    assert s["within_bound"] and s["bound"] < 1 and s["attack_accuracy"] <= s["bound"]
    assert "FDP" in ref["guarantee"]
