"""Issue 42: with ``--record-epsilon E`` the public-only reference ``train`` prints is trained under the backstop.

The reference is what ``train --method public`` would give the same user: a run with the record-level backstop reads
records only through clipped, noised, Poisson-sampled public steps, so a reference trained without noise showed an
accuracy no backstopped public model reaches (and read every record's public view in the clear).
"""

from __future__ import annotations

import json

import pytest

from featuredp.cli import main

_RUN = ["train", "--dataset", "adult", "--private", "sex,race", "--method", "fdp", "--epsilon", "2", "--epochs",
        "0.05", "--pretrain-epochs", "0.05", "--model", "logreg"]  # fmt: skip


def test_the_public_only_reference_runs_under_the_record_level_backstop(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_RUN, "--record-epsilon", "6", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    refs = summary["baselines"]
    assert refs["public_only"] is not None and summary["record_backstop"] is True
    assert refs["public_only_record_backstop"] is True  # before: the reference's public steps had no noise
    assert refs["public_only_record_noise_multiplier"] > 0
    assert 0 < refs["public_only_record_epsilon"] <= 6


def test_without_a_backstop_the_reference_is_noiseless_and_says_free(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_RUN, "--json"]) == 0
    refs = json.loads(capsys.readouterr().out)["baselines"]
    assert refs["public_only"] is not None and refs["public_only_record_backstop"] is False
    assert refs["public_only_record_noise_multiplier"] is None and refs["public_only_record_epsilon"] is None
    assert main(_RUN) == 0
    assert "Ψ alone: free" in capsys.readouterr().out


def test_the_printed_reference_names_the_backstop(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_RUN, "--record-epsilon", "6"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("references"))
    assert "under the record-level backstop, record ε" in line and "free" not in line
