"""``featuredp pate``: the JSON contract, secret seeds, refusals before work, missing data, the compare path."""

from __future__ import annotations

import csv
import json

import pytest

from featuredp.cli import main
from featuredp.errors import PrivacyRiskWarning

JSON_KEYS = {"epsilon", "delta", "teachers", "queries_answered", "label_accuracy", "student_accuracy",
             "sigma", "queries_asked", "mechanism", "dataset", "n_private", "n_public"}  # fmt: skip


def test_json_prints_one_object_with_the_documented_keys(capsys):
    rc = main(["pate", "--dataset", "adult", "--teachers", "20", "--epsilon", "2", "--queries", "40", "--json"])
    captured = capsys.readouterr()
    assert rc == 0
    out = json.loads(captured.out)  # exactly one JSON object on stdout
    assert set(out) >= JSON_KEYS
    assert out["teachers"] == 20 and out["dataset"] == "adult" and out["mechanism"] == "gnmax"
    assert 0.99 * 2 <= out["epsilon"] <= 2.0 and out["delta"] == 1e-5  # min(1e-5, 1/(2N)) with N = 26,049
    assert out["queries_asked"] == 40 == out["queries_answered"]
    assert 0.0 <= out["label_accuracy"] <= 1.0 and 0.5 < out["student_accuracy"] <= 1.0
    assert out["n_private"] + out["n_public"] == 32_561 and out["seeded"] is False
    assert "teachers fitted 20/20" in captured.err  # progress on stderr, not in the JSON


def test_the_documented_command_needs_no_queries_flag(capsys):
    # issue 24: `featuredp pate --dataset adult --epsilon 1 --json` must work as typed (≈ 5 s here)
    rc = main(["pate", "--dataset", "adult", "--epsilon", "1", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    out = json.loads(captured.out)
    # the documented default: 1000 queries (capped at the 6,512-input pool), all charged within ε = 1
    assert out["queries"] == 1000 == out["queries_asked"] and out["teachers"] == 250
    assert 0.99 <= out["epsilon"] <= 1.0 and out["delta"] == 1e-5
    assert "1000 of 6,512 public queries" in captured.err


def test_default_queries_are_capped_at_the_public_pool(capsys, monkeypatch):
    import featuredp.cli.pate as cli

    monkeypatch.setattr(cli, "DEFAULT_QUERIES", 10**9)  # more than any pool: every pool input is asked once
    assert main(["pate", "--teachers", "10", "--epsilon", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["queries"] == out["n_public"] == 6_512 == out["queries_asked"]


def test_help_documents_the_queries_default(capsys):
    with pytest.raises(SystemExit):
        main(["pate", "--help"])
    assert "default 1000 or the whole public pool" in " ".join(capsys.readouterr().out.split())


def test_the_seed_warns_and_is_never_written(tmp_path, capsys):
    seed = 918_273_645
    with pytest.warns(PrivacyRiskWarning, match="makes the private randomness"):
        rc = main(["pate", "--teachers", "10", "--epsilon", "1", "--queries", "20", "--mechanism", "lnmax",
                   "--seed", str(seed), "--json", "--out", str(tmp_path / "run")])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and json.loads(out)["seeded"] is True and json.loads(out)["scale"] > 0
    written = (tmp_path / "run" / "pate.json").read_text()
    assert str(seed) not in out and str(seed) not in written
    assert json.loads(written)["epsilon"] == json.loads(out)["epsilon"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--teachers", "0", "--epsilon", "1", "--queries", "10"], "--teachers must be >= 1, got 0"),
        (["--epsilon", "0", "--queries", "10"], "--epsilon must be > 0, got 0.0"),
        (["--epsilon", "-1", "--queries", "10"], "--epsilon must be > 0, got -1.0"),
        (["--epsilon", "1", "--queries", "0"], "--queries must be >= 1, got 0"),
        (["--epsilon", "1", "--queries", "5,6"], "--queries takes one number without --compare, got 5,6"),
        (["--queries", "10"], "--epsilon is required"),
        (["--epsilon", "1", "--queries", "10", "--delta", "1"], "--delta must be in (0, 1), got 1.0"),
        (["--epsilon", "1", "--queries", "10", "--mechanism", "lnmax", "--threshold", "5"], "needs --mechanism gnmax"),
        (["--compare", "--dataset", "census-income", "--out", "x"], "--compare runs on --dataset adult only"),
        (["--compare", "--epsilon", "1", "--out", "x"], "--epsilon does not apply to --compare"),
        (["--epsilons", "1,2", "--queries", "5"], "--epsilons needs --compare"),
    ],
)
def test_bad_flags_exit_2_with_one_line_before_any_work(flags, message, capsys, monkeypatch):
    import featuredp.experiments.pate_runs as runs

    def boom(*args, **kwargs):
        raise AssertionError("data was loaded for a command with a bad flag")

    monkeypatch.setattr(runs, "load_pate_data", boom)
    monkeypatch.setattr(runs, "compare_label_dp", boom)
    assert main(["pate", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("featuredp pate: error:")


def test_too_many_teachers_or_queries_fail_before_any_teacher(capsys, monkeypatch):
    import featuredp.mechanisms.pate as pate

    def boom(*args, **kwargs):
        raise AssertionError("a teacher was trained")

    monkeypatch.setattr(pate, "collect_votes", boom)
    assert main(["pate", "--teachers", "30000", "--epsilon", "1", "--queries", "10"]) == 2
    assert "--teachers must be <= the number of private records (26,049), got 30000" in capsys.readouterr().err
    assert main(["pate", "--epsilon", "1", "--queries", "7000"]) == 2
    assert "--queries must be <= the public query pool (6,512 inputs), got 7000" in capsys.readouterr().err


def test_fashion_mnist_missing_names_the_fetch_command(tmp_path, capsys, monkeypatch):
    import featuredp.data.images as images

    monkeypatch.setenv("FEATUREDP_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("FEATUREDP_OFFLINE", "1")
    monkeypatch.delenv("FEATUREDP_FASHION_MNIST", raising=False)
    monkeypatch.setattr(images, "FASHION_MNIST_DIRS", ())
    assert main(["pate", "--dataset", "fashion-mnist", "--epsilon", "1", "--queries", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert "featuredp data fetch fashion-mnist" in err and len(err.splitlines()) == 1


def test_ledger_flag_records_the_queries(tmp_path, capsys):
    from featuredp.accounting import BudgetLedger

    path = tmp_path / "budget.json"
    BudgetLedger(path, total_epsilon=1.2, delta=1e-5)
    assert main(["pate", "--teachers", "10", "--epsilon", "1", "--queries", "20", "--ledger", str(path), "--json"]) == 0
    eps = json.loads(capsys.readouterr().out)["epsilon"]
    assert BudgetLedger(path).spent() == pytest.approx(eps, rel=1e-6)
    # a second run of epsilon 1 would take the (tightly composed) total to ~1.33 > 1.2: refused before any teacher
    assert main(["pate", "--teachers", "10", "--epsilon", "1", "--queries", "20", "--ledger", str(path)]) == 2
    assert "no teacher was trained" in capsys.readouterr().err


def test_compare_quick_writes_table_csv_and_plot(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["pate", "--compare", "--quick", "--epsilons", "1", "--queries", "50", "--repeats", "1",
               "--teachers", "20", "--diagnostics", "--out", str(out), "--json"])  # fmt: skip
    assert rc == 0 and json.loads(capsys.readouterr().out)["rows"] == 6
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {r["method"] for r in rows} == {"nonprivate", "pate_q50", "fdp_label", "lp2st", "rr", "ceiling_q50"}
    for r in rows:
        assert 0.0 <= float(r["accuracy"]) <= 1.0
        noiseless = r["method"] in ("nonprivate", "ceiling_q50")
        assert r["covered_by_epsilon"] == str(not noiseless)  # the diagnostics are marked
        if not noiseless:
            assert float(r["epsilon"]) <= 1.0
    summary = (out / "summary.md").read_text()
    assert "| PATE, GNMax, 50 queries |" in summary and "Alg. 1, label-DP split" in summary
    assert "--queries 50 --repeats 1 --teachers 20 --quick --diagnostics" in summary  # the command that reproduces it
    assert "not covered by ε" in summary
    assert (out / "accuracy_vs_epsilon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------------
# Issue 23: nothing outside ε by default; the noiseless diagnostics only with --diagnostics, marked
# ---------------------------------------------------------------------------------------------------------
_RUN = ["pate", "--teachers", "10", "--epsilon", "1", "--queries", "20"]


def test_default_output_and_files_hold_no_noiseless_teacher_accuracy(tmp_path, capsys):
    assert main([*_RUN, "--json", "--out", str(tmp_path / "j")]) == 0
    printed = capsys.readouterr().out
    assert main([*_RUN, "--out", str(tmp_path / "t")]) == 0
    printed += capsys.readouterr().out
    written = "".join(f.read_text() for f in tmp_path.rglob("*") if f.is_file())
    for text in (printed, written):  # before: teacher_accuracy (a perfect distinguisher) next to the guarantee
        assert "teacher_accuracy" not in text and "diagnostics" not in text


def test_diagnostics_flag_shows_teacher_accuracy_marked_not_covered(tmp_path, capsys):
    assert main([*_RUN, "--diagnostics", "--json", "--out", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "teacher_accuracy" not in out  # only inside the marked object
    diag = out["diagnostics"]
    assert diag["covered_by_epsilon"] is False and "not covered by ε" in diag["note"]
    assert 0.0 <= diag["teacher_accuracy"] <= 1.0
    assert json.loads((tmp_path / "pate.json").read_text())["diagnostics"]["covered_by_epsilon"] is False
    assert main([*_RUN, "--diagnostics"]) == 0
    text = capsys.readouterr().out
    assert "NOT covered by epsilon" in text and "teacher_accuracy" in text
    assert text.index("NOT covered by epsilon") < text.index("teacher_accuracy")


def test_compare_without_diagnostics_writes_only_releases_covered_by_epsilon(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["pate", "--compare", "--quick", "--epsilons", "1", "--queries", "30", "--repeats", "1",
                 "--teachers", "10", "--out", str(out), "--json"]) == 0  # fmt: skip
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {r["method"] for r in rows} == {"pate_q30", "fdp_label", "lp2st", "rr"}
    assert all(r["covered_by_epsilon"] == "True" for r in rows)
    summary = (out / "summary.md").read_text()
    assert "non-private" not in summary.split("## Test accuracy")[1].split("\n\n")[1]  # no reference row
    assert "teacher" not in (out / "results.csv").read_text() and "mean teacher" not in summary
