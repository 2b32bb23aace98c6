"""Ψ for text: what an attacker reads in the redacted text must not contain any private span's contents."""

from __future__ import annotations

import json

import pytest

from featuredp.features.text import Span, TextSpans, detect_spans, load_annotated_jsonl, merge_spans

ALL = ("email", "phone", "card", "number", "date", "name")
TEXT = ("Hi, this is Maria Gomez (maria.gomez@example.com, +44 20 7946 0958). My card 4111-1111-1111-1111 was "
        "charged twice on 2024-03-05; order 88123456. Call back on (555) 010-2299 or write to Maria.")  # fmt: skip
SECRETS = ["Maria Gomez", "maria.gomez@example.com", "+44 20 7946 0958", "4111-1111-1111-1111", "2024-03-05",
           "88123456", "(555) 010-2299", "Maria"]  # fmt: skip


def test_no_piece_of_a_private_span_survives_in_the_public_text():
    psi = TextSpans(types=ALL, detect=ALL, names=("Maria Gomez", "Maria"))
    public = psi(TEXT)
    for secret in SECRETS:
        assert secret not in public, secret
    assert public.count("[NAME]") == 2 and "[EMAIL]" in public and public.count("[PHONE]") == 2
    assert "charged twice on [DATE]; order [NUMBER]" in public
    assert psi(TEXT) == public  # deterministic


def test_each_detector_finds_its_kind_and_not_the_others():
    found = {(s.type, TEXT[s.start:s.end]) for s in detect_spans(TEXT, ALL, names=("Maria Gomez", "Maria"))}
    assert ("card", "4111-1111-1111-1111") in found and ("email", "maria.gomez@example.com") in found
    assert ("number", "88123456") in found and ("date", "2024-03-05") in found
    # a 16-digit number failing the Luhn check is a card all the same: Ψ never depends on a checksum
    assert [s.type for s in detect_spans("id 4111111111111112", ("card", "number"))] == ["card"]
    assert [s.type for s in detect_spans("id 4111111111111112", ("number",))] == ["number"]
    # a short number, a version string and a price are not private numbers
    assert detect_spans("room 12, v1.2.3, costs 19.99", ALL, names=("x",)) == []


def test_overlapping_spans_leave_nothing_between_them():
    psi = TextSpans(types=("name", "email"))
    text = "Ann Lee <ann.lee@example.org>"
    annotated = [Span(0, 7, "name"), Span(4, 16, "email"), Span(9, 28, "email")]  # overlapping, sloppy
    assert psi(text, annotated) == "[NAME]>"
    assert merge_spans([Span(0, 5, "number"), Span(0, 19, "card")], priority=("card", "number")) == [
        Span(0, 19, "card")]


def test_annotations_of_a_public_type_stay_public_and_describe_says_what_is_not_protected():
    psi = TextSpans(types=("email",))
    text = "Bob at bob@example.org"
    assert psi(text, [Span(0, 3, "name"), Span(7, 22, "email")]) == "Bob at [EMAIL]"
    d = psi.describe()
    assert d.hides == "the contents of spans of types email"
    assert "neither annotated nor found by a detector is public" in d.details["not_protected"]


def test_annotated_jsonl_is_checked_line_by_line(tmp_path):
    good = tmp_path / "ok.jsonl"
    good.write_text(json.dumps({"text": "mail a@b.co now", "spans": [{"start": 5, "end": 11, "type": "email"}]})
                    + "\n\n" + json.dumps({"text": "nothing here"}) + "\n")
    rows = load_annotated_jsonl(good)
    assert rows == [("mail a@b.co now", [Span(5, 11, "email")]), ("nothing here", [])]
    bad = tmp_path / "bad.jsonl"
    for line, message in [("{not json", r"bad.jsonl:1: not valid JSON"),
                          (json.dumps({"text": "abc", "spans": [{"start": 1, "end": 9, "type": "x"}]}),
                           r"bad.jsonl:1: span 0 \[1, 9\) ends after the text \(3 characters\)"),
                          (json.dumps({"text": "abc", "spans": [{"start": 2, "end": 1, "type": "x"}]}),
                           r"bad.jsonl:1: span 0: span offsets"),
                          (json.dumps({"spans": []}), r'bad.jsonl:1: each line must be an object with a string')]:
        bad.write_text(line + "\n")
        with pytest.raises(ValueError, match=message):
            load_annotated_jsonl(bad)


@pytest.mark.parametrize("kwargs,message", [
    ({"types": ()}, "at least one private span type"),
    ({"types": ("Email",)}, "lower-case identifier"),
    ({"types": ("email",), "detect": ("phone",)}, "not among the private types"),
    ({"types": ("passport",), "detect": ("passport",)}, "no built-in detector for passport"),
    ({"types": ("name",), "detect": ("name",)}, "needs the list of names"),
])
def test_bad_declarations_are_one_line_errors_up_front(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TextSpans(**kwargs)


def test_detections_never_read_inside_annotated_spans():
    """Attacker: an annotation overlapping what a detector would find must not let the hidden characters decide
    how far the joined span reaches (Ψ would then reveal them)."""
    psi = TextSpans(("number",), detect=("number",))
    ann = [Span(3, 6, "number")]
    views = {psi(text, ann) for text in ("id 1234567", "id abc4567", "id 9994567", "id ---4567")}
    assert len(views) == 1, views
    # detections elsewhere in the text still run
    assert psi("id abc4567 and 99999999", ann).endswith("and [NUMBER]")
