"""``featuredp icl``: the JSON contract, ε = inf, refusals before work, the seed, --out and --table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from featuredp.cli import main
from featuredp.errors import PrivacyRiskWarning

DOC = Path(__file__).resolve().parents[2] / "docs" / "icl.md"
REQUIRED = {"epsilon", "accuracy", "mia_auc"}


def _strict(text):
    # JSON proper: no Infinity / NaN constants (ε = ∞ must come out as the string "inf")
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c} in {text[:80]}"))


@pytest.fixture(scope="module")
def outputs():
    """The two runs the contract names, run once for the module."""
    import contextlib
    import io

    got = {}
    for eps, extra in (("1", []), ("inf", ["--diagnostics"])):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["icl", "--epsilon", eps, "--json", *extra])
        assert rc == 0
        lines = buf.getvalue().strip().splitlines()
        assert len(lines) == 1, "--json prints exactly one line: one JSON object"
        got[eps] = _strict(lines[0])
    return got


def test_json_keys_and_values(outputs):
    one, inf = outputs["1"], outputs["inf"]
    assert set(one) >= REQUIRED and set(inf) >= REQUIRED
    assert 0.99 <= one["epsilon"] <= 1.0 and one["epsilon_budget"] == 1.0 and one["sigma"] > 0
    assert inf["epsilon"] == "inf" and inf["epsilon_budget"] == "inf" and inf["sigma"] is None
    for out in (one, inf):
        assert 0 <= out["accuracy"] <= 1 and 0 <= out["mia_auc"] <= 1
        assert out["queries_answered"] == out["queries"] == 100 and out["dataset"] == "digits"
        assert out["prompts"] == 314 and out["shots"] == 4 and out["seeded"] is False
    # the noiseless ensemble is far more accurate than one prompt, and 1-NN over all demonstrations better still
    diag = inf["diagnostics"]
    assert inf["accuracy"] > diag["single_prompt_accuracy"] + 0.3 and diag["nonprivate_accuracy"] > 0.9
    assert 0 <= one["zero_shot_accuracy"] <= 1


def test_default_json_holds_no_noiseless_baseline_and_diagnostics_are_marked(outputs):
    one, inf = outputs["1"], outputs["inf"]
    # before: nonprivate_accuracy, single_prompt_accuracy and single_prompt_mia_auc (no noise) sat next to epsilon
    assert not {"diagnostics", "nonprivate_accuracy", "single_prompt_accuracy", "single_prompt_mia_auc"} & set(one)
    assert "nonprivate_accuracy" not in inf and inf["diagnostics"]["covered_by_epsilon"] is False
    assert "not covered by ε" in inf["diagnostics"]["note"]


def test_every_json_key_is_documented(outputs):
    doc = DOC.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", doc, flags=re.M))
    for out in outputs.values():
        missing = set(out) - documented
        assert not missing, f"docs/icl.md does not document --json keys {sorted(missing)}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epsilon", "0"], "--epsilon must be > 0, got 0.0"),
        (["--epsilon", "-1"], "--epsilon must be > 0"),
        (["--epsilon", "2000"], "--epsilon must be <= 1000"),
        (["--epsilon", "nan"], "--epsilon must not be NaN"),
        ([], "--epsilon is required"),
        (["--epsilon", "1", "--shots", "0"], "--shots must be >= 1, got 0"),
        (["--epsilon", "1", "--prompts", "400"], "--prompts × --shots = 400 × 4 = 1600 must be <= the 1257"),
        (["--epsilon", "1", "--queries", "10000"], "--queries must be <= 540"),
        (["--epsilon", "1", "--queries", "1"], "--queries must be >= 2"),
        (["--epsilon", "1", "--delta", "2"], "--delta must be in (0, 1), got 2.0"),
        (["--epsilon", "1", "--model-dir", "x"], "--model-dir applies to --learner hf only"),
        (["--epsilon", "1", "--learner", "hf"], "--learner hf needs --model-dir"),
        (["--epsilon", "1", "--learner", "hf", "--model-dir", "/nonexistent/model"], "does not exist"),
        (["--epsilon", "1", "--repeats", "3"], "--repeats applies to --table only"),
        (["--table", "--epsilon", "1"], "--table measures every --epsilons value"),
        (["--table", "--epsilons", "1,x"], "--epsilons must be numbers > 0 or inf"),
        (["--table", "--epsilons", "1,0"], "--epsilons must be numbers > 0 or inf, got '0'"),
        (["--table", "--prompt-sweep", "1,400"], "--prompt-sweep value 400 × --shots 4"),
    ],
)
def test_bad_flags_exit_2_with_one_line_before_any_work(argv, message, capsys, monkeypatch):
    import featuredp.experiments.icl_runs as runs

    def never(*args, **kwargs):
        raise AssertionError("the mechanism ran although a flag was bad")

    monkeypatch.setattr(runs, "run_icl", never)
    monkeypatch.setattr(runs, "run_table", never)
    assert main(["icl", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("featuredp icl: error: ") and message in err, err


def test_seed_warns_and_is_never_printed_or_written(tmp_path, capsys):
    seed = "86753091"
    with pytest.warns(PrivacyRiskWarning, match=f"seed={seed}"):
        rc = main(["icl", "--epsilon", "2", "--queries", "30", "--seed", seed, "--json", "--out", str(tmp_path)])
    text = capsys.readouterr().out
    out = _strict(text)
    assert rc == 0 and out["seeded"] is True and seed not in text
    written = (tmp_path / "result.json").read_text()
    assert _strict(written)["accuracy"] == out["accuracy"] and seed not in written


def test_table_writes_its_files(tmp_path, capsys):
    rc = main(["icl", "--table", "--epsilons", "3,inf", "--repeats", "1", "--queries", "20", "--prompt-sweep", "2",
               "--diagnostics", "--out", str(tmp_path)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "ε = ∞ (one prompt) †" in text and "ε = 3" in text and "NOT covered by epsilon" in text
    assert {p.name for p in tmp_path.iterdir()} >= {"results.csv", "summary.md", "icl.png", "icl_prompts.png"}
    assert "Not covered by ε" in (tmp_path / "summary.md").read_text()


def test_table_default_holds_only_settings_covered_by_epsilon(tmp_path, capsys):
    assert main(["icl", "--table", "--epsilons", "3", "--repeats", "1", "--queries", "20", "--out", str(tmp_path),
                 "--json"]) == 0  # fmt: skip
    out = _strict(capsys.readouterr().out)
    assert {e["setting"] for e in out["summary"].values()} == {"dp", "zero_shot"}
    assert all(e["covered_by_epsilon"] for e in out["summary"].values())
    rows = (tmp_path / "results.csv").read_text()
    assert "nonprivate" not in rows and "one_prompt" not in rows
    assert "† **Not covered" not in (tmp_path / "summary.md").read_text()
