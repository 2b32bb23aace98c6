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
