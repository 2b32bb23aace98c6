"""`featuredp audit RUN --names-file` (a run trained with --detect name); held-out metrics labelled (issue 34 D)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import featuredp.experiments.text_lm as text_lm
from _text_preset import TINY
from featuredp.cli import main
from featuredp.data.text import TextRecord, write_jsonl
from featuredp.data.text_corpus import support_dialogues


@pytest.fixture(autouse=True)
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text_lm, "TEXT_PRESET", copy.deepcopy(TINY))


@pytest.fixture(scope="module")
def records() -> list[TextRecord]:
    return support_dialogues(120, seed=5, max_bytes=62)


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory: pytest.TempPathFactory, records: list[TextRecord]) -> Path:
    path = tmp_path_factory.mktemp("names_data") / "support.jsonl"
    write_jsonl(records, path)
    return path


def _ok(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], flag: str) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], lines
    return lines[0]


def test_audit_names_file_audits_a_name_detector_run_and_refuses_another_list(
        tmp_path: Path, jsonl: Path, records: list[TextRecord], capsys: pytest.CaptureFixture[str]) -> None:
    listed = sorted({r.text[s.start : s.end].split()[0] for r in records for s in r.spans if s.type == "name"})
    assert len(listed) > 3
    names = tmp_path / "names.txt"
    names.write_text("\n".join(listed) + "\n")
    run = tmp_path / "run"
    _ok(capsys, ["train", "--task", "text", "--data", str(jsonl), "--spans", "email,name", "--detect", "name",
                 "--names-file", str(names), "--method", "public", "--out", str(run), "--json"])  # fmt: skip
    assert not [n for n in listed if f'"{n}"' in (run / "run.json").read_text()]  # only their count
    # the same names in another order: the same list
    again = tmp_path / "again.txt"
    again.write_text("\n".join(reversed(listed)) + "\n")
    out = _ok(capsys, ["audit", str(run), "--attack", "extraction", "--names-file", str(again), "--json"])
    assert out["extraction"]["tried"] > 0 and out["heldout_covered"] is False
    assert "not covered by ε" in (run / "audit" / "text_extraction.md").read_text()
    # without the list, a shorter list, or one name swapped (same count: the privately kept digest differs)
    _refused(capsys, ["audit", str(run), "--attack", "span"], "--names-file")
    short = tmp_path / "short.txt"
    short.write_text("\n".join(listed[:-1]) + "\n")
    assert "trained with" in _refused(capsys, ["audit", str(run), "--attack", "span", "--names-file", str(short)],
                                      "--names-file")
    swapped = tmp_path / "swapped.txt"
    swapped.write_text("\n".join([*listed[:-1], "Zebediah"]) + "\n")
    assert "digest" in _refused(capsys, ["audit", str(run), "--attack", "span", "--names-file", str(swapped)],
                                "--names-file")


def test_a_names_file_for_a_run_without_names_is_refused(tmp_path: Path, jsonl: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _ok(capsys, ["train", "--task", "text", "--data", str(jsonl), "--spans", "email", "--method", "public",
                 "--out", str(run), "--json"])  # fmt: skip
    names = tmp_path / "names.txt"
    names.write_text("Ann\n")
    _refused(capsys, ["audit", str(run), "--attack", "span", "--names-file", str(names)], "--names-file")


def test_train_test_data_computes_held_out_metrics_off_the_training_file(
        tmp_path: Path, records: list[TextRecord], capsys: pytest.CaptureFixture[str]) -> None:
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_jsonl(records[:100], train)
    write_jsonl(records[100:], test)
    base = ["train", "--task", "text", "--data", str(train), "--spans", "email,phone", "--method", "public"]
    split = _ok(capsys, [*base, "--json"])
    assert split["heldout_covered"] is False and split["heldout_source"] == "split"
    assert "not covered by ε" in split["heldout_note"] and split["train_texts"] < 100
    off = _ok(capsys, [*base, "--test-data", str(test), "--json"])
    assert off["heldout_source"] == "test_data" and off["test_texts"] == 20 and off["train_texts"] == 100
    assert "outside the training data" in off["heldout_note"] and off["perplexity"] != split["perplexity"]
    assert main(base) == 0
    assert "not covered by ε" in capsys.readouterr().out
    _refused(capsys, ["train", "--task", "text", "--test-data", str(test), "--method", "public"], "--test-data")


def test_compare_labels_held_out_metrics(tmp_path: Path, records: list[TextRecord],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_jsonl(records[:100], train)
    write_jsonl(records[100:], test)
    base = ["compare", "--task", "text", "--data", str(train), "--spans", "email,phone", "--methods", "public",
            "--canaries", "0", "--quick", "--json"]  # fmt: skip
    split = _ok(capsys, [*base, "--out", str(tmp_path / "split")])
    assert split["meta"]["heldout"]["covered"] is False
    assert "(not covered by ε)" in (tmp_path / "split" / "summary.md").read_text()
    off = _ok(capsys, [*base, "--test-data", str(test), "--out", str(tmp_path / "off")])
    assert off["meta"]["heldout"]["source"] == "test_data"
    assert "--test-data test.jsonl, outside the training data" in (tmp_path / "off" / "summary.md").read_text()
