"""Grids with correlated noise (issue 27): one arm per noise for each private method, the references once."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from featuredp.experiments import GridConfig, GridRunner, grid_cells, run_grid
from featuredp.experiments.grid_report import arm_label, row_noise
from featuredp.experiments.plots import privacy_utility_plot


class NoiseAwareTrainer:
    """Stands in for train_cell: records each call; BandMF adds 5 points and BLT 3, so the report's differences are
    known."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, *, method, epsilon, seed, data, **kw):
        self.calls.append({"method": method, "epsilon": epsilon, "seed": seed, **kw})
        base = {"nonprivate": 0.9, "public": 0.5, "dpsgd": 0.3, "fdp_dpsgd": 0.4, "fdp": 0.6}[method]
        noise = kw.get("noise", "independent")
        acc = base + 0.01 * (epsilon or 0) + 0.01 * seed + {"bandmf": 0.05, "blt": 0.03}.get(noise, 0.0)
        private = epsilon is not None
        return {"accuracy": acc, "epsilon": epsilon, "delta": kw.get("delta"),
                "noise_multiplier": 1.0 if private else None, "max_grad_norm": 1.0, "sampling_rate": 0.1,
                "batch_size": 10, "steps": 7, "pretrain_steps": 0, "stopped_early": False, "guarantee": "g",
                **({"noise": noise, "bands": kw.get("bands", 4) if noise == "bandmf" else None} if private else {})}


def _cfg(tmp_path, opts, **kw) -> GridConfig:
    kw = {"methods": ["nonprivate", "dpsgd", "fdp"], "epsilons": [1, 4], "seeds": [0, 1], "progress": False, **kw}
    return GridConfig(dataset="csv", out=tmp_path / "out", dataset_options=opts, **kw)


def test_each_private_method_gets_one_arm_per_noise_and_the_references_run_once(tmp_path, tiny_csv) -> None:
    cfg = _cfg(tmp_path, tiny_csv, noises=["bandmf", "independent"], bands=4)
    cells = grid_cells(cfg)
    assert cfg.noises == ["independent", "bandmf"]  # one order, whatever the order given
    assert sum(c.method == "nonprivate" for c in cells) == 2  # once per seed, not per noise
    assert {(c.method, c.noise) for c in cells} == {("nonprivate", "independent"), ("dpsgd", "independent"),
                                                    ("dpsgd", "bandmf"), ("fdp", "independent"), ("fdp", "bandmf")}
    assert len(cells) == 2 * (1 + 2 * 2 * 2)
    keys = {c.key for c in cells}
    assert "dpsgd__eps1__seed0" in keys and "dpsgd__bandmf__eps1__seed0" in keys

    fake = NoiseAwareTrainer()
    result = run_grid(cfg, trainer_fn=fake)
    # only the BandMF cells are trained with noise='bandmf' (and the grid's bands); independent cells get neither
    bandmf_calls = [c for c in fake.calls if c.get("noise") == "bandmf"]
    assert len(bandmf_calls) == 8 and all(c["bands"] == 4 for c in bandmf_calls)
    assert all("noise" not in c and "bands" not in c for c in fake.calls if c not in bandmf_calls)

    df = pd.read_csv(cfg.out / "results.csv")
    assert list(df.columns[-2:]) == ["noise", "bands"]
    assert sorted(df.loc[df.method == "dpsgd", "noise"].value_counts().items()) == [("bandmf", 4), ("independent", 4)]
    assert df.loc[df.method == "nonprivate", "noise"].isna().all()
    assert (df.loc[df.noise == "bandmf", "bands"] == 4).all()
    # each cell's file holds its noise and its Trainer arguments
    for path in (cfg.out / "cells").glob("*.json"):
        row = json.loads(path.read_text())["row"]
        params = json.loads(row["params"])
        if "__bandmf__" in path.name:
            assert row["noise"] == "bandmf" and params["noise"] == "bandmf" and params["bands"] == 4
        else:
            assert row["noise"] in (None, "independent") and "noise" not in params

    md = (cfg.out / "summary.md").read_text()
    assert "| DP-SGD | 31.5 ± 0.7 | 34.5 ± 0.7 |" in md
    assert "| DP-SGD + BandMF | 36.5 ± 0.7 | 39.5 ± 0.7 |" in md
    assert "| FDP (Alg. 1) + BandMF | 66.5 ± 0.7 | 69.5 ± 0.7 |" in md
    assert md.count("| non-private (ε = ∞) |") == 1
    assert "## BandMF − independent noise" in md and "* ε = 1: DP-SGD +5.0; FDP (Alg. 1) +5.0 points" in md
    assert "FDP − DP-SGD = +30.0" in md and "FDP − DP-SGD (both + BandMF) = +30.0" in md
    assert "| DP-SGD + BandMF (b = 4) | 1 |" in md and "b = 4 in every BandMF cell" in md
    summary = {(s["method"], s["noise"], s["target_epsilon"]): s for s in result["summary"]}
    assert summary[("dpsgd", "bandmf", 4.0)]["bands"] == [4] and summary[("dpsgd", "independent", 4.0)]["n"] == 2
    assert summary[("nonprivate", None, None)]["n"] == 2

    again = NoiseAwareTrainer()
    run_grid(cfg, trainer_fn=again)
    assert again.calls == []  # every cell, of both noises, reused


def test_blt_is_a_third_arm_that_never_gets_bandmfs_bands(tmp_path, tiny_csv) -> None:
    # The grid's bands are BandMF's: a BLT cell given them would be refused by the engine, so they must reach the
    # BandMF cells only, while the BLT cells are named, stored, summarised and reported as their own arm.
    cfg = _cfg(tmp_path, tiny_csv, noises=["blt", "independent", "bandmf"], bands=4)
    assert cfg.noises == ["independent", "bandmf", "blt"]
    cells = grid_cells(cfg)
    assert len(cells) == 2 * (1 + 2 * 3 * 2) and "fdp__blt__eps4__seed1" in {c.key for c in cells}
    fake = NoiseAwareTrainer()
    result = run_grid(cfg, trainer_fn=fake)
    blt_calls = [c for c in fake.calls if c.get("noise") == "blt"]
    assert len(blt_calls) == 8 and all("bands" not in c for c in blt_calls)
    assert all(c["bands"] == 4 for c in fake.calls if c.get("noise") == "bandmf")

    df = pd.read_csv(cfg.out / "results.csv")
    assert sorted(df.loc[df.method == "fdp", "noise"].value_counts().items()) == [
        ("bandmf", 4), ("blt", 4), ("independent", 4)]
    assert df.loc[df.noise == "blt", "bands"].isna().all()
    for path in (cfg.out / "cells").glob("*__blt__*.json"):
        row = json.loads(path.read_text())["row"]
        assert row["noise"] == "blt" and json.loads(row["params"]).get("noise") == "blt"
        assert "bands" not in json.loads(row["params"])

    md = (cfg.out / "summary.md").read_text()
    assert "| DP-SGD + BLT | 34.5 ± 0.7 | 37.5 ± 0.7 |" in md
    assert md.index("| DP-SGD + BandMF |") < md.index("| DP-SGD + BLT |") < md.index("| FDP (Alg. 1) |")
    assert "## BLT − independent noise" in md and "* ε = 1: DP-SGD +3.0; FDP (Alg. 1) +3.0 points" in md
    assert "FDP − DP-SGD (both + BLT) = +30.0" in md
    assert "| DP-SGD + BLT | 1 |" in md  # no "(b = ...)": BLT has no bands
    assert "BLT: d <= 4 buffers optimised for the run's workload, one Gaussian at the min-sep sensitivity, no " \
           "amplification: featuredp.noise.blt" in md
    assert "b = 4 in every BandMF cell" in md
    summary = {(s["method"], s["noise"], s["target_epsilon"]): s for s in result["summary"]}
    assert summary[("dpsgd", "blt", 4.0)]["bands"] is None and summary[("dpsgd", "blt", 4.0)]["n"] == 2
    assert [s["noise"] for s in result["summary"] if s["method"] == "dpsgd"] == [
        "independent", "independent", "bandmf", "bandmf", "blt", "blt"]

    again = NoiseAwareTrainer()
    run_grid(cfg, trainer_fn=again)
    assert again.calls == []


def test_the_plot_draws_a_line_per_arm(tmp_path, monkeypatch) -> None:
    from matplotlib.axes import Axes

    styles: dict[str, tuple[str, str]] = {}
    real_errorbar = Axes.errorbar

    def recording(self, *args, **kw):
        styles[kw["label"]] = (kw["linestyle"], kw["markerfacecolor"])
        return real_errorbar(self, *args, **kw)

    monkeypatch.setattr(Axes, "errorbar", recording)
    rows = [{"method": m, "target_epsilon": e, "accuracy": a, "noise": n}
            for m, n, a in (("dpsgd", "blt", 0.35), ("dpsgd", "independent", 0.3), ("dpsgd", "bandmf", 0.4))
            for e in (1.0, 4.0)] + [{"method": "public", "target_epsilon": None, "accuracy": 0.5, "noise": None}]
    drawn = privacy_utility_plot(rows, tmp_path / "p.png")
    # one line per arm, in the report's order (independent, BandMF, BLT), whatever the rows' order
    assert list(drawn["lines"]) == ["dpsgd", "dpsgd+bandmf", "dpsgd+blt"]
    assert drawn["lines"]["dpsgd+bandmf"][1] == [40.0, 40.0] and drawn["lines"]["dpsgd+blt"][1] == [35.0, 35.0]
    # the two correlated arms share DP-SGD's colour: each needs a line style of its own, hollow markers both
    assert list(styles) == ["DP-SGD", "DP-SGD + BandMF", "DP-SGD + BLT"]
    assert len({style for style, _ in styles.values()}) == 3
    assert styles["DP-SGD + BandMF"][1] == styles["DP-SGD + BLT"][1] == "none"
    assert arm_label("dpsgd", "bandmf") == "DP-SGD + BandMF" and arm_label("dpsgd", "independent") == "DP-SGD"
    assert arm_label("dpsgd", "blt") == "DP-SGD + BLT"
    # rows written before noises were recorded: private ones used independent noise, references none
    assert row_noise({"method": "fdp"}) == "independent" and row_noise({"method": "public", "noise": "x"}) is None


def test_independent_noise_keeps_the_grids_and_cells_of_before(tmp_path, tiny_csv) -> None:
    # A grid of independent noise only: the same grid.json, cell names and hashes as before noises existed, so
    # committed results stay loadable; adding the BandMF arm later reuses every independent cell.
    plain = GridRunner(_cfg(tmp_path, tiny_csv))
    assert "noises" not in plain.grid_config() and "bands" not in plain.grid_config()
    cell = grid_cells(plain.cfg)[1]
    assert cell.key == "dpsgd__eps1__seed0" and "noise" not in plain.cell_config(cell)["params"]
    fake = NoiseAwareTrainer()
    run_grid(plain.cfg, trainer_fn=fake)
    assert list(pd.read_csv(plain.cfg.out / "results.csv").columns)[-2:] == ["tuned", "params"]
    more = NoiseAwareTrainer()
    run_grid(_cfg(tmp_path, tiny_csv, noises=["independent", "bandmf"], overwrite=True), trainer_fn=more)
    assert len(more.calls) == 8 and all(c["noise"] == "bandmf" and "bands" not in c for c in more.calls)


def test_tuning_tunes_each_noise_arm_alike_with_its_own_noise(tmp_path, tiny_csv) -> None:
    cfg = _cfg(tmp_path, tiny_csv, methods=["dpsgd"], epsilons=[2], seeds=[0], tune=True,
               noises=["independent", "bandmf"])  # fmt: skip
    fake = NoiseAwareTrainer()
    run_grid(cfg, trainer_fn=fake)
    tuning = sorted(p.name.split("__eps")[0] for p in (cfg.out / "tuning").glob("*.json"))
    assert tuning == ["dpsgd", "dpsgd__bandmf"]
    n_candidates = 3  # the default preset's DP-SGD grid: lr ∈ {0.2, 0.5, 1.0}
    assert sum(c.get("noise") == "bandmf" for c in fake.calls) == n_candidates + 1  # its candidates, then its cell
    assert sum("noise" not in c for c in fake.calls) == n_candidates + 1
    stored = json.loads(next((cfg.out / "tuning").glob("dpsgd__bandmf__*.json")).read_text())
    assert stored["noise"] == "bandmf" and len(stored["trials"]) == n_candidates
    again = NoiseAwareTrainer()
    run_grid(cfg, trainer_fn=again)
    assert again.calls == []  # the tuning of both arms and their cells reused


@pytest.mark.parametrize(("kw", "message"), [
    ({"noises": ["ftrl"]}, "noises must be one of"),
    ({"noises": []}, "noises must name at least one"),
    ({"bands": 4}, "bands is for noises with bandmf"),
    ({"noises": ["blt"], "bands": 4}, "bands is for noises with bandmf"),
    ({"noises": ["bandmf"], "bands": 0}, "bands must be >= 1"),
    *[(kw, message) for kind in ("bandmf", "blt") for kw, message in (
        ({"noises": [kind], "methods": ["nonprivate", "public"]}, rf"noises=\['{kind}'\] is for the private methods"),
        ({"noises": [kind], "protocol": "paper", "epsilons": [4]}, f"noises with {kind} does not combine with "
                                                                   "protocol='paper'"),
    )],
])  # fmt: skip
def test_bad_noise_settings_are_refused(tmp_path, kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        GridConfig(dataset="csv", out=tmp_path / "o", **kw)


@pytest.mark.filterwarnings("ignore::featuredp.errors.PrivacyLeakWarning")  # the tiny CSV has no schema
@pytest.mark.parametrize(("kind", "kw", "bands", "says"), [
    ("bandmf", {"bands": 2}, 2, "with 2 bands"),
    ("blt", {}, None, "one Gaussian release at the min-sep sensitivity (no amplification)"),
])  # fmt: skip
def test_a_real_correlated_cell_plans_its_noise_and_says_so_in_its_guarantee(tmp_path, tiny_csv, kind, kw, bands,
                                                                             says) -> None:
    # The engine, not a fake: each cell's plan as read back from its file (row and guarantee) has its noise.
    cfg = _cfg(tmp_path, tiny_csv, methods=["dpsgd"], epsilons=[8], seeds=[0], quick=True,
               noises=["independent", kind], **kw)  # fmt: skip
    run_grid(cfg)
    cells = {p.name.split("__eps")[0]: json.loads(p.read_text()) for p in (cfg.out / "cells").glob("*.json")}
    assert set(cells) == {"dpsgd", f"dpsgd__{kind}"}
    correlated, plain = cells[f"dpsgd__{kind}"], cells["dpsgd"]
    assert correlated["row"]["noise"] == kind and correlated["row"]["bands"] == bands
    assert f"noise {kind}" in correlated["guarantee"] and says in correlated["guarantee"]
    assert plain["row"]["noise"] == "independent" and plain["row"]["bands"] is None
    assert kind not in plain["guarantee"]
    for cell in cells.values():
        assert cell["row"]["epsilon"] <= 8.0
