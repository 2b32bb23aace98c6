"""The text data's boundary (issue 34): nothing the loader prints or refuses depends on what the spans hide."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from featuredp.data.text import TextDataset, TextRecord, load_text_jsonl
from featuredp.experiments.text_lm import load_text_data
from featuredp.features.text import Span, TextSpans


def _neighbours(secret_len: int) -> list[TextRecord]:
    """Texts whose Ψ is the same whatever ``secret_len``: a short public part around a private span."""
    out = []
    for i in range(20):
        text = f"note {i}: my secret is " + "z" * secret_len + " ok"
        at = text.index("z")
        out.append(TextRecord(text, [Span(at, at + secret_len, "secret")]))
    return out


def test_truncation_is_counted_on_the_public_view_only():
    """Attacker: two neighbouring datasets (same Ψ, spans of different length) must print the same count."""
    psi = TextSpans(("secret",))
    short, long = (TextDataset(_neighbours(n), psi, max_len=40) for n in (3, 200))
    assert [psi(r.text, r.spans) for r in short.records] == [psi(r.text, r.spans) for r in long.records]
    assert short.truncated == long.truncated == 0
    assert short.subset([0, 1]).truncated == long.subset([0, 1]).truncated == 0
    # a public view that does not fit is counted
    assert TextDataset(_neighbours(3), psi, max_len=16).truncated == 20


def _file(tmp_path: Path, secret_len: int) -> Path:
    path = tmp_path / f"chats{secret_len}.jsonl"
    lines = []
    for r in _neighbours(secret_len):
        spans = [{"start": s.start, "end": s.end, "type": "email"} for s in r.spans]
        lines.append(json.dumps({"text": r.text, "spans": spans}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_text_data_reports_the_same_truncation_for_neighbouring_files(tmp_path):
    counts = {load_text_data(path=_file(tmp_path, n), spans=["email"], canary_repeats=(), max_len=40).train.truncated
              for n in (3, 300)}  # fmt: skip
    assert counts == {0}


def test_a_span_type_typo_is_refused_naming_the_types_of_the_file(tmp_path):
    path = _file(tmp_path, 3)
    with pytest.raises(ValueError, match=r"unknown span type emial: not annotated in chats3.jsonl \(its types: "
                                         r"email\)"):
        load_text_data(path=path, spans=["name", "emial"], canary_repeats=())
    with pytest.raises(ValueError, match=r"^--spans: unknown span type emial"):
        load_text_jsonl(path, spans=["emial"])
    # built-in detectors and the canaries' type are known even where nothing in the file has them
    assert len(load_text_jsonl(path, spans=["email", "ssn", "secret"])) == 20
    with pytest.raises(ValueError, match=r"unknown span type emial: the generated corpus has name, email"):
        load_text_data(spans=["emial"], canary_repeats=(), n_train=10, n_test=10)
