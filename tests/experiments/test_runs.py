"""Run directories: run.json + model.pt + checkpoint.pt, safe loading, round trips."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from _fdp_synth import make_tabular
from featuredp.engine import PrivacyPlan, Trainer, evaluate
from featuredp.experiments.runs import load_checkpoint, load_run, save_checkpoint, save_run
from featuredp.features import Columns
from featuredp.models import build_model, spec_for


def _train(tmp_path):
    data = make_tabular(120, seed=0)
    spec = spec_for(data, "mlp", hidden=[4])
    model = build_model(spec, seed=1)
    trainer = Trainer(model, "fdp", feature_map=Columns(["sex", "race"]), steps=6, batch_size=12,
                      noise_multiplier=1.0, delta=1e-4, seed=0, progress=False)  # fmt: skip
    result = trainer.fit(data, checkpoint=tmp_path / "checkpoint.pt")
    save_run(tmp_path, trainer, result, model_spec=spec, metrics=evaluate(model, data),
             dataset={"name": "synthetic", "options": {"n": 120}, "private_columns": ["sex", "race"]})  # fmt: skip
    return data, trainer, result


def test_save_and_load_run_round_trip(tmp_path):
    data, trainer, result = _train(tmp_path)
    # the Trainer's spent-steps record sits beside its checkpoint (a resume from an older copy is charged)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "checkpoint.pt.spent.json", "model.pt",
                                                          "run.json"]
    run = load_run(tmp_path)
    for (k, v), (_, w) in zip(trainer.model.state_dict().items(), run.model.state_dict().items()):
        assert torch.equal(v, w), k
    assert run.plan == result.plan and isinstance(run.plan, PrivacyPlan)
    assert run.epsilon == result.epsilon
    assert run.private_columns == ["sex", "race"] and run.dataset["options"] == {"n": 120}
    assert run.metrics["accuracy"] == evaluate(trainer.model, data)["accuracy"]
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["config"]["method"] == "fdp" and info["plan"]["noise_multiplier"] == 1.0


def test_run_json_holds_no_private_runtime_state(tmp_path):
    _train(tmp_path)
    text = (tmp_path / "run.json").read_text()
    for word in ("bit_generator", "numpy_rng", "torch_rng", "perm", "indices"):
        assert word not in text


def test_checkpoint_loads_with_weights_only_and_contains_rng_state(tmp_path):
    _train(tmp_path)
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ck["step"] == 6 and ck["private_steps"] == 6
    assert ck["accountant_phases"] == [{"noise_multiplier": 1.0, "sampling_rate": 0.1, "steps": 6}]
    assert set(ck["streams"]) == {"private_sampling", "public_sampling", "noise", "private_draws",
                                  "public_draws", "init"}
    assert isinstance(ck["noise"]["torch"], torch.Tensor)
    assert set(ck["fingerprint"]) == {"data", "psi"}


def test_unsafe_checkpoint_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, path)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(path)


def test_atomic_checkpoint_write_leaves_no_temp_files(tmp_path):
    save_checkpoint(tmp_path / "a.pt", {"t": torch.ones(2)})
    assert [p.name for p in tmp_path.iterdir()] == ["a.pt"]
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        load_run(tmp_path)


# ---------------------------------------------------------------------------------------------------------
# Issue 17: a broken run directory is one error naming the file; replacing a run loses nothing
# ---------------------------------------------------------------------------------------------------------
def test_truncated_or_foreign_model_is_a_value_error_naming_it(tmp_path):
    _train(tmp_path)
    data = (tmp_path / "model.pt").read_bytes()
    for broken in (data[: len(data) // 2], b"", b"not a torch file at all"):
        (tmp_path / "model.pt").write_bytes(broken)
        with pytest.raises(ValueError, match=r"model\.pt"):
            load_run(tmp_path)


def test_broken_run_json_is_a_value_error_naming_it(tmp_path):
    _train(tmp_path)
    text = (tmp_path / "run.json").read_text()
    for broken in (text[: len(text) // 2], "[]", '{"model_spec": 3}'):
        (tmp_path / "run.json").write_text(broken)
        with pytest.raises(ValueError, match=r"run\.json"):
            load_run(tmp_path)


def test_model_of_another_spec_is_a_value_error_naming_both_files(tmp_path):
    _train(tmp_path)
    info = json.loads((tmp_path / "run.json").read_text())
    info["model_spec"]["hidden"] = [7]
    (tmp_path / "run.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"model\.pt does not fit the model spec in .*run\.json"):
        load_run(tmp_path)


def test_replacing_run_removes_the_old_files_on_success_and_restores_them_on_failure(tmp_path):
    from featuredp.experiments.runs import replacing_run, run_files

    _train(tmp_path)
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "a.md").write_text("old report")
    (tmp_path / "notes.txt").write_text("mine")  # not a run file: never touched
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(RuntimeError), replacing_run(tmp_path) as aside:
        assert aside == ["run.json", "model.pt", "checkpoint.pt", "checkpoint.pt.spent.json", "audit"]
        assert run_files(tmp_path) == []
        (tmp_path / "checkpoint.pt").write_bytes(b"half of a new run")
        raise RuntimeError("training failed")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert (tmp_path / "audit" / "a.md").read_text() == "old report"
    with replacing_run(tmp_path):
        (tmp_path / "model.pt").write_bytes(b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "notes.txt"]


# ---------------------------------------------------------------------------------------------------------
# Issue 23: the resume checkpoint lives outside the run directory, owner-only
# ---------------------------------------------------------------------------------------------------------
def test_private_checkpoint_place_is_keyed_by_the_resolved_run_path_under_the_private_root(tmp_path, monkeypatch):
    from featuredp.experiments.runs import private_checkpoint, private_root

    monkeypatch.setenv("FEATUREDP_PRIVATE_DIR", str(tmp_path / "p"))
    assert private_root() == tmp_path / "p"
    (tmp_path / "runs" / "a").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "runs")
    same = {private_checkpoint("a"), private_checkpoint("./a"), private_checkpoint(tmp_path / "runs" / "a"),
            private_checkpoint(tmp_path / "runs" / ".." / "runs" / "a")}  # fmt: skip
    assert len(same) == 1 and private_checkpoint("b") not in same
    (checkpoint,) = same
    assert checkpoint.name == "checkpoint.pt" and checkpoint.parent.parent == tmp_path / "p"
    monkeypatch.delenv("FEATUREDP_PRIVATE_DIR")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert private_root() == tmp_path / "home" / ".local" / "state" / "featuredp" / "private"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert private_root() == tmp_path / "state" / "featuredp" / "private"


def test_open_and_close_private_checkpoint_modes(tmp_path, monkeypatch):
    from featuredp.experiments.runs import close_private_checkpoint, open_private_checkpoint, private_checkpoint

    monkeypatch.setenv("FEATUREDP_PRIVATE_DIR", str(tmp_path / "p"))
    path = open_private_checkpoint(tmp_path / "run")
    assert path == private_checkpoint(tmp_path / "run") and not path.exists()
    for folder in (tmp_path / "p", path.parent):
        assert folder.stat().st_mode & 0o777 == 0o700
    assert (path.parent / "run_dir.txt").read_text().strip() == str((tmp_path / "run").resolve())
    save_checkpoint(path, {"streams": {"noise": torch.ones(2)}})
    assert path.stat().st_mode & 0o777 == 0o600
    assert close_private_checkpoint(tmp_path / "run", keep=True) == path.parent
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in path.parent.iterdir())
    assert close_private_checkpoint(tmp_path / "run") is None and not path.parent.exists()
    assert close_private_checkpoint(tmp_path / "run") is None  # nothing left: no error


def test_open_private_checkpoint_refuses_a_legacy_one_unless_accepted_then_moves_it(tmp_path, monkeypatch):
    from featuredp.errors import PrivacyRiskWarning
    from featuredp.experiments.runs import open_private_checkpoint

    monkeypatch.setenv("FEATUREDP_PRIVATE_DIR", str(tmp_path / "p"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"old state")
    open_private_checkpoint(run)  # not resuming: left alone (the CLI refuses such an --out without a flag)
    assert (run / "checkpoint.pt").exists()
    with pytest.raises(ValueError, match=r"checkpoint\.pt is a checkpoint an older featuredp left.*--accept-legacy"):
        open_private_checkpoint(run, resume=True)  # its noise keys may be known: refused by default
    assert (run / "checkpoint.pt").read_bytes() == b"old state"
    with pytest.warns(PrivacyRiskWarning, match="moved the checkpoint"):
        path = open_private_checkpoint(run, resume=True, accept_legacy=True)
    assert not (run / "checkpoint.pt").exists() and path.read_bytes() == b"old state"
    assert path.stat().st_mode & 0o777 == 0o600
    (run / "checkpoint.pt").write_bytes(b"stale")
    with pytest.warns(PrivacyRiskWarning, match="delete"):  # the private one is used: nothing to refuse
        assert open_private_checkpoint(run, resume=True).read_bytes() == b"old state"


def test_replacing_run_sets_the_private_checkpoint_aside_and_restores_it_on_failure(tmp_path, monkeypatch):
    from featuredp.experiments.runs import open_private_checkpoint, replacing_run

    monkeypatch.setenv("FEATUREDP_PRIVATE_DIR", str(tmp_path / "p"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    path = open_private_checkpoint(run)
    path.write_bytes(b"old run's keys")
    with pytest.raises(RuntimeError), replacing_run(run) as aside:
        assert aside == ["run.json", "private checkpoint"] and not path.exists()
        open_private_checkpoint(run).write_bytes(b"half of a new run")
        raise RuntimeError("training failed")
    assert path.read_bytes() == b"old run's keys" and (run / "run.json").exists()
    with replacing_run(run):
        open_private_checkpoint(run).write_bytes(b"new run's keys")
    assert path.read_bytes() == b"new run's keys"
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [path.parent.name]  # nothing set aside is left
    crashed = tmp_path / "crashed"  # a run killed before its folder was written: only its private checkpoint
    open_private_checkpoint(crashed).write_bytes(b"keys")
    with replacing_run(crashed) as aside:
        assert aside == ["private checkpoint"]
    assert not open_private_checkpoint(crashed).exists()
    with replacing_run(tmp_path / "fresh") as aside:
        assert aside == []
