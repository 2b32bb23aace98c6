"""`featuredp compare|train|audit` with --task text, in process on a tiny preset: JSON, files, refusals."""

from __future__ import annotations

import copy
import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

import featuredp.experiments.text_lm as text_lm
import featuredp.experiments.text_runs as text_runs
from _text_preset import TINY
from featuredp.cli import main
from featuredp.data.text import TextRecord, write_jsonl
from featuredp.data.text_corpus import support_dialogues
from featuredp.plan import PrivacyPlan


@pytest.fixture(autouse=True)
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text_lm, "TEXT_PRESET", copy.deepcopy(TINY))


@pytest.fixture(scope="module")
def records() -> list[TextRecord]:
    return support_dialogues(120, seed=5, max_bytes=62)


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory: pytest.TempPathFactory, records: list[TextRecord]) -> Path:
    path = tmp_path_factory.mktemp("text_data") / "support.jsonl"
    write_jsonl(records, path)
    return path


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory, jsonl: Path) -> tuple[Path, dict[str, Any]]:
    """An FDP run on the JSONL's email and phone spans with one canary planted 20 times (about 1 s)."""
    run = tmp_path_factory.mktemp("text_run") / "run"
    argv = ["train", "--task", "text", "--data", str(jsonl), "--spans", "email,phone", "--method", "fdp",
            "--epsilon", "3", "--out", str(run), "--canaries", "20", "--json"]  # fmt: skip
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(buf):
        mp.setattr(text_lm, "TEXT_PRESET", copy.deepcopy(TINY))
        assert main(argv) == 0
    return run, json.loads(buf.getvalue())


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], flag: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], err
    return lines[0]


def test_the_run_code_reads_the_patched_preset() -> None:
    assert text_runs.text_preset is text_lm.text_preset
    assert text_runs.text_preset(False)["model"]["d_model"] == 16


def test_compare_quick_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    result = _run(capsys, ["compare", "--task", "text", "--quick", "--epsilons", "3", "--methods", "public,fdp",
                           "--out", str(out), "--json"])  # fmt: skip
    assert [(r["method"], r["epsilon"]) for r in result["rows"]] == [("public", None), ("fdp", 3.0)]
    for r in result["rows"]:
        assert {"perplexity", "canary_exposure", "extraction", "span_inference"} <= set(r)
    assert result["meta"]["quick"] and "60 train" in result["meta"]["source"]  # the quick part of the preset
    fdp = result["rows"][1]  # the replace-one ε beside ε spent (telling two values of a private span apart)
    assert fdp["replacement_epsilon_spent"] > fdp["epsilon_spent"] * 1.1
    assert "| replacement ε |" in (out / "summary.md").read_text()
    assert (out / "results.json").is_file() and (out / "summary.md").is_file() and (out / "text_privacy.png").is_file()


def test_train_json(text_run: tuple[Path, dict[str, Any]]) -> None:
    run, summary = text_run
    assert summary["task"] == "text" and summary["method"] == "fdp" and summary["out"] == str(run)
    assert 0 < summary["epsilon"] <= 3.0 and summary["canaries"] == 1
    assert summary["private"] == "the contents of spans of types email, phone, secret"
    assert (run / "run.json").is_file() and (run / "model.pt").is_file()


def test_train_json_and_run_json_state_the_replacement_epsilon(text_run: tuple[Path, dict[str, Any]]) -> None:
    """Telling two values of a private span apart is replace-one: its ε is printed beside the add/remove ε."""
    run, summary = text_run
    assert summary["replacement_epsilon"] > summary["epsilon"] * 1.1
    result = json.loads((run / "run.json").read_text())["result"]
    assert result["replacement_epsilon"] == pytest.approx(summary["replacement_epsilon"])
    plan = PrivacyPlan.from_dict(json.loads((run / "run.json").read_text())["plan"])
    assert plan.replacement_epsilon(result["steps"]) == pytest.approx(result["replacement_epsilon"])
    assert "telling two values of one record's private part apart: ε = " in summary["guarantee"]


@pytest.mark.parametrize("attack", ["exposure", "extraction", "span"])
def test_audit_each_attack(text_run: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str],
                           attack: str) -> None:  # fmt: skip
    run, summary = text_run
    out = _run(capsys, ["audit", str(run), "--attack", attack, "--json"])
    assert out["attack"] == attack and out["method"] == "fdp" and out["epsilon_claimed"] == summary["epsilon"]
    saved = json.loads((run / "audit" / f"text_{attack}.json").read_text())
    assert saved["attack"] == attack and saved["perplexity"] == pytest.approx(summary["perplexity"])
    assert (run / "audit" / f"text_{attack}.md").stat().st_size > 0
    if attack == "exposure":
        # the same canary as in training (20×, 2 digits) is ranked among the 100 two-digit strings
        assert list(out["exposure"]["by_repeats"]) == ["20"] and out["exposure"]["space_size"] == 100
    elif attack == "extraction":
        assert out["extraction"]["tried"] >= 0 and "heldout" in out["extraction"]
    else:
        si = out["span_inference"]
        assert si["n"] > 0 and si["prior_baseline"] <= si["bound"] <= 1.0 and si["violates"] is False


def test_run_json_holds_no_seed_and_no_span_contents(text_run: tuple[Path, dict[str, Any]],
                                                     records: list[TextRecord]) -> None:  # fmt: skip
    run, _ = text_run
    text = (run / "run.json").read_text()
    info = json.loads(text)
    assert info["task"] == "text" and info["config"]["seeded"] is False

    def keys(obj: Any) -> set[str]:
        if isinstance(obj, dict):
            return set(obj) | {k for v in obj.values() for k in keys(v)}
        if isinstance(obj, list):
            return {k for v in obj for k in keys(v)}
        return set()

    assert "seed" not in keys(info)  # public seeds only (corpus, canaries, public batches)
    private = [v for r in records for s in r.spans if s.type in ("email", "phone") for v in [r.text[s.start : s.end]]]
    assert any("@" in v for v in private)
    assert not [v for v in private if v in text]


def test_audit_refuses_data_changed_since_training(tmp_path: Path, records: list[TextRecord],
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    path = tmp_path / "d.jsonl"
    write_jsonl(records, path)
    run = tmp_path / "run"
    _run(capsys, ["train", "--task", "text", "--data", str(path), "--spans", "email,phone", "--method", "public",
                  "--out", str(run), "--json"])  # fmt: skip
    write_jsonl(records[1:], path)  # another file under the same name: the audit would rebuild other texts
    assert main(["audit", str(run), "--attack", "span"]) == 2
    assert str(path) in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "flag"), [
    (["compare", "--task", "text", "--private", "sex"], "--private"),
    (["train", "--task", "text", "--private", "sex"], "--private"),
    (["compare", "--task", "text", "--data", "{data}"], "--spans"),
    (["train", "--task", "text", "--data", "{data}"], "--spans"),
    (["train", "--task", "text", "--data", "{data}", "--spans", "email,name", "--detect", "name"], "--names-file"),
    (["compare", "--task", "text", "--data", "{data}", "--spans", "phone", "--detect", "email"], "--detect email"),
    (["train", "--task", "text", "--data", "{data}", "--spans", "phone", "--detect", "email"], "--detect email"),
    (["compare", "--task", "text", "--methods", "public,fdp_label"], "--methods"),
])  # fmt: skip
def test_flag_refusals_are_one_line_before_any_work(jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    argv: list[str], flag: str) -> None:  # fmt: skip
    out = tmp_path / "out"
    _refused(capsys, [a.replace("{data}", str(jsonl)) for a in argv] + ["--out", str(out)], flag)
    assert not out.exists()


@pytest.fixture(scope="module")
def tabular_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from featuredp.experiments.train_one import train_tabular

    run = tmp_path_factory.mktemp("tabular") / "run"
    train_tabular(method="nonprivate", out=run, progress=False, epochs=0.05)
    return run


@pytest.mark.parametrize("attack", ["span", "exposure"])
def test_a_text_attack_on_a_tabular_run_is_refused(tabular_run: Path, capsys: pytest.CaptureFixture[str],
                                                   attack: str) -> None:  # fmt: skip
    _refused(capsys, ["audit", str(tabular_run), "--attack", attack], f"--attack {attack}")
    assert not (tabular_run / "audit").exists()


def test_a_tabular_attack_on_a_text_run_is_refused(text_run: tuple[Path, dict[str, Any]],
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    _refused(capsys, ["audit", str(text_run[0]), "--attack", "attribute"], "--attack attribute")


def test_exposure_of_a_run_without_canaries_is_refused(tmp_path: Path, jsonl: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    run = tmp_path / "run"
    summary = _run(capsys, ["train", "--task", "text", "--data", str(jsonl), "--spans", "email,phone", "--method",
                            "public", "--out", str(run), "--json"])  # fmt: skip
    assert summary["canaries"] == 0 and summary["epsilon"] == 0.0
    _refused(capsys, ["audit", str(run), "--attack", "exposure"], "--canaries")
    # the other audits need no canary
    assert _run(capsys, ["audit", str(run), "--attack", "span", "--json"])["span_inference"]["bound"] is not None


def test_audit_of_a_name_detector_run_is_refused_not_rebuilt_without_the_names(
        tmp_path: Path, jsonl: Path, records: list[TextRecord], capsys: pytest.CaptureFixture[str]) -> None:
    """run.json counts the listed names but keeps none of them, so the audit cannot rebuild the spans they found."""
    names = tmp_path / "names.txt"
    listed = sorted({r.text[s.start : s.end].split()[0] for r in records for s in r.spans if s.type == "name"})
    names.write_text("\n".join(listed) + "\n")
    run = tmp_path / "run"
    _run(capsys, ["train", "--task", "text", "--data", str(jsonl), "--spans", "email,name", "--detect", "name",
                  "--names-file", str(names), "--method", "public", "--out", str(run), "--json"])  # fmt: skip
    assert not [n for n in listed if f'"{n}"' in (run / "run.json").read_text()]
    _refused(capsys, ["audit", str(run), "--attack", "span"], "--detect name")


def test_the_clis_detector_names_are_the_packages() -> None:
    """The parser keeps its own copy (building it must not import torch): it must not drift from the detectors."""
    from featuredp.cli._text_args import DETECTOR_NAMES
    from featuredp.features.text import DETECTORS

    assert set(DETECTOR_NAMES) == {*DETECTORS, "name"}


@pytest.mark.parametrize(("kind", "flags", "bands", "says"), [
    ("bandmf", ["--bands", "2"], 2, "bandmf, 2 bands"),
    ("blt", [], None, "one Gaussian at sensitivity"),
])  # fmt: skip
def test_train_text_with_correlated_noise(tmp_path: Path, jsonl: Path, capsys: pytest.CaptureFixture[str], kind: str,
                                          flags: list[str], bands: int | None, says: str) -> None:
    run = tmp_path / "run"
    base = ["train", "--task", "text", "--data", str(jsonl), "--spans", "email,phone", "--method", "fdp",
            "--epsilon", "3", "--noise", kind, *flags]  # fmt: skip
    summary = _run(capsys, [*base, "--out", str(run), "--json"])
    assert summary["noise"] == kind and summary["bands"] == bands and summary["epsilon"] <= 3
    assert summary["correlated_noise"]["noise"] == kind
    info = json.loads((run / "run.json").read_text())
    assert info["plan"]["noise"]["kind"] == kind and info["plan"]["noise"].get("bands") == bands
    assert f"noise {kind}" in info["result"]["guarantee"]
    assert main(base) == 0
    printed = capsys.readouterr().out
    assert says in printed
    if kind == "blt":  # the printed line is the report's: buffers, epoch length and the sensitivity ε is taken at
        block = summary["correlated_noise"]
        assert f"noise             blt, {block['buffers']} buffer" in printed
        assert f"epochs of {block['min_separation']} steps" in printed and "(no amplification)" in printed
        assert len(info["plan"]["noise"]["coeffs"]) == 2 * block["buffers"]


@pytest.mark.parametrize("kind", ["bandmf", "blt"])
def test_train_text_refuses_correlated_noise_where_it_does_not_apply(jsonl: Path, capsys: pytest.CaptureFixture[str],
                                                                     kind: str) -> None:
    base = ["train", "--task", "text", "--data", str(jsonl), "--spans", "email,phone", "--epsilon", "3",
            "--noise", kind]  # fmt: skip
    _refused(capsys, [*base, "--method", "public"], f"--noise {kind} is for the private methods")
    _refused(capsys, [*base, "--method", "nonprivate"], f"--noise {kind} is for the private methods")
    if kind == "blt":  # BLT chooses its own strategy: a --bands would be silently unused
        _refused(capsys, [*base, "--method", "fdp", "--bands", "2"], "--bands is for --noise bandmf, got --bands 2 "
                                                                     "with --noise blt")
