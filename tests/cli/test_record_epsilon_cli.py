"""``--record-epsilon E`` (the record-level backstop) on ``featuredp train`` (tabular and text) and ``compare``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import featuredp.experiments.text_lm as text_lm
from _text_preset import TINY
from featuredp.cli import main

_TAB = ["train", "--dataset", "adult", "--private", "sex,race", "--epsilon", "2", "--epochs", "0.05",
        "--model", "logreg", "--no-baselines", "--json"]  # fmt: skip


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_train_tabular_json_record_epsilon(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plain = _json(capsys, [*_TAB, "--method", "fdp", "--pretrain-epochs", "0.05"])
    assert plain["record_epsilon"] is None and plain["record_backstop"] is False
    dp = _json(capsys, [*_TAB, "--method", "dpsgd"])
    assert dp["record_epsilon"] == dp["epsilon"]
    run = tmp_path / "run"
    backed = _json(capsys, [*_TAB, "--method", "fdp", "--pretrain-epochs", "0.05", "--record-epsilon", "6",
                            "--out", str(run)])  # fmt: skip
    assert 0.99 * 6 <= backed["record_epsilon"] <= 6 and backed["record_backstop"] is True
    assert backed["epsilon"] <= 2
    info = json.loads((run / "run.json").read_text())
    assert info["result"]["record_epsilon"] == backed["record_epsilon"]
    assert info["config"]["record_epsilon"] == 6 and info["plan"]["record_noise_multiplier"] > 0


def test_train_refusals_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, [*_TAB, "--method", "nonprivate", "--record-epsilon", "4"], "--record-epsilon")
    _refused(capsys, [*_TAB, "--method", "fdp", "--noise", "bandmf", "--record-epsilon", "4"], "--record-epsilon")
    _refused(capsys, [*_TAB, "--method", "fdp", "--noise", "blt", "--record-epsilon", "4"], "--record-epsilon")
    _refused(capsys, [*_TAB, "--method", "fdp", "--record-epsilon", "-1"], "--record-epsilon must be > 0")
    _refused(capsys, [*_TAB, "--method", "dpsgd", "--record-epsilon", "0.5"], "--record-epsilon 0.5 cannot be met")


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text_lm, "TEXT_PRESET", copy.deepcopy(TINY))


def test_train_text_record_epsilon_json_and_line(tiny: None, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["train", "--task", "text", "--method", "fdp", "--epsilon", "3", "--canaries", ""]
    summary = _json(capsys, [*base, "--record-epsilon", "8", "--json"])
    assert 0.99 * 8 <= summary["record_epsilon"] <= 8 and summary["epsilon"] <= 3
    assert "DP for whole records" in summary["guarantee"]
    assert main([*base]) == 0
    assert "record ε          none: what Ψ misses is public" in capsys.readouterr().out


def test_compare_text_runs_backstop_arms(tiny: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    result = _json(capsys, ["compare", "--task", "text", "--quick", "--epsilons", "3", "--methods", "dpsgd,fdp",
                            "--record-epsilon", "8", "--out", str(out), "--json"])  # fmt: skip
    rows = {r["label"]: r for r in result["rows"]}
    assert set(rows) == {"dpsgd", "fdp", "fdp + backstop E=8"}
    assert rows["fdp"]["record_epsilon"] is None and rows["dpsgd"]["record_epsilon"] == rows["dpsgd"]["epsilon_spent"]
    assert 0.99 * 8 <= rows["fdp + backstop E=8"]["record_epsilon"] <= 8
    assert "FDP (Alg. 1) + backstop E=8" in (out / "summary.md").read_text()
    assert len(list((out / "cells").glob("fdp__backstop8__*"))) == 1


def test_compare_tabular_applies_e_to_every_cell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    seen = {}

    def fake_run_grid(cfg: Any) -> dict[str, Any]:
        seen["cfg"] = cfg
        return {"dataset": cfg.dataset, "out": str(cfg.out), "summary": [], "meta": {}}

    monkeypatch.setattr("featuredp.experiments.run_grid", fake_run_grid)
    assert main(["compare", "--epsilon", "3", "--methods", "nonprivate,fdp", "--record-epsilon", "8",
                 "--out", str(tmp_path), "--json"]) == 0  # fmt: skip
    cfg = seen["cfg"]
    assert cfg.record_epsilon == 8.0
    from featuredp.experiments.grid import GridRunner

    runner = GridRunner(cfg)  # the cell params carry E (and with them the cell's hash); nonprivate refuses it
    assert runner.params_for("fdp", 3.0)["record_epsilon"] == 8.0
    assert "record_epsilon" not in runner.params_for("nonprivate", None)
    _refused(capsys, ["compare", "--epsilon", "3", "--record-epsilon", "8", "--noise", "bandmf", "--out",
                      str(tmp_path / "b")], "--record-epsilon")  # fmt: skip


def test_train_public_with_a_backstop_keeps_the_clipping_norm(capsys: pytest.CaptureFixture[str]) -> None:
    summary = _json(capsys, [*_TAB, "--method", "public", "--record-epsilon", "4", "--max-grad-norm", "0.3"])
    assert summary["max_grad_norm"] == 0.3 and 0.99 * 4 <= summary["record_epsilon"] <= 4
    assert summary["epsilon"] == 0.0  # (0, 0)-FDP still
