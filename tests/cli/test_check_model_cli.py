"""``featuredp check-model``: the replay self-test from the command line."""

from __future__ import annotations

import json

import pytest
import torch

from featuredp.cli import main


def test_check_model_passes_on_the_bundled_data_and_says_it_is_outside_epsilon(capsys):
    args = ["check-model", "--dataset", "adult", "--methods", "dpsgd,fdp", "--records", "1", "--batch-size", "8",
            "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] is False and out["covered_by_epsilon"] is False
    assert {(r["method"], r["strategy"]) for r in out["configurations"]} == {
        (m, s) for m in ("dpsgd", "fdp") for s in ("ghost", "vmap")}
    assert all(r["verdict"].startswith("safe") for r in out["configurations"])


def test_a_broken_clip_is_reported_as_unsafe_with_exit_1(capsys, monkeypatch):
    import featuredp.clipping.ghost as ghost

    exact = ghost.clip_factors
    monkeypatch.setattr(ghost, "clip_factors", lambda norms, C: 2 * exact(norms, C))  # clips to 2C
    assert main(["check-model", "--methods", "dpsgd", "--strategies", "ghost", "--records", "1"]) == 1
    out = capsys.readouterr()
    assert "failed" in out.out and "UNSAFE" in out.out and "clipped sum sensitivity" in out.out
    assert "not covered by epsilon" in out.err


def test_flags_are_named(capsys):
    assert main(["check-model", "--records", "0"]) == 2
    assert "--records must be >= 1, got 0" in capsys.readouterr().err
    assert main(["check-model", "--strategies", "loop"]) == 2
    assert "--strategies must be a comma-separated list of vmap, ghost, auto, got 'loop'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # argparse's own type check
        main(["check-model", "--methods", "nonprivate"])
    assert stop.value.code == 2 and "--methods must be a comma-separated list of" in capsys.readouterr().err
    assert main(["check-model", "--max-grad-norm", "0"]) == 2
    assert "--max-grad-norm must be > 0, got 0.0" in capsys.readouterr().err


def test_the_model_left_unchanged_by_trainer_check_model():
    from _fdp_synth import make_tabular
    from featuredp.engine import Trainer
    from featuredp.testing import verdict

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    before = [p.detach().clone() for p in model.parameters()]
    t = Trainer(model, "dpsgd", steps=3, batch_size=16, noise_multiplier=1.0, max_grad_norm=0.1, progress=False)
    reports = t.check_model(make_tabular(100), records=2, batch_size=10)
    assert len(reports) == 2 and verdict(reports).startswith("safe")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
