"""`featuredp data scan`: counts of what Ψ does on an annotated JSONL file, and never a private value printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from featuredp.cli import main
from featuredp.data.text_scan import clopper_pearson, scan_text_file
from featuredp.features.text import DETECTORS

SRC = Path(__file__).resolve().parents[2] / "src"
SHARED = "Zorblax Quinterra"  # one customer in 12 records


def _records(n: int = 30, *, secret_of_first: str | None = None) -> list[dict[str, Any]]:
    """Texts with an annotated name and email; emails in the first 20 follow the detector's format, the rest not."""
    out = []
    for i in range(n):
        name = SHARED if i < 12 else f"Vexmorin{i:02d} Talq"
        email = f"kq{i:02d}.vault@mailhost.example" if i < 20 else f"kq{i:02d} at mailhost.example"
        if i == 0 and secret_of_first is not None:
            email = secret_of_first
        text = f"Ticket {i}: {name} wrote from {email} about the invoice."
        spans = [{"start": text.index(name), "end": text.index(name) + len(name), "type": "name"},
                 {"start": text.index(email), "end": text.index(email) + len(email), "type": "email"}]  # fmt: skip
        out.append({"text": text, "spans": spans})
    return out


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _values(records: list[dict[str, Any]]) -> set[str]:
    return {r["text"][s["start"]:s["end"]] for r in records for s in r["spans"]}


def _cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_counts_recall_and_repeats(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", _records())
    out = scan_text_file(path)
    assert out["records"] == 30 and out["annotated"] == {"email": 30, "name": 30}
    assert out["spans"] == ["email", "name"] and out["detect"] == list(DETECTORS)  # no names file: no name detector
    assert set(out["detected"]) == set(DETECTORS) and out["detected"]["email"] == 0  # annotated emails are blanked
    r = out["recall"]["email"]
    assert (r["found"], r["of"]) == (20, 30) and r["rate"] == pytest.approx(2 / 3)
    assert (r["lower"], r["upper"]) == pytest.approx(clopper_pearson(20, 30)) and r["lower"] < 2 / 3 < r["upper"]
    assert "name" not in out["recall"]  # the name detector was not run
    assert out["repeated"]["name"] == {"top": [12] + [1] * 9, "max": 12}
    assert out["repeated"]["email"]["max"] == 1


def test_repeats_compare_values_case_and_whitespace_normalised(tmp_path: Path) -> None:
    recs = _records()
    for i, variant in ((12, "zorblax  QUINTERRA"), (13, "ZORBLAX Quinterra")):  # two more holders of the shared name
        old = recs[i]["text"][recs[i]["spans"][0]["start"]:recs[i]["spans"][0]["end"]]
        recs[i]["text"] = recs[i]["text"].replace(old, variant)
        recs[i]["spans"] = [{"start": recs[i]["text"].index(variant), "end": recs[i]["text"].index(variant)
                             + len(variant), "type": "name"}]  # fmt: skip
    assert scan_text_file(_write(tmp_path / "t.jsonl", recs), spans=["name"])["repeated"]["name"]["max"] == 14


def test_the_name_detector_runs_with_a_names_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "t.jsonl", _records())
    names = tmp_path / "names.txt"
    names.write_text(SHARED + "\n")
    rc, out, _ = _cli(capsys, ["data", "scan", str(path), "--names-file", str(names), "--json"])
    got = json.loads(out)
    assert rc == 0 and "name" in got["detect"]
    assert (got["recall"]["name"]["found"], got["recall"]["name"]["of"]) == (12, 30)


def test_no_private_value_is_printed_text_or_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An attacker reading the report (both forms, every sampled line) learns no span's contents."""
    recs = _records()
    path = _write(tmp_path / "t.jsonl", recs)
    names = tmp_path / "names.txt"
    names.write_text(SHARED + "\n")
    for extra in ([], ["--json"], ["--names-file", str(names), "--sample", "30"]):
        rc, out, err = _cli(capsys, ["data", "scan", str(path), *extra])
        assert rc == 0, err
        printed = out + err
        leaked = [v for v in _values(recs) if v in printed or v.lower() in printed.lower()]
        assert leaked == [], leaked
        # not even a piece: the shared name's parts and the email user names
        assert "Zorblax" not in printed and "Quinterra" not in printed and "vault@" not in printed
    assert "[NAME]" in out and "[EMAIL]" in out


def test_json_has_exactly_the_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "t.jsonl", _records())
    rc, out, _ = _cli(capsys, ["data", "scan", str(path), "--json", "--sample", "3"])
    got = json.loads(out)
    assert rc == 0
    assert set(got) == {"records", "annotated", "detected", "recall", "repeated", "sample", "spans", "detect"}
    assert set(got["recall"]["email"]) == {"found", "of", "rate", "lower", "upper"}
    assert len(got["sample"]) == 3 and all(len(line) <= 160 for line in got["sample"])


def test_the_text_report_has_a_row_per_type_and_the_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "t.jsonl", _records())
    rc, out, _ = _cli(capsys, ["data", "scan", str(path)])
    assert rc == 0
    assert "name not run (give --names-file)" in out
    email = next(line for line in out.splitlines() if line.startswith("email "))
    assert "20/30" in email and "[0." in email
    name = next(line for line in out.splitlines() if line.startswith("name "))
    assert name.endswith("12 records")
    assert "group of 12" in out and "sample of Ψ(x) (5 random records" in out


def test_the_sample_is_random_not_the_first_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", _records(60))
    samples = {tuple(scan_text_file(path, sample=5)["sample"]) for _ in range(4)}
    first = tuple(scan_text_file(path, sample=60)["sample"])
    assert len(samples) > 1  # OS entropy: four draws of 5 of 60 all equal has probability ~1e-20
    assert len(set(first)) == 60  # all drawn: every record once


def test_long_lines_are_cut_to_160_characters(tmp_path: Path) -> None:
    rec = {"text": "x" * 500 + " mail a@b.org", "spans": []}
    out = scan_text_file(_write(tmp_path / "t.jsonl", [rec]), spans=["email"], detect=["email"])
    assert len(out["sample"][0]) == 160 and out["sample"][0].endswith("…")


def test_neighbours_that_differ_inside_a_span_give_the_same_structure_counts(tmp_path: Path) -> None:
    """Same Ψ, different contents of one private span: records, annotated and detected cannot tell them apart.

    The second file's email would be found by the phone and number detectors if they read inside annotations;
    recall and repeated are statistics of the private values by nature and may differ."""
    a = scan_text_file(_write(tmp_path / "a.jsonl", _records()), sample=0)
    b = scan_text_file(_write(tmp_path / "b.jsonl", _records(secret_of_first="555-123-4567 99999999")), sample=0)
    for key in ("records", "annotated", "detected", "spans", "detect"):
        assert a[key] == b[key], key
    assert a["recall"] != b["recall"]  # the hidden value changed what the email detector finds: private by nature


@pytest.mark.parametrize(("argv", "flag"), [
    (["--spans", "iban_number"], "--spans"),
    (["--detect", "name"], "--names-file"),
    (["--detect", "zipcode"], "--detect"),
    (["--names-file", "{tmp}/none.txt"], "--names-file"),
])  # fmt: skip
def test_bad_flags_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                       flag: str) -> None:  # fmt: skip
    path = _write(tmp_path / "t.jsonl", _records())
    rc, out, err = _cli(capsys, ["data", "scan", str(path), *[a.format(tmp=tmp_path) for a in argv]])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and flag in err, err


def test_bad_files_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("text,spans\nhello,\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    for path, says in ((tmp_path / "missing.jsonl", "no such file"), (bad, "not valid JSON"), (empty, "no records")):
        rc, _, err = _cli(capsys, ["data", "scan", str(path)])
        assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_data_scan_does_not_import_torch(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", _records())
    code = ("import sys, io, contextlib\nfrom featuredp.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    rc = main(['data', 'scan', {str(path)!r}])\n"
            "print(rc, 'torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.stdout.split() == ["0", "False"], out.stderr


def test_records_per_user_by_a_field_never_the_users_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = _records(30)
    for i, r in enumerate(records):  # one prolific author (12 records), the rest one or two each
        r["author"] = "Quilla Brandtmoor" if i < 12 else f"Author{i // 2:02d}"
    path = _write(tmp_path / "log.jsonl", records)
    users = scan_text_file(path, user_field="author", sample=0)["users"]
    assert users["users"] == 1 + 9 and users["largest"] == 12 and users["top"][:2] == [12, 2]
    code, out, _ = _cli(capsys, ["data", "scan", str(path), "--user-field", "author", "--json"])
    assert code == 0 and json.loads(out)["users"]["largest"] == 12
    code, text, _ = _cli(capsys, ["data", "scan", str(path), "--user-field", "author", "--sample", "0"])
    assert code == 0 and "largest 12" in text and "group of 12" in text
    assert "Quilla" not in out + text and "Author0" not in out + text


def test_a_record_without_the_user_field_is_refused_naming_its_line(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    records = _records(5)
    for r in records[:3]:
        r["author"] = "x"
    path = _write(tmp_path / "log.jsonl", records)
    code, _, err = _cli(capsys, ["data", "scan", str(path), "--user-field", "author"])
    assert code == 2 and "line 4" in err and "--user-field 'author'" in err and len(err.strip().splitlines()) == 1
