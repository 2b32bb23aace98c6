"""`train --task text` reports the boundary (spans per type), warns, and with --group-stats the largest repeat and
the group bound (tests/cli/test_text_group_stats_cli.py: none of it without the flag)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import featuredp.experiments.text_lm as text_lm
from _text_preset import TINY
from featuredp.accounting import group_epsilon
from featuredp.cli import main
from featuredp.errors import PrivacyLeakWarning, PrivacyRiskWarning
from featuredp.experiments.text_runs import group_guarantee
from featuredp.noise import noise_plan
from featuredp.plan import PrivacyPlan, TrainResult

SHARED = "Zorblax Quinterra"


@pytest.fixture(autouse=True)
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text_lm, "TEXT_PRESET", copy.deepcopy(TINY))


@pytest.fixture(scope="module")
def shared_name_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 records; one name in 15 of them (at least 12 land in the 54 training records), emails all distinct."""
    lines = []
    for i in range(60):
        name = SHARED if i < 15 else f"Vexmorin{i:02d} Talq"
        email = f"kq{i:02d}.vault@mailhost.example"
        text = f"Ticket {i}: {name} wrote from {email} about the invoice."
        spans = [{"start": text.index(name), "end": text.index(name) + len(name), "type": "name"},
                 {"start": text.index(email), "end": text.index(email) + len(email), "type": "email"}]  # fmt: skip
        lines.append(json.dumps({"text": text, "spans": spans}))
    path = tmp_path_factory.mktemp("boundary") / "shared.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _train(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_boundary_group_and_the_repeat_warning(shared_name_file: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    argv = ["train", "--task", "text", "--data", str(shared_name_file), "--spans", "name,email,phone", "--detect",
            "email,phone", "--method", "fdp", "--epsilon", "3", "--epochs", "1", "--out", str(tmp_path / "run"),
            "--json", "--group-stats"]  # fmt: skip
    with pytest.warns(PrivacyRiskWarning, match=r"a name value appears in 1[2-5] training records") as caught:
        summary = _train(capsys, argv)
    assert any(issubclass(w.category, PrivacyLeakWarning) and "--detect phone found nothing" in str(w.message)
               for w in caught)  # fmt: skip
    b = summary["boundary"]
    assert b["annotated"] == {"email": 54, "name": 54}
    assert b["detected"] == {"email": 0, "phone": 0}
    k = b["largest_repeat"]["name"]
    assert 12 <= k <= 15 and b["largest_repeat"]["email"] == 1 and b["largest_repeat"]["phone"] == 0
    g = summary["group"]
    assert (g["type"], g["size"]) == ("name", k)
    expect = group_epsilon(summary["noise_multiplier"], summary["sampling_rate"], summary["steps"], 1e-5, k)
    assert g["epsilon"] == pytest.approx(expect, rel=1e-6) and g["epsilon"] > summary["epsilon"]
    assert any(f"the group of {k} is covered at ε_{k} = " in n for n in summary["group_notes"])
    # the repeat count is for the analyst, never stored with the model
    run_files = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*.json"))
    assert "largest_repeat" not in run_files and SHARED not in run_files


def test_the_printed_summary_has_the_boundary_and_group_lines(shared_name_file: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with pytest.warns(PrivacyRiskWarning):
        assert main(["train", "--task", "text", "--data", str(shared_name_file), "--spans", "name,email",
                     "--method", "public", "--epochs", "1", "--group-stats"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "boundary          email 54 annotated" in out and "name 54 annotated, largest repeat" in out
    assert "group             values of type name repeat in up to" in out and "(0, 0) too" in out
    assert SHARED not in out


def _result(noise: str = "independent", method: str = "fdp", relation: str = "add-remove") -> TrainResult:
    extra: dict[str, Any] = {"bands": 2, "coeffs": (1.0, 0.5)} if noise == "bandmf" else {}
    plan = PrivacyPlan(method, dataset_size=100, expected_batch_size=10, sampling_rate=0.1, steps=5,
                       noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5, relation=relation,
                       noise=noise_plan(noise, **extra))  # fmt: skip
    return TrainResult(method, plan, 2.0, 1e-5, 5, 0, False, None, "", {})


def test_the_group_bound_where_it_is_and_is_not_computed() -> None:
    assert group_guarantee(_result(), {"name": 1, "email": 0}) == (None, [])
    g, lines = group_guarantee(_result(), {"name": 4, "email": 2})
    assert g is not None and (g["type"], g["size"], g["accounting"]) == ("name", 4, "mixture")
    assert g["epsilon"] == pytest.approx(group_epsilon(1.0, 0.1, 5, 1e-5, 4), rel=1e-6)
    assert len(lines) == 2 and lines[0].startswith("values of type name repeat in up to 4 records")
    for kwargs, says in (({"noise": "bandmf"}, "correlated noise"), ({"method": "nonprivate"}, "non-private"),
                         ({"relation": "replace-one"}, "add/remove")):  # fmt: skip
        g, lines = group_guarantee(_result(**kwargs), {"name": 3})
        assert g is not None and g["epsilon"] is None and says in lines[0], lines


def test_a_group_whose_bound_is_vacuous_is_said_to_have_no_meaningful_guarantee() -> None:
    """Old code printed "the group of 419 is covered at ε_419 = 1.344e+06 (δ = inf)": a number, not a guarantee."""
    g, lines = group_guarantee(_result(), {"name": 400})
    assert g is not None and g["size"] == 400 and (g["epsilon"] >= 100 or g["delta"] >= 1)
    assert "no meaningful guarantee for a group of 400" in lines[0] and "--user-field" in lines[0]
    assert "is covered at" not in lines[0]
    _, small = group_guarantee(_result(), {"name": 2})
    assert "is covered at ε_2 = " in small[0]


def _neighbour_file(path: Path, long_emails: bool) -> Path:
    """60 records with distinct names and emails; the files differ only inside the email spans of records 0-4 (Ψ
    is the same: a span is replaced whatever its length). The long ones would make those texts longer than
    --max-len 64 if truncation were counted on the full text."""
    lines = []
    for i in range(60):
        name = f"Vexmorin{i:02d} Talq"
        email = f"kq{i:02d}.vault@mh.example"
        if i < 5 and long_emails:
            email = f"a.very.long.private.address.number{i}.of.someone@subdomain.mailhost.example"
        text = f"T{i}: {name} at {email}."
        spans = [{"start": text.index(name), "end": text.index(name) + len(name), "type": "name"},
                 {"start": text.index(email), "end": text.index(email) + len(email), "type": "email"}]  # fmt: skip
        lines.append(json.dumps({"text": text, "spans": spans}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_neighbours_with_the_same_psi_print_the_same_apart_from_the_model(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """An attacker who reads everything `train --task text --json` prints (and its text output) learns nothing
    about one record's span beyond Ψ: two files that differ only inside one private span give identical output,
    apart from what the model computes (held-out perplexities, covered or labelled as not covered) and timing."""
    outs = []
    for i in range(2):
        path = _neighbour_file(tmp_path / f"n{i}.jsonl", long_emails=bool(i))
        argv = ["train", "--task", "text", "--data", str(path), "--spans", "name,email", "--detect", "email",
                "--method", "fdp", "--epsilon", "3", "--epochs", "1", "--max-len", "64", "--json"]  # fmt: skip
        summary = _train(capsys, argv)
        for key in ("perplexity", "public_perplexity", "train_wall_s"):
            summary.pop(key)
        summary["data"] = summary["data"].replace(f"n{i}.jsonl", "N.jsonl")
        outs.append(summary)
    assert outs[0] == outs[1]
