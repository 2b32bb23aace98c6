"""``featuredp generate --run DIR --prompt ...``: text from a trained text run's model, greedy or sampled."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import featuredp.experiments.text_lm as text_lm
from _text_preset import TINY
from featuredp.cli import main
from featuredp.experiments.text_runs import generate_text


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "run"
    saved = text_lm.TEXT_PRESET
    text_lm.TEXT_PRESET = copy.deepcopy(TINY)
    try:
        assert main(["train", "--task", "text", "--method", "fdp", "--epsilon", "3", "--canaries", "", "--out",
                     str(out), "--json"]) == 0  # fmt: skip
    finally:
        text_lm.TEXT_PRESET = saved
    return out


def test_greedy_generation_is_the_models_and_deterministic(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["generate", "--run", str(run_dir), "--prompt", "Hello ", "--prompt", "My email is ",
                 "--max-new-tokens", "12", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert [g["prompt"] for g in out["generations"]] == ["Hello ", "My email is "]
    assert all(len(g["continuations"]) == 1 for g in out["generations"])
    again = generate_text(run_dir, ["Hello ", "My email is "], max_new_tokens=12)
    assert [g["continuations"] for g in again] == [g["continuations"] for g in out["generations"]]


def test_sampling_draws_from_the_public_seed(run_dir: Path) -> None:
    a = generate_text(run_dir, ["Hi "], max_new_tokens=20, temperature=1.5, samples=4, seed=1)
    b = generate_text(run_dir, ["Hi "], max_new_tokens=20, temperature=1.5, samples=4, seed=1)
    assert a == b and len(set(a[0]["continuations"])) > 1


@pytest.mark.parametrize(("extra", "needle"), [
    (["--samples", "3"], "--samples 3 with --temperature 0"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
])  # fmt: skip
def test_bad_flags_are_refused_in_one_line(run_dir: Path, capsys: pytest.CaptureFixture[str], extra, needle) -> None:
    capsys.readouterr()
    assert main(["generate", "--run", str(run_dir), "--prompt", "x", *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_a_run_that_is_not_a_text_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "tab"
    assert main(["train", "--dataset", "adult", "--private", "sex", "--method", "dpsgd", "--epsilon", "2",
                 "--epochs", "0.05", "--model", "logreg", "--no-baselines", "--out", str(run)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["generate", "--run", str(run), "--prompt", "x"]) == 2
    assert "is not a text run" in capsys.readouterr().err
