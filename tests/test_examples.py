"""The examples in examples/ run (a shortened version in CI; the full one is `slow`)."""

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_quickstart_runs_short(capsys):
    _load("quickstart").main(epochs=0.05)
    out = capsys.readouterr().out
    assert "FDP-SGD" in out and "DP-SGD" in out
    assert "epsilon 0.9" in out or "epsilon 1.000" in out  # calibrated to at most the target ε = 1


@pytest.mark.slow
def test_quickstart_runs_full(capsys):
    _load("quickstart").main()
    assert "FDP-SGD" in capsys.readouterr().out


def test_own_loop_runs_short_and_opacus_and_featuredp_agree_on_epsilon(capsys):
    rows = {r["arm"]: r for r in _load("own_loop").main(epochs=0.1, seeds=1)}
    out = capsys.readouterr().out
    assert "featuredp+fdp" in out and "samples/s" in out
    assert rows["featuredp"]["epsilon"] == rows["featuredp+fdp"]["epsilon"]  # the same (σ, q, T)
    if "opacus" in rows:  # Opacus's PRV upper bound carries an absolute error of up to 0.01
        assert abs(rows["opacus"]["epsilon"] - rows["featuredp"]["epsilon"]) <= 0.01 + 0.01 * rows["opacus"]["epsilon"]


def test_own_loop_lm_trains_lora_adapters_in_the_users_loop(capsys):
    pytest.importorskip("transformers")
    result = _load("own_loop_lm").main(steps=3, n=64, batch=16)
    assert 0 < result["epsilon"] < 10 and result["held_out_loss"] > 0
    assert "LoRA" in capsys.readouterr().out


def test_own_loop_under_torchrun_trains_the_same_model_on_every_rank(tmp_path):
    import json

    from _launch import run_torchrun

    done = run_torchrun(str(EXAMPLES / "own_loop_torchrun.py"), "--out", str(tmp_path / "rank"), "--epochs", "1",
                        timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    reports = [json.loads((tmp_path / f"rank.{r}").read_text()) for r in (0, 1)]
    assert reports[0]["world_size"] == 2 and reports[0]["steps"] == reports[1]["steps"] == 20
    assert reports[0]["checksum"] == reports[1]["checksum"]  # one noisy total, the same update on every rank
    assert reports[0]["epsilon"] == reports[1]["epsilon"]
