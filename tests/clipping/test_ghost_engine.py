"""GhostGradients inside the real Trainer, and the ``featuredp benchmark`` command."""

from __future__ import annotations

import json

import pytest
import torch

from featuredp import engine
from featuredp.cli import main
from featuredp.clipping.ghost import GhostGradients
from featuredp.experiments.throughput import interleaved, synthetic_purchase
from featuredp.features import Columns
from featuredp.losses import default_split
from featuredp.models import build_model, spec_for


@pytest.fixture(scope="module")
def small():
    return synthetic_purchase(300, d=20, n_classes=4, n_public=5, seed=1)


def _train(data, public, method, strategy, split="padding"):
    model = build_model(spec_for(data, "mlp", hidden=[8]), seed=engine.init_seed(3))
    trainer = engine.Trainer(
        model,
        method,
        loss_split=default_split(Columns(public=public), split) if method == "fdp" else None,
        steps=6,
        batch_size=40,
        noise_multiplier=1.0,
        max_grad_norm=0.05,  # small C: most examples are clipped, so the clip factors matter
        delta=1e-4,
        strategy=strategy,
        physical_batch_size=None,
        seed=5,
        progress=False,
    )
    trainer.fit(data)
    return trainer


@pytest.mark.parametrize(("method", "split"), [("dpsgd", None), ("fdp", "padding"), ("fdp", "zero")])
def test_trainer_with_ghost_matches_vmap(small, method, split):
    """Same seed, same data: the ghost and vmap strategies give the same trained model (float rounding);
    with zero masking both see the public passes on the public columns only (ColumnLinear)."""
    data, public = small
    ghost = _train(data, public, method, GhostGradients(), split)
    vmap = _train(data, public, method, "vmap", split)
    for (n, p), (_, q) in zip(ghost.model.named_parameters(), vmap.model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=f"parameter {n} differs")
    moved = any(
        not torch.equal(p, q)
        for p, q in zip(ghost.model.parameters(), build_model(spec_for(data, "mlp", hidden=[8]),
                                                              seed=engine.init_seed(3)).parameters())
    )
    assert moved


def test_trainer_picks_ghost_by_name(small):
    data, public = small
    trainer = _train(data, public, "fdp", "ghost")
    assert isinstance(trainer.strategy, GhostGradients)
    assert trainer.strategy.fallback_layers == []


def test_interleaved_ratios_are_within_rounds():
    calls = []
    from featuredp.experiments.throughput import StepRunner

    fast = StepRunner("fast", lambda: calls.append("f"), 10.0)
    slow = StepRunner("slow", lambda: [calls.append("s"), sum(range(20000))][0], 10.0)
    res = interleaved([fast, slow], rounds=3, min_time=0.01, warmup=1, progress=False)
    assert len(res.samples_per_s["slow"]) == 3
    assert res.median_ratio("fast") == 1.0
    assert 0 < res.median_ratio("slow") < 1
    with pytest.raises(ValueError, match="rounds"):
        interleaved([fast], rounds=0)
    with pytest.raises(ValueError, match="reference"):
        interleaved([fast], reference="nope")


def test_benchmark_cli_json(capsys):
    rc = main(["benchmark", "--batch-size", "32", "--dataset-size", "256", "--rounds", "1", "--min-time", "0.01",
               "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("nonprivate", "dpsgd", "fdp", "ratio_dpsgd", "ratio_fdp"):
        assert out[key] > 0
    assert out["batch_size"] == 32 and out["loss_split"] == "zero"
    rc = main(["benchmark", "--batch-size", "32", "--dataset-size", "256", "--rounds", "1", "--min-time", "0.01",
               "--methods", "fdp", "--loss-split", "padding", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["loss_split"] == "padding" and out["ratio_fdp"] > 0 and "dpsgd" not in out


def test_benchmark_cli_bad_input(capsys):
    assert main(["benchmark", "--batch-size", "0"]) == 2
    assert "--batch-size" in capsys.readouterr().err  # the flag the user typed
    with pytest.raises(SystemExit):
        main(["benchmark", "--methods", "dpsgd,magic"])
