"""train_one: the one training path of the CLI, the grids and the audits."""

from __future__ import annotations

import pytest
import torch

from _fdp_synth import make_tabular
from featuredp.experiments.runs import load_run
from featuredp.experiments.train_one import TrainedModel, retrain_like, train_cell, train_one, train_tabular

SHORT = {"steps": 3, "batch_size": 40}


@pytest.fixture(scope="module")
def data():
    return make_tabular(400, seed=0), make_tabular(200, seed=1)


def test_returns_model_result_and_the_cli_summary(data):
    run = train_one(data=data, method="fdp", epsilon=2.0, public_seed=3, progress=False, pretrain_epochs=0.1,
                    **SHORT)  # fmt: skip
    assert isinstance(run, TrainedModel) and isinstance(run.model, torch.nn.Module) and not run.model.training
    s = run.summary
    assert s["method"] == "fdp" and s["private_columns"] == ["sex", "race"] and s["public_seed"] == 3
    assert 0 < s["epsilon"] <= 2.0 and s["steps"] == 3 and s["accuracy"] == run.metrics["accuracy"]
    assert run.result.plan.noise_multiplier == s["noise_multiplier"] and s["alpha"] is not None
    assert set(train_tabular(data=data, method="nonprivate", progress=False, **SHORT)) == set(s)


def test_keys_a_method_does_not_read_are_dropped(data):
    # The Trainer refuses pre-training for non-pre-training methods; train_one drops such keys by the record.
    s = train_one(data=data, method="nonprivate", progress=False, noise_multiplier=1.0, alpha=3.0,
                  pretrain_epochs=1.0, public_batch_size=10, strategy="vmap", **SHORT).summary  # fmt: skip
    assert s["epsilon"] is None and s["noise_multiplier"] is None and s["pretrain_steps"] == 0
    s = train_one(data=data, method="dpsgd", epsilon=1.0, progress=False, alpha=3.0, pretrain_epochs=1.0,
                  **SHORT).summary  # fmt: skip
    assert s["pretrain_steps"] == 0 and s["alpha"] is None


def test_private_methods_need_a_budget_and_devices_are_checked(data):
    with pytest.raises(ValueError, match="needs --epsilon"):
        train_one(data=data, method="dpsgd", progress=False, **SHORT)
    with pytest.raises(ValueError, match="method must be one of"):
        train_one(data=data, method="sgd", progress=False, **SHORT)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            train_one(data=data, method="nonprivate", device="cuda", progress=False, **SHORT)
    assert train_one(data=data, method="nonprivate", device="cpu", progress=False, **SHORT).summary["steps"] == 3


def test_grid_cell_seed_is_public_and_no_preset_is_added(data):
    s = train_cell(data=data, method="dpsgd", epsilon=2.0, delta=1e-4, seed=5, model="logreg", **SHORT)
    assert s["public_seed"] == 5 and s["seeded"] is False and s["loss"] == s["test_loss"]
    assert s["model"]["kind"] == "logreg" and s["batch_size"] == 40  # the cell's own params, not a preset's


def test_retrain_like_keeps_the_runs_sigma_and_rate(data, tmp_path):
    train_one(data=data, dataset="synthetic", method="fdp", epsilon=2.0, public_seed=0, out=tmp_path / "r",
              progress=False, pretrain_epochs=0.1, **SHORT)  # fmt: skip
    run = load_run(tmp_path / "r")
    model, result = retrain_like(run, data[0], seed=1)
    assert result.plan.noise_multiplier == run.plan.noise_multiplier
    assert result.plan.sampling_rate == run.plan.sampling_rate and result.steps == 3
    assert not model.training
    _, shorter = retrain_like(run, data[0], steps=2, seed=1)
    assert shorter.steps == 2


def test_own_csv_run_records_how_to_reload_it_and_sparse_models_get_codes(tmp_path):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 300
    df = pd.DataFrame({"a": rng.normal(size=n), "job": rng.choice(["x", "y", "z"], n),
                       "sex": rng.choice(["F", "M"], n)})  # fmt: skip
    df["label"] = np.where(df["a"] + (df["job"] == "x") > 0.3, "hi", "lo")
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    options = {"path": str(path), "label": "label", "private": ["sex"], "categories": {"sex": ["F", "M"]}}
    # sparse_logreg asks the CSV loader for codes with encoding= (its categorical= lists columns).
    run = train_one(dataset="csv", dataset_options=options, method="fdp", epsilon=2.0, model="sparse_logreg",
                    progress=False, out=tmp_path / "run", public_batch_size=40, **SHORT)  # fmt: skip
    assert run.summary["private_columns"] == ["sex"]
    loaded = load_run(tmp_path / "run")
    assert loaded.dataset["options"] == {**options, "encoding": "codes"}
    train, _ = loaded.load_data()
    assert train.X_cat is not None and train.cat_sources == ["job", "sex"]


def test_out_gets_no_rng_state_and_the_private_checkpoint_is_deleted_unless_kept(data, tmp_path, monkeypatch):
    from featuredp.experiments.runs import private_checkpoint

    monkeypatch.setenv("FEATUREDP_PRIVATE_DIR", str(tmp_path / "p"))
    for name, keep in (("a", False), ("b", True)):
        s = train_one(data=data, method="dpsgd", epsilon=2.0, progress=False, out=tmp_path / name,
                      keep_checkpoint=keep, **SHORT).summary  # fmt: skip
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["model.pt", "run.json"]
        assert s["checkpoint"] == str(private_checkpoint(tmp_path / name)) and s["checkpoint_kept"] is keep
        assert private_checkpoint(tmp_path / name).exists() is keep
    kept = torch.load(private_checkpoint(tmp_path / "b"), weights_only=True)
    assert "streams" in kept and private_checkpoint(tmp_path / "b").stat().st_mode & 0o777 == 0o600
    assert "checkpoint" not in train_one(data=data, method="nonprivate", progress=False, **SHORT).summary
