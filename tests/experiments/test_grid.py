"""Grid runner: cells, resumability, atomic cells, results files, tuning on validation only."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch

from featuredp.experiments import GridConfig, GridRunner, grid_cells, run_grid, summarize


class FakeTrainer:
    """Stands in for train_tabular: accuracy is a known function of (method, ε, seed, params)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[dict] = []
        self.fail_on = fail_on

    def __call__(self, *, method, epsilon, seed, data, **kw):
        self.calls.append({"method": method, "epsilon": epsilon, "seed": seed, "data": data, **kw})
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise KeyboardInterrupt  # an interrupted cell
        base = {"nonprivate": 0.9, "public": 0.5, "dpsgd": 0.3, "fdp_dpsgd": 0.4, "fdp": 0.6}[method]
        acc = base + (0.01 * epsilon if epsilon else 0.0) + 0.01 * seed + 0.001 * kw.get("lr", 0)
        return {"accuracy": acc, "epsilon": epsilon if epsilon else None, "delta": kw.get("delta"),
                "noise_multiplier": 1.0 if epsilon else None, "max_grad_norm": 1.0, "sampling_rate": 0.1,
                "batch_size": 10, "steps": 7, "pretrain_steps": 0, "stopped_early": False, "guarantee": "g"}


def _cfg(tmp_path, opts, **kw) -> GridConfig:
    kw = {"epsilons": [1, 4], "seeds": [0, 1], "progress": False, **kw}
    return GridConfig(dataset="csv", out=tmp_path / "out", dataset_options=opts, **kw)


def test_grid_cells_references_once_per_seed(tmp_path, tiny_csv) -> None:
    cells = grid_cells(_cfg(tmp_path, tiny_csv))
    assert len(cells) == 2 * (2 + 3 * 2)
    assert sum(c.epsilon is None for c in cells) == 4
    with pytest.raises(ValueError, match="methods must be one of"):
        GridConfig(dataset="csv", out=tmp_path, methods=["sgd"])
    with pytest.raises(ValueError, match="epsilons must be > 0"):
        GridConfig(dataset="csv", out=tmp_path, epsilons=[0])


def test_results_files_and_resume(tmp_path, tiny_csv) -> None:
    fake = FakeTrainer()
    cfg = _cfg(tmp_path, tiny_csv)
    run_grid(cfg, trainer_fn=fake)
    assert len(fake.calls) == 16
    df = pd.read_csv(cfg.out / "results.csv")
    assert len(df) == 16 and set(df["method"]) == {"nonprivate", "public", "dpsgd", "fdp_dpsgd", "fdp"}
    fdp4 = df[(df.method == "fdp") & (df.target_epsilon == 4)]
    assert sorted(fdp4.seed) == [0, 1] and np.allclose(sorted(fdp4.accuracy), [0.64, 0.65], atol=1e-3)
    md = (cfg.out / "summary.md").read_text()
    assert "| FDP (Alg. 1) | 61.5 ± 0.7 | 64.5 ± 0.7 |" in md
    assert f"{torch.get_num_threads()} torch thread(s) per run" in md  # CPU time reads differently with more
    assert re.search(r"ε = 4: FDP − DP-SGD = \+(29\.9|30\.0)", md)
    assert (cfg.out / "privacy_utility.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    again = FakeTrainer()
    run_grid(_cfg(tmp_path, tiny_csv), trainer_fn=again)
    assert again.calls == []  # every cell reused

    (cell,) = (cfg.out / "cells").glob("dpsgd__eps1__seed1__*.json")
    cell.unlink()
    changed = FakeTrainer()
    run_grid(_cfg(tmp_path, tiny_csv, method_params={"public": {"lr": 0.3}}, overwrite=True), trainer_fn=changed)
    redone = sorted((c["method"], c["epsilon"], c["seed"]) for c in changed.calls)
    assert redone == [("dpsgd", 1.0, 1), ("public", None, 0), ("public", None, 1)]


def test_interrupted_cell_leaves_no_result(tmp_path, tiny_csv) -> None:
    cfg = _cfg(tmp_path, tiny_csv)
    with pytest.raises(KeyboardInterrupt):
        run_grid(cfg, trainer_fn=FakeTrainer(fail_on=3))
    files = sorted(p.name for p in (cfg.out / "cells").iterdir())
    assert len(files) == 2 and all(f.endswith(".json") and not f.startswith(".") for f in files)
    assert len(pd.read_csv(cfg.out / "results.csv")) == 2  # the finished cells are on record already
    rest = FakeTrainer()
    run_grid(_cfg(tmp_path, tiny_csv), trainer_fn=rest)
    assert len(rest.calls) == 14


def test_tuning_uses_a_validation_split_of_train_never_test(tmp_path, tiny_csv) -> None:
    fake = FakeTrainer()
    cfg = _cfg(tmp_path, tiny_csv, tune=True, methods=["dpsgd"], epsilons=[2])
    runner = GridRunner(cfg, trainer_fn=fake)
    runner.preset["tune"] = {"dpsgd": {"lr": [0.1, 5.0, 1.0]}}
    runner.run()
    train, test = runner.data
    tuning = [c for c in fake.calls if c["data"][1].name == "validation"]
    final = [c for c in fake.calls if c["data"][1] is test]
    assert len(tuning) == 3 and len(final) == 2
    for c in tuning:
        sub, val = c["data"]
        assert sub.n + val.n == train.n and val.n == round(0.2 * train.n)
        assert c["data"][1] is not test and c["seed"] == 0
    assert all(c["lr"] == 5.0 for c in final)  # the best validation accuracy wins
    md = (cfg.out / "summary.md").read_text()
    assert "Tuning is not accounted for" in md
    assert "Tuned alike: each private method (DP-SGD) got the same budget of 3 candidates" in md
    (path,) = (cfg.out / "tuning").glob("dpsgd__eps2__*.json")
    stored = json.loads(path.read_text())
    assert stored["best"] == {"lr": 5.0} and len(stored["trials"]) == 3


def test_summarize_mean_std() -> None:
    rows = [{"method": "fdp", "target_epsilon": 2.0, "accuracy": a, "epsilon": 1.99, "noise_multiplier": 1.0,
             "steps": 5, "wall_s": 1.0} for a in (0.5, 0.7)]
    (s,) = summarize(rows)
    assert s["n"] == 2 and s["accuracy_mean"] == pytest.approx(0.6) and s["accuracy_std"] == pytest.approx(0.1414, 1e-3)


def test_real_engine_on_a_tiny_table(tmp_path, tiny_csv) -> None:
    """End to end through the engine: ε spent never above the target; FDP/DP rows carry σ and steps."""
    params = {m: {"epochs": 1, "batch_size": 32} for m in ("nonprivate", "public", "dpsgd", "fdp_dpsgd", "fdp")}
    params["fdp"].update(public_batch_size=32, pretrain_epochs=1)
    params["fdp_dpsgd"].update(pretrain_epochs=1)
    cfg = GridConfig(dataset="csv", out=tmp_path / "real", epsilons=[2.0], seeds=[0], dataset_options=tiny_csv,
                     method_params=params, progress=False)
    run_grid(cfg)
    df = pd.read_csv(cfg.out / "results.csv")
    private = df[df.method.isin(["dpsgd", "fdp_dpsgd", "fdp"])]
    assert len(df) == 5 and (private.epsilon <= 2.0 + 1e-9).all() and (private.epsilon > 1.5).all()
    assert (private.noise_multiplier > 0).all() and (private.steps > 0).all()
    assert df.loc[df.method == "public", "epsilon"].item() == 0.0
    assert df.accuracy.between(0, 1).all()
    # the replace-one ε (two values of one record's private part) beside ε: larger, for the same runs
    assert (private.replacement_epsilon > private.epsilon * 1.1).all()
    assert df.loc[df.method == "public", "replacement_epsilon"].item() == 0.0
    summary_md = (cfg.out / "summary.md").read_text()
    assert "replacement ε" in summary_md and "telling two values of one record's private part apart" in summary_md


def test_report_only_summarises_finished_cells_and_trains_nothing(tmp_path, tiny_csv) -> None:
    cfg = _cfg(tmp_path, tiny_csv)
    with pytest.raises(KeyboardInterrupt):
        run_grid(cfg, trainer_fn=FakeTrainer(fail_on=4))
    idle = FakeTrainer()
    out = run_grid(_cfg(tmp_path, tiny_csv, report_only=True), trainer_fn=idle)
    assert idle.calls == [] and out["meta"]["cells_missing"] == 13
    assert len(pd.read_csv(cfg.out / "results.csv")) == 3
    assert "13 cells of the grid are not finished yet" in (cfg.out / "summary.md").read_text()


# ---------------------------------------------------------------------------------------------------------
# Issue 17: nothing lost (cells keyed by settings, another grid's results refused), progress on stderr
# ---------------------------------------------------------------------------------------------------------
def test_a_quick_grid_never_overwrites_a_full_one(tmp_path, tiny_csv) -> None:
    full = _cfg(tmp_path, tiny_csv)
    run_grid(full, trainer_fn=FakeTrainer())
    outputs = {name: (full.out / name).read_bytes() for name in ("results.csv", "summary.md", "privacy_utility.png")}
    cells = {p.name: p.read_bytes() for p in (full.out / "cells").iterdir()}

    quick = FakeTrainer()
    with pytest.raises(ValueError, match=r"different grid \(quick false → true.*--overwrite"):
        run_grid(_cfg(tmp_path, tiny_csv, quick=True), trainer_fn=quick)
    assert quick.calls == []  # refused before any work
    assert {name: (full.out / name).read_bytes() for name in outputs} == outputs

    # On a user's table --quick trains exactly what the full grid trains (train's fitted schedule, issue 42), so the
    # cells it shares with the full grid (the same ε and seeds: all of them here) are reused, not retrained.
    run_grid(_cfg(tmp_path, tiny_csv, quick=True, overwrite=True), trainer_fn=quick)
    assert quick.calls == []
    # Another ε: its own cells (the references, trained alike, are shared); the full grid's are never overwritten.
    run_grid(_cfg(tmp_path, tiny_csv, quick=True, overwrite=True, epsilons=[2]), trainer_fn=quick)
    assert len(quick.calls) == 2 * 3  # seeds × private methods
    after = {p.name: p.read_bytes() for p in (full.out / "cells").iterdir()}
    assert len(after) == 16 + 6 and all(after[name] == data for name, data in cells.items())  # none overwritten
    assert (full.out / "results.csv").read_bytes() != outputs["results.csv"]

    again = FakeTrainer()  # the full grid comes back from its cells, training nothing
    run_grid(_cfg(tmp_path, tiny_csv, overwrite=True), trainer_fn=again)
    assert again.calls == [] and (full.out / "results.csv").read_bytes() == outputs["results.csv"]


def test_the_same_grid_resumes_without_overwrite(tmp_path, tiny_csv) -> None:
    with pytest.raises(KeyboardInterrupt):
        run_grid(_cfg(tmp_path, tiny_csv), trainer_fn=FakeTrainer(fail_on=5))
    rest = FakeTrainer()
    run_grid(_cfg(tmp_path, tiny_csv), trainer_fn=rest)
    assert len(rest.calls) == 12
    assert json.loads((tmp_path / "out" / "grid.json").read_text())["config"]["epsilons"] == [1.0, 4.0]


def test_an_earlier_versions_folder_of_another_grid_is_refused(tmp_path, tiny_csv) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pd.DataFrame({"dataset": ["csv"], "method": ["fdp"], "target_epsilon": [8.0], "seed": [0]}).to_csv(
        out / "results.csv", index=False)
    with pytest.raises(ValueError, match="different grid"):
        run_grid(_cfg(tmp_path, tiny_csv), trainer_fn=FakeTrainer())
    pd.DataFrame({"dataset": ["csv"], "method": ["fdp"], "target_epsilon": [4.0], "seed": [1]}).to_csv(
        out / "results.csv", index=False)
    run_grid(_cfg(tmp_path, tiny_csv), trainer_fn=FakeTrainer())  # its rows are cells of this grid: resumed


def test_out_naming_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="out must be a folder"):
        GridConfig(dataset="csv", out=tmp_path / "f")
    with pytest.raises(ValueError, match="is a file"):
        GridConfig(dataset="csv", out=tmp_path / "f" / "sub")


def test_progress_says_cell_i_of_n_method_epsilon_seed_and_eta(tmp_path, tiny_csv, capsys) -> None:
    run_grid(_cfg(tmp_path, tiny_csv, methods=["dpsgd", "fdp"], progress=True), trainer_fn=FakeTrainer())
    err = capsys.readouterr().err.splitlines()
    cells = [line for line in err if ": cell " in line]
    assert len(cells) == 8
    assert cells[0] == "compare csv: cell 1 of 8: dpsgd, ε = 1, seed 0 (ETA after the first cell)"
    assert re.fullmatch(r"compare csv: cell 8 of 8: fdp, ε = 4, seed 1 \(ETA \d+ s for 1 cell\)", cells[-1])
    run_grid(_cfg(tmp_path, tiny_csv, methods=["dpsgd", "fdp"], progress=True), trainer_fn=FakeTrainer())
    assert "8 finished earlier (reused), 0 to run" in capsys.readouterr().err
    run_grid(_cfg(tmp_path, tiny_csv, methods=["dpsgd", "fdp"]), trainer_fn=FakeTrainer())
    assert capsys.readouterr().err == ""


def test_threads_note_reads_the_cells() -> None:
    # CPU seconds mean little without the thread count the cells were trained with (a --report-only
    # rewrite runs with its own, possibly different, setting); cells that predate the field say nothing.
    from featuredp.experiments.grid_report import _threads_note

    assert _threads_note([{"cpu_s": 1.0}]) == ""
    assert _threads_note([{"torch_threads": 2}, {"torch_threads": 2}]) == "; 2 torch thread(s) per run"
    assert _threads_note([{"torch_threads": 1}, {"torch_threads": 2}]) == "; 1–2 torch thread(s) per run"


def test_a_file_changed_at_the_same_path_is_recomputed_never_mixed(tmp_path, tiny_csv) -> None:
    # The stale-compare attack of issue 24: the cells were keyed by the path and the settings, so after the
    # CSV changed in place the old accuracies came back next to the new data.
    run_grid(_cfg(tmp_path, tiny_csv), trainer_fn=FakeTrainer())
    df = pd.read_csv(tiny_csv["path"])
    df.loc[:40, "label"] = "hi"  # the same path, other contents
    df.to_csv(tiny_csv["path"], index=False)
    again = FakeTrainer()
    run_grid(_cfg(tmp_path, tiny_csv, overwrite=True), trainer_fn=again)
    assert len(again.calls) == 16  # every cell recomputed on the new contents
    unchanged = FakeTrainer()
    run_grid(_cfg(tmp_path, tiny_csv), trainer_fn=unchanged)
    assert unchanged.calls == []  # and reused while the contents stay the same


def test_the_cache_key_reveals_no_plain_hash_of_the_data(tmp_path, tiny_csv) -> None:
    import hashlib
    import os

    from featuredp.batches import as_batch
    from featuredp.experiments.data_key import data_key
    from featuredp.experiments.runs import private_root
    from featuredp.run_state import data_fingerprint

    runner = GridRunner(_cfg(tmp_path, tiny_csv))
    train, test = runner.data
    plain = {data_fingerprint(as_batch(train)), hashlib.sha256(data_fingerprint(as_batch(train)).encode()).hexdigest()}
    key = data_key(train, test)
    assert all(key not in p for p in plain)  # an HMAC under a private key, not a hash anyone could recompute
    secret = private_root() / "cache-key"
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == 32
    assert data_key(train, test) == key  # stable on this machine
    os.remove(secret)
    assert data_key(train, test) != key  # a new key: old caches are recomputed, never wrongly reused


def test_one_seed_tables_show_no_spread(tmp_path, tiny_csv) -> None:
    cfg = _cfg(tmp_path, tiny_csv, seeds=[0])
    run_grid(cfg, trainer_fn=FakeTrainer())
    md = (cfg.out / "summary.md").read_text()
    assert "± 0.0" not in md and "one seed (no spread" in md
    assert "| FDP (Alg. 1) | 61.0 | 64.0 |" in md


def test_summary_states_the_majority_class_reference(tmp_path, tiny_csv) -> None:
    cfg = _cfg(tmp_path, tiny_csv, seeds=[0])
    out = run_grid(cfg, trainer_fn=FakeTrainer())
    test = GridRunner(cfg).data[1]
    share = np.bincount(test.y).max() / test.n
    assert out["meta"]["majority"] == pytest.approx(share)
    assert f"Majority class of the test set: {100 * share:.1f}%" in (cfg.out / "summary.md").read_text()


def test_a_grid_on_a_users_table_fits_the_schedule_to_its_size(tmp_path, tiny_csv) -> None:
    """Adult's 3 epochs of batches of 512 gave a 400-row table a single private step per epoch (or refused it)."""
    from featuredp.experiments.presets import fitted_schedule

    runner = GridRunner(_cfg(tmp_path, tiny_csv))
    n = runner.data[0].n
    fdp = runner.params_for("fdp", 1.0)
    assert {k: fdp[k] for k in ("batch_size", "epochs", "public_batch_size")} == fitted_schedule(n, "fdp")
    assert fdp["batch_size"] < n // 2 and fdp["epochs"] > 3  # hundreds of private steps, not a handful
    mine = GridRunner(_cfg(tmp_path, tiny_csv, method_params={"dpsgd": {"batch_size": 64}}))
    assert mine.params_for("dpsgd", 1.0)["batch_size"] == 64  # what the user sets wins
    assert mine.params_for("dpsgd", 1.0)["epochs"] == fitted_schedule(n, "dpsgd")["epochs"]


def test_compare_relation_replace_one_calibrates_for_the_replacement_question(tmp_path, tiny_csv, capsys) -> None:
    """`compare --relation replace-one`: each private cell's σ meets the target at replace-one, so its printed ε is
    the replacement ε; add/remove (the default) reports both, the replacement one larger."""
    from featuredp.cli import main

    base = ["compare", "--dataset", "csv", "--dataset-path", tiny_csv["path"], "--label", tiny_csv["label"],
            "--private", ",".join(tiny_csv["private"]), "--methods", "fdp", "--epsilons", "2", "--seeds", "1",
            "--quick", "--quiet", "--json"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "rep"), "--relation", "replace-one"]) == 0
    capsys.readouterr()
    rep = pd.read_csv(tmp_path / "rep" / "results.csv")
    assert main([*base, "--out", str(tmp_path / "ar")]) == 0
    ar = pd.read_csv(tmp_path / "ar" / "results.csv")
    r, a = rep[rep.method == "fdp"].iloc[0], ar[ar.method == "fdp"].iloc[0]
    assert r.replacement_epsilon == pytest.approx(r.epsilon) and r.epsilon <= 2.0 + 1e-9
    assert a.replacement_epsilon > a.epsilon and a.epsilon <= 2.0 + 1e-9
    assert r.noise_multiplier > a.noise_multiplier  # the replacement question costs more noise
    # other tasks, and the paper protocol (steps from the add/remove accountant), refuse it with one line
    assert main(["compare", "--task", "text", "--relation", "replace-one", "--out", str(tmp_path / "t")]) == 2
    assert main([*base, "--out", str(tmp_path / "p"), "--relation", "replace-one", "--protocol", "paper"]) == 2


@pytest.mark.parametrize("private", [None, ["s", "label"]], ids=["features-private", "label-private"])
def test_a_grid_on_a_users_table_uses_trains_parameters_with_and_without_quick(tmp_path, tiny_csv, private) -> None:
    """Issue 42: `--quick` capped the fitted schedule at 2 epochs (DP-SGD: 88 steps where `train` runs about 600),
    so its accuracies were not what `train` gives on the table. The grid now asks train's own function."""
    from featuredp.experiments.grid import METHODS
    from featuredp.experiments.train_one import resolved_params

    n = GridRunner(_cfg(tmp_path, tiny_csv)).data[0].n
    full = GridRunner(_cfg(tmp_path, tiny_csv, private=private))
    quick = GridRunner(_cfg(tmp_path, tiny_csv, private=private, quick=True))
    for method in METHODS:
        trains = resolved_params(method, "csv", n, {}, label_dp=private is not None)
        assert full.params_for(method, 2.0) == trains, method
        assert quick.params_for(method, 2.0) == trains, method
    assert quick.params_for("dpsgd", 2.0)["epochs"] > 2  # before: min(fitted, 2)
    assert quick.params_for("fdp", 2.0)["pretrain_epochs"] == (0 if private else 3)  # before: capped at 2
