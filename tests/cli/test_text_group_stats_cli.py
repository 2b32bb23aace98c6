"""Which private values repeat across records is itself private (issue 42, ARCHITECTURE rule 17): ``train --task
text`` computes and prints the largest repeat and the group ε only with ``--group-stats``, with a warning, and never
writes them to the run folder. Written as an attacker who reads everything a run prints and leaves behind."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest

import featuredp.experiments.text_lm as text_lm
from _text_preset import TINY
from featuredp.cli import main
from featuredp.experiments.text_runs import GROUP_STATS_KEY

SHARED = "Zorblax Quinterra"
#: what would give the equality of hidden values away, in any output or file
GROUP_MARKERS = ("largest_repeat", "largest repeat", "group_notes", "repeat in up to", "is covered at ε_",
                 "no meaningful guarantee for a group", "training records (more than")  # fmt: skip


@pytest.fixture(autouse=True)
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text_lm, "TEXT_PRESET", copy.deepcopy(TINY))


def _file(path: Path, shared: bool) -> Path:
    """60 records, a name and an email each; with ``shared``, records 0-14 hold one name (a group of up to 15),
    else every name is distinct. Ψ is the same for both files: they differ only inside the name spans."""
    lines = []
    for i in range(60):
        name = SHARED if shared and i < 15 else f"Vexmorin{i:02d} Talq"
        email = f"kq{i:02d}.vault@mailhost.example"
        text = f"Ticket {i}: {name} wrote from {email} about the invoice."
        spans = [{"start": text.index(name), "end": text.index(name) + len(name), "type": "name"},
                 {"start": text.index(email), "end": text.index(email) + len(email), "type": "email"}]  # fmt: skip
        lines.append(json.dumps({"text": text, "spans": spans}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[str, list[str]]:
    """stdout and the warnings' messages of one ``featuredp`` command."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out, [str(w.message) for w in caught]


def _folder(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def _argv(path: Path, *extra: str) -> list[str]:
    return ["train", "--task", "text", "--data", str(path), "--spans", "name,email", "--detect", "email",
            "--method", "fdp", "--epsilon", "3", "--epochs", "1", *extra]  # fmt: skip


def test_without_the_flag_nothing_tells_repeated_values_from_distinct_ones(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A file where 15 records share a name and one where no name repeats (same Ψ): stdout, --json, the warnings
    and run.json are the same apart from what the model computes, and no group statistic appears anywhere."""
    seen = []
    for shared in (True, False):
        path = _file(tmp_path / f"{shared}.jsonl", shared)
        run = tmp_path / f"run_{shared}"
        out, caught = _run(capsys, [*_argv(path, "--json", "--out", str(run))])
        text_out, text_caught = _run(capsys, _argv(path))
        files = _folder(run)
        everything = "\n".join([out, text_out, *caught, *text_caught,
                                *(b.decode("utf-8", "replace") for b in files.values())])  # fmt: skip
        for marker in GROUP_MARKERS:
            assert marker not in everything, marker
        assert SHARED not in everything
        summary = json.loads(out)
        assert summary[GROUP_STATS_KEY] is False and "group" not in summary and "group_notes" not in summary
        assert "largest_repeat" not in summary["boundary"]
        info = json.loads(files["run.json"])
        assert info[GROUP_STATS_KEY] is False
        for key in ("perplexity", "public_perplexity", "train_wall_s", "out", "data"):
            summary.pop(key)
        info.pop("metrics")
        info["result"].pop("history")  # the training losses: what the (noisy) model computes
        info["dataset"]["options"]["path"] = "FILE"
        kept = [ln for ln in text_out.splitlines() if not ln.startswith(("perplexity", "data"))]
        seen.append((summary, info, sorted(files), kept, sorted(caught)))
    assert seen[0] == seen[1]


def test_with_the_flag_the_statistics_are_printed_with_the_warning_and_kept_out_of_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    path = _file(tmp_path / "shared.jsonl", True)
    run = tmp_path / "run"
    out, caught = _run(capsys, _argv(path, "--json", "--group-stats", "--out", str(run)))
    summary = json.loads(out)
    assert summary[GROUP_STATS_KEY] is True
    k = summary["boundary"]["largest_repeat"]["name"]
    assert 12 <= k <= 15 and summary["group"]["size"] == k
    assert "are NOT covered by ε" in summary["group_stats_warning"]
    assert any("--group-stats" in m and "NOT covered by ε" in m for m in caught)
    # the setting is in run.json; the numbers are in no file of the run folder
    assert json.loads((run / "run.json").read_text())[GROUP_STATS_KEY] is True
    stored = "".join(b.decode("utf-8", "replace") for b in _folder(run).values())
    for marker in GROUP_MARKERS:
        assert marker not in stored, marker
    text_out, _ = _run(capsys, _argv(path, "--group-stats"))
    assert f"largest repeat {k}" in text_out
    assert "WARNING           --group-stats:" in text_out and "NOT covered by ε" in text_out
    assert f"group             values of type name repeat in up to {k} records" in text_out


def test_compare_refuses_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path / "f.jsonl", False)
    code = main(["compare", "--task", "text", "--data", str(path), "--spans", "name,email", "--group-stats",
                 "--out", str(tmp_path / "cmp")])  # fmt: skip
    assert code == 2
    assert "--group-stats is for train --task text" in capsys.readouterr().err
