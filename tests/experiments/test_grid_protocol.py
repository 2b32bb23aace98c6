"""Issue 25: `featuredp compare --protocol paper` (σ = 1, sampling rate 1/16, ε reached by the number of steps)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from featuredp.accounting import calibrate_steps
from featuredp.cli import main
from featuredp.experiments import GridConfig, GridRunner, run_grid

PRIVATE = ("dpsgd", "fdp_dpsgd", "fdp")


class FakeTrainer:
    """Stands in for train_cell: records its arguments and reports the σ, q and steps it was given."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, *, method, epsilon, seed, data, **kw):
        self.calls.append({"method": method, "epsilon": epsilon, "seed": seed, "data": data, **kw})
        acc = {"nonprivate": 0.9, "public": 0.5, "dpsgd": 0.3, "fdp_dpsgd": 0.4, "fdp": 0.6}[method]
        return {"accuracy": acc + 0.001 * kw.get("lr", 0), "epsilon": epsilon, "delta": kw.get("delta"),
                "noise_multiplier": kw.get("noise_multiplier"), "max_grad_norm": 1.0,
                "sampling_rate": kw.get("sampling_rate", 0.1), "batch_size": 10, "steps": kw.get("steps", 7),
                "pretrain_steps": 0, "stopped_early": False, "guarantee": "g"}


def _cfg(tmp_path, opts, **kw) -> GridConfig:
    kw = {"epsilons": [2, 4], "seeds": [0], "progress": False, **kw}
    return GridConfig(dataset="csv", out=tmp_path / "out", dataset_options=opts, **kw)


def _steps(eps: float, delta: float) -> int:
    return calibrate_steps(eps, delta, 1 / 16, 1.0, accountant="pld")


def test_paper_cells_train_at_sigma_1_rate_1_16_for_the_calibrated_steps(tmp_path, tiny_csv) -> None:
    fake = FakeTrainer()
    cfg = _cfg(tmp_path, tiny_csv, protocol="paper")
    runner = GridRunner(cfg, trainer_fn=fake)
    out = runner.run()
    default = GridRunner(_cfg(tmp_path, tiny_csv))
    assert len(fake.calls) == 2 + 3 * 2
    for call in fake.calls:
        method, eps = call["method"], call["epsilon"]
        if method in PRIVATE:
            assert call["noise_multiplier"] == 1.0 and call["sampling_rate"] == 1 / 16
            assert call["steps"] == _steps(eps, runner.delta) and call["accountant"] == "pld"
            assert "batch_size" not in call and "epochs" not in call  # q and T are the protocol's
            kept = {k: v for k, v in default.params_for(method, eps).items()
                    if k not in ("noise_multiplier", "batch_size", "epochs")}  # fmt: skip
            assert {k: call[k] for k in kept} == kept  # lr, C, α, pre-training, public batch: the method's
        else:
            assert {k: v for k, v in call.items() if k in default.params_for(method, None)} == \
                default.params_for(method, None)  # the references are unchanged
    df = pd.read_csv(cfg.out / "results.csv")
    for _, row in df[df.method.isin(PRIVATE)].iterrows():
        params = json.loads(row["params"])
        assert (params["noise_multiplier"], params["sampling_rate"]) == (1.0, 1 / 16)
        assert params["steps"] == _steps(row["target_epsilon"], runner.delta) == row["steps"]
    md = (cfg.out / "summary.md").read_text()
    assert "paper protocol: σ = 1, sampling rate 1/16, ε reached by the number of steps (PLD)" in md
    run_grid(_cfg(tmp_path / "d", tiny_csv), trainer_fn=FakeTrainer())
    assert "paper protocol" not in (tmp_path / "d" / "out" / "summary.md").read_text()
    assert out["protocol"] == out["meta"]["protocol"] == "paper"
    assert json.loads((cfg.out / "grid.json").read_text())["config"]["protocol"] == "paper"


def test_a_real_paper_cell_spends_close_to_its_target(tmp_path, tiny_csv) -> None:
    params = {"fdp": {"pretrain_epochs": 1}}
    cfg = _cfg(tmp_path, tiny_csv, methods=["dpsgd", "fdp"], epsilons=[2.0], method_params=params, protocol="paper")
    run_grid(cfg)
    df = pd.read_csv(cfg.out / "results.csv")
    assert len(df) == 2
    assert ((df.epsilon <= 2.0 + 1e-9) & (df.epsilon >= 0.85 * 2.0)).all()
    assert (df.noise_multiplier == 1.0).all() and np.allclose(df.sampling_rate, 1 / 16)
    assert (df.steps == _steps(2.0, 1e-5)).all()


def test_the_default_protocol_is_unchanged(tmp_path, tiny_csv) -> None:
    # Cells and grid.json of grids from before protocols keep their hashes: nothing is retrained or refused.
    before = GridRunner(_cfg(tmp_path, tiny_csv))
    explicit = GridRunner(_cfg(tmp_path, tiny_csv, protocol="default"))
    assert explicit.grid_config() == before.grid_config() and "protocol" not in explicit.grid_config()
    for method in ("nonprivate", *PRIVATE):
        eps = None if method == "nonprivate" else 2.0
        assert explicit.params_for(method, eps) == before.params_for(method, eps)
        assert "noise_multiplier" not in explicit.params_for(method, eps)  # σ is calibrated to ε
    cells = explicit.cfg
    fake = FakeTrainer()
    out = run_grid(cells, trainer_fn=fake)
    assert out["protocol"] == "default"
    assert all("sampling_rate" not in c and "noise_multiplier" not in c for c in fake.calls)


def test_cells_of_one_protocol_are_not_reused_by_the_other(tmp_path, tiny_csv) -> None:
    run_grid(_cfg(tmp_path, tiny_csv), trainer_fn=FakeTrainer())
    refused = FakeTrainer()
    with pytest.raises(ValueError, match=r'different grid \(protocol "default" → "paper".*--overwrite'):
        run_grid(_cfg(tmp_path, tiny_csv, protocol="paper"), trainer_fn=refused)
    assert refused.calls == []

    paper = FakeTrainer()
    run_grid(_cfg(tmp_path, tiny_csv, protocol="paper", overwrite=True), trainer_fn=paper)
    # Every private cell trains again; the references train alike under both protocols and are shared.
    assert sorted((c["method"], c["epsilon"]) for c in paper.calls) == sorted(
        (m, e) for m in PRIVATE for e in (2.0, 4.0))
    assert len(list((tmp_path / "out" / "cells").iterdir())) == 2 + 2 * 3 * 2

    with pytest.raises(ValueError, match=r'protocol "paper" → "default"'):
        run_grid(_cfg(tmp_path, tiny_csv), trainer_fn=FakeTrainer())
    for protocol in ("default", "paper"):  # both grids come back from their own cells
        again = FakeTrainer()
        run_grid(_cfg(tmp_path, tiny_csv, protocol=protocol, overwrite=True), trainer_fn=again)
        assert again.calls == []
        rows = pd.read_csv(tmp_path / "out" / "results.csv")
        sigma = rows[rows.method.isin(PRIVATE)].noise_multiplier
        assert (sigma == 1.0).all() if protocol == "paper" else sigma.isna().all()


def test_tuning_under_the_paper_protocol_keeps_sigma_rate_and_steps(tmp_path, tiny_csv) -> None:
    fake = FakeTrainer()
    cfg = _cfg(tmp_path, tiny_csv, protocol="paper", tune=True, methods=["dpsgd"], epsilons=[4])
    runner = GridRunner(cfg, trainer_fn=fake)
    runner.preset["tune"] = {"dpsgd": {"lr": [0.1, 5.0]}}
    runner.run()
    assert len(fake.calls) == 3
    for call in fake.calls:
        assert (call["noise_multiplier"], call["sampling_rate"], call["steps"]) == (1.0, 1 / 16, _steps(4, 1e-5))
    assert fake.calls[-1]["lr"] == 5.0  # tuning still picks the learning rate


def test_unreachable_or_too_long_targets_are_refused_before_any_work(tmp_path, tiny_csv) -> None:
    fake = FakeTrainer()
    with pytest.raises(ValueError, match=r"^protocol='paper' cannot reach epsilons=1: one step .* ε = 1\.23"):
        run_grid(_cfg(tmp_path, tiny_csv, protocol="paper", epsilons=[1, 4]), trainer_fn=fake)
    too_long = r"^protocol='paper' at epsilons=40 needs \d+ steps \(\d+ epochs at sampling rate 1/16, more than 200\)"
    with pytest.raises(ValueError, match=too_long):
        run_grid(_cfg(tmp_path, tiny_csv, protocol="paper", epsilons=[4, 40]), trainer_fn=fake)
    assert fake.calls == [] and not (tmp_path / "out").exists()
    # Only the private methods depend on ε: a grid of references alone runs at any ε.
    run_grid(_cfg(tmp_path, tiny_csv, protocol="paper", epsilons=[1], methods=["public"]), trainer_fn=fake)


def test_bad_protocol_values_and_conflicting_parameters_are_refused(tmp_path, tiny_csv, capsys) -> None:
    with pytest.raises(ValueError, match="protocol must be one of 'default', 'paper'; got 'papr'"):
        _cfg(tmp_path, tiny_csv, protocol="papr")
    with pytest.raises(ValueError, match=r"method_params\['dpsgd'\] sets batch_size, which protocol='paper' fixes"):
        _cfg(tmp_path, tiny_csv, protocol="paper", method_params={"dpsgd": {"batch_size": 64, "lr": 0.1}})
    _cfg(tmp_path, tiny_csv, protocol="paper", method_params={"public": {"batch_size": 64}})  # a reference: free
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--protocol", "papr", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and "--protocol: invalid choice: 'papr'" in capsys.readouterr().err
    assert main(["compare", "--task", "diffusion", "--protocol", "paper", "--out", str(tmp_path / "o")]) == 2
    assert "--protocol paper is for --task tabular, got --task diffusion" in capsys.readouterr().err
    from featuredp.cli.compare import PROTOCOLS as CLI_PROTOCOLS
    from featuredp.experiments.grid import PROTOCOLS

    assert CLI_PROTOCOLS == PROTOCOLS  # the parser's torch-free copy


def test_compare_cli_runs_the_paper_protocol(tmp_path, tiny_csv, capsys) -> None:
    out = tmp_path / "cli"
    base = ["compare", "--dataset", "csv", "--dataset-path", tiny_csv["path"], "--label", "label", "--private", "s",
            "--methods", "public,dpsgd", "--seeds", "1", "--out", str(out), "--json", "--protocol", "paper"]
    assert main([*base, "--epsilons", "1,2"]) == 2
    assert capsys.readouterr().err.strip().startswith(
        "featuredp compare: error: --protocol paper cannot reach --epsilons=1")
    assert main([*base, "--epsilons", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["protocol"] == "paper"
    (dpsgd,) = [s for s in result["summary"] if s["method"] == "dpsgd"]
    assert dpsgd["noise_multiplier"] == 1.0 and dpsgd["steps"] == _steps(2.0, 1e-5)
    assert 0.85 * 2.0 <= dpsgd["epsilon_spent"] <= 2.0
