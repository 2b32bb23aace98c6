"""`featuredp compare --noise independent,bandmf,blt [--bands B]`: passed to the grid, refused where it does not
apply."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from featuredp.cli import main


def test_noise_and_bands_reach_the_grid(tmp_path, monkeypatch) -> None:
    seen = {}

    def fake_run_grid(cfg):
        seen["cfg"] = cfg
        return {"dataset": cfg.dataset, "out": str(cfg.out), "summary": [], "meta": {}}

    monkeypatch.setattr("featuredp.experiments.run_grid", fake_run_grid)
    assert main(["compare", "--methods", "dpsgd,fdp", "--noise", "bandmf,independent", "--bands", "4",
                 "--out", str(tmp_path / "o"), "--json"]) == 0  # fmt: skip
    assert seen["cfg"].noises == ["independent", "bandmf"] and seen["cfg"].bands == 4
    assert main(["compare", "--methods", "dpsgd,fdp", "--noise", "blt,bandmf,independent", "--bands", "4",
                 "--out", str(tmp_path / "o"), "--json"]) == 0  # fmt: skip
    assert seen["cfg"].noises == ["independent", "bandmf", "blt"] and seen["cfg"].bands == 4
    assert main(["compare", "--methods", "fdp", "--noise", "blt", "--out", str(tmp_path / "o"), "--json"]) == 0
    assert seen["cfg"].noises == ["blt"] and seen["cfg"].bands is None
    assert main(["compare", "--out", str(tmp_path / "o"), "--json"]) == 0
    assert seen["cfg"].noises == ["independent"] and seen["cfg"].bands is None  # the default: the grids of before


def _refusals(kind: str) -> list[tuple[list[str], str]]:
    """What every correlated kind refuses alike (BandMF's and BLT's arms share the grid's checks)."""
    return [
        (["--noise", kind, "--methods", "nonprivate,public"], f"--noise {kind} is for the private methods"),
        (["--noise", kind, "--protocol", "paper"], f"--noise {kind} does not combine with --protocol paper"),
        (["--noise", f"independent,{kind}", "--task", "text"], "--noise is for --task tabular and "
                                                               "image-classification"),
        (["--noise", kind, "--task", "diffusion"], "--noise is for --task tabular and image-classification, got "
                                                   "--task diffusion"),
    ]  # fmt: skip


@pytest.mark.parametrize(("argv", "message"), [
    (["--noise", "ftrl"], "--noise must be a comma-separated subset of independent,bandmf,blt, got ftrl"),
    (["--noise", "independent,gauss"], "--noise must be a comma-separated subset"),
    (["--bands", "4"], "--bands is for --noise with bandmf, got --bands 4 with --noise independent"),
    (["--noise", "bandmf", "--bands", "0"], "--bands must be >= 1, got 0"),
    # BLT chooses its own strategy: bands given to a grid without BandMF would be silently unused
    (["--noise", "blt", "--bands", "4"], "--bands is for --noise with bandmf, got --bands 4 with --noise blt"),
    (["--noise", "independent,blt", "--bands", "2"], "--bands is for --noise with bandmf, got --bands 2 with "
                                                     "--noise independent,blt"),
    *_refusals("bandmf"),
    *_refusals("blt"),
])  # fmt: skip
def test_bad_noise_flags_are_one_line_before_any_work(tmp_path, monkeypatch, capsys, argv, message) -> None:
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the flags were checked")

    monkeypatch.setattr("featuredp.experiments.run_grid", no_work)
    monkeypatch.setattr("featuredp.experiments.diffusion.run_compare", no_work)
    assert main(["compare", "--quick", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.filterwarnings("ignore::featuredp.errors.PrivacyLeakWarning")  # the tiny CSV has no schema
def test_a_real_grid_with_both_noises_reports_both(tmp_path, capsys) -> None:
    path = tmp_path / "t.csv"
    rows = ["a,b,s,y"] + [f"{i % 7},{(i * 3) % 5},{'xy'[i % 2]},{int(i % 7 + (i % 2) > 3)}" for i in range(400)]
    path.write_text("\n".join(rows) + "\n")
    out = tmp_path / "grid"
    argv = ["compare", "--dataset", "csv", "--dataset-path", str(path), "--label", "y", "--private", "s",
            "--methods", "public,dpsgd", "--epsilons", "8", "--noise", "independent,bandmf", "--bands", "2",
            "--quick", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| DP-SGD + BandMF |" in printed and "| DP-SGD |" in printed and "## BandMF − independent noise" in printed
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 1 + 2  # the public-only reference once, DP-SGD with each noise
    assert sorted(df["noise"].fillna("-")) == ["-", "bandmf", "independent"]
    assert df.loc[df.noise == "bandmf", "bands"].tolist() == [2]
    grid = json.loads((out / "grid.json").read_text())["config"]
    assert grid["noises"] == ["independent", "bandmf"] and grid["bands"] == 2
    (bandmf,) = (out / "cells").glob("dpsgd__bandmf__*.json")
    assert "noise bandmf" in json.loads(bandmf.read_text())["guarantee"]
    # --report-only rewrites the same report from the cells; the grid without BandMF is a different grid
    assert main([*argv, "--report-only"]) == 0
    assert "| DP-SGD + BandMF |" in capsys.readouterr().out
    without = [a for a in argv if a not in ("independent,bandmf", "--noise", "--bands", "2")]
    assert main(without) == 2
    assert "different grid" in capsys.readouterr().err


def test_the_clis_noise_choices_are_the_registry_read_when_parsing():
    import subprocess
    import sys

    from featuredp.cli._flags import NOISES
    from featuredp.noise import NOISE_PLANS

    assert list(NOISES) == list(NOISE_PLANS) and "blt" in NOISES and "gaussian" not in NOISES
    # building the parser (featuredp --help) still imports no accountant: the choices are read on first use
    code = ("import sys; from featuredp.cli import build_parser; build_parser(); "
            "print('featuredp.accounting' in sys.modules, 'featuredp.noise' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.filterwarnings("ignore::featuredp.errors.PrivacyLeakWarning")  # the tiny CSV has no schema
def test_a_real_grid_with_blt_reports_it_as_its_own_arm(tmp_path, capsys) -> None:
    # All three noises in one grid: BLT is its own arm (cells, rows, report lines, plot line), BandMF alone gets the
    # grid's bands, and each cell's guarantee is its own noise's.
    path = tmp_path / "t.csv"
    rows = ["a,b,s,y"] + [f"{i % 7},{(i * 3) % 5},{'xy'[i % 2]},{int(i % 7 + (i % 2) > 3)}" for i in range(400)]
    path.write_text("\n".join(rows) + "\n")
    out = tmp_path / "grid"
    argv = ["compare", "--dataset", "csv", "--dataset-path", str(path), "--label", "y", "--private", "s",
            "--methods", "public,dpsgd", "--epsilons", "8", "--noise", "independent,bandmf,blt", "--bands", "2",
            "--quick", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| DP-SGD + BLT |" in printed and "| DP-SGD + BandMF |" in printed and "| DP-SGD |" in printed
    assert "## BLT − independent noise" in printed
    # BLT's table row comes after BandMF's
    assert printed.index("| DP-SGD + BandMF |") < printed.index("| DP-SGD + BLT |")
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 1 + 3
    assert sorted(df["noise"].fillna("-")) == ["-", "bandmf", "blt", "independent"]
    assert df.loc[df.noise == "blt", "bands"].isna().all() and df.loc[df.noise == "bandmf", "bands"].tolist() == [2]
    assert float(df.loc[df.noise == "blt", "epsilon"].iloc[0]) <= 8.0
    grid = json.loads((out / "grid.json").read_text())["config"]
    assert grid["noises"] == ["independent", "bandmf", "blt"]
    (blt,) = (out / "cells").glob("dpsgd__blt__*.json")
    cell = json.loads(blt.read_text())
    assert cell["row"]["noise"] == "blt" and "bands" not in json.loads(cell["row"]["params"])
    assert "noise blt" in cell["guarantee"] and "no amplification" in cell["guarantee"]
    md = (out / "summary.md").read_text()
    assert "BLT: d <= 4 buffers optimised for the run's workload, one Gaussian at the min-sep sensitivity, no " \
           "amplification: featuredp.noise.blt" in md
    assert "BLT's σ is likewise the std of z" in md
