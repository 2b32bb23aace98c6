"""Text data: the byte tokenizer, the generated PII corpus, canaries and the token batches of Ψ(text).

The attacker's question throughout: can anything of a private span's contents reach ``x_pub``/``y_pub``? A test
changes only the contents of the spans and checks the public tokens bitwise (and that the full text did change).
"""

from __future__ import annotations

import collections
import json
import re

import numpy as np
import pytest
import torch

from featuredp.data.text import (
    IGNORE_INDEX,
    PLACEHOLDER_TYPES,
    ByteTokenizer,
    TextDataset,
    TextRecord,
    Tokenizer,
    insert_canaries,
    load_text_jsonl,
    split_records,
    text_datasets_from_records,
    write_jsonl,
)
from featuredp.data.text_corpus import generator_names, luhn_valid, support_dialogues
from featuredp.errors import DataValidationError
from featuredp.features.text import Span, TextSpans, detect_spans, load_annotated_jsonl, placeholder

TYPES = ("name", "email", "phone", "card", "number", "date", "address")
PSI = TextSpans(TYPES)
TOK = ByteTokenizer()


# ------------------------------------------------------------------------------------------------ tokenizer


def test_vocabulary_is_fixed_bytes_then_specials_then_one_token_per_placeholder():
    assert (TOK.bos_id, TOK.eos_id, TOK.pad_id, TOK.vocab_size) == (256, 257, 258, 267)
    assert PLACEHOLDER_TYPES == ("name", "email", "phone", "card", "number", "date", "address", "secret")
    assert [TOK.placeholder_id(t) for t in PLACEHOLDER_TYPES] == list(range(259, 267))
    assert isinstance(TOK, Tokenizer) and ByteTokenizer() == TOK
    with pytest.raises(ValueError, match="span_type must be one of"):
        TOK.placeholder_id("iban")


@pytest.mark.parametrize("text", ["", "plain ascii", "Zoë, Łukasz, Søren: ¿qué? 東京 🙂", "[EMAIL][NAME]x[SECRET]",
                                  "[IBAN] and [email] stay bytes", "[[CARD]]", "tab\tnew\nline\x00"])
def test_round_trip(text):
    assert TOK.decode(TOK.encode(text)) == text


def test_placeholders_are_one_token_and_unknown_ones_are_bytes():
    ids = TOK.encode("a[EMAIL]b[IBAN]")
    assert ids == [97, TOK.placeholder_id("email"), 98, *b"[IBAN]"]
    assert TOK.encode("é") == [0xC3, 0xA9]
    assert all(0 <= i < TOK.vocab_size for i in TOK.encode("🙂[NAME]"))


def test_decode_drops_bos_eos_pad_and_refuses_foreign_ids():
    assert TOK.decode([TOK.bos_id, 104, 105, TOK.eos_id, TOK.pad_id, TOK.pad_id]) == "hi"
    assert TOK.decode([0xC3]) == "\ufffd"  # a cut UTF-8 character (a generation stopped mid-character)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        TOK.decode([267])


# ------------------------------------------------------------------------------------------------ generated corpus


def test_generator_is_reproducible_from_its_public_seed():
    a, b, c = support_dialogues(200, seed=5), support_dialogues(200, seed=5), support_dialogues(200, seed=6)
    assert a == b and a != c
    assert support_dialogues(50, seed=5) == a[:50]


def test_a_byte_limit_too_small_is_an_error_not_a_hang():
    assert all(len(r.text.encode()) <= 60 for r in support_dialogues(50, seed=0, max_bytes=60))
    with pytest.raises(ValueError, match="max_bytes=30 is too small"):
        support_dialogues(1, max_bytes=30)


def test_generated_texts_fit_the_rows_and_cover_every_type():
    recs = support_dialogues(2000, seed=0)
    assert max(len(r.text.encode("utf-8")) for r in recs) <= 120  # + BOS (and EOS) fit L = 128
    counts = collections.Counter(s.type for r in recs for s in r.spans)
    assert set(counts) == set(TYPES) and min(counts.values()) > 100
    assert any(not r.text.isascii() for r in recs)
    assert len({r.text for r in recs}) > 1900


def test_ground_truth_spans_are_what_the_detectors_find():
    """The truth and the detectors agree exactly, so a detecting Ψ can be checked against the annotations."""
    recs = support_dialogues(1500, seed=1)
    for r in recs:
        found = detect_spans(r.text, ("email", "phone", "card", "number", "date"))
        assert found == [s for s in r.spans if s.type not in ("name", "address")], r.text
    # names: the detector given every first name and the full names the corpus uses finds exactly the truth
    # (no first name hides inside another word, a street, a city or an email)
    first, _ = generator_names()
    names = sorted({*first, *(v for r in recs for v in r.values("name"))})
    # (case-insensitive, so it also finds the lower-case first names inside the emails: they are hidden with them)
    for r in recs[:300]:
        truth = [s for s in r.spans if s.type == "name"]
        emails = [s for s in r.spans if s.type == "email"]
        found = detect_spans(r.text, ("name",), names=names)
        assert [s for s in found if not any(e.start <= s.start and s.end <= e.end for e in emails)] == truth, r.text


def test_cards_are_luhn_valid_and_phones_have_several_formats():
    recs = support_dialogues(1500, seed=2)
    cards = [v for r in recs for v in r.values("card")]
    assert cards and all(luhn_valid(c) for c in cards)
    assert {len(re.sub(r"\D", "", c)) for c in cards} == {15, 16}
    phones = [v for r in recs for v in r.values("phone")]
    shapes = {re.sub(r"\d", "9", p) for p in phones}
    assert {"999-999-9999", "(999) 999-9999", "999.999.9999", "+9 999 999 9999", "+99 99 9999 9999"} <= shapes
    assert not luhn_valid("4111 1111 1111 1112") and not luhn_valid("")


def test_write_jsonl_is_the_annotated_format(tmp_path):
    recs = support_dialogues(30, seed=3)
    path = tmp_path / "chats.jsonl"
    write_jsonl(recs, path)
    assert [TextRecord(t, s) for t, s in load_annotated_jsonl(path)] == recs
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert set(first) == {"text", "spans"} and set(first["spans"][0]) == {"start", "end", "type"}


def test_record_spans_must_lie_inside_the_text():
    with pytest.raises(ValueError, match="ends after the text"):
        TextRecord("abc", [Span(1, 5, "name")])


# ------------------------------------------------------------------------------------------------ canaries


def test_canaries_repeat_counts_secrets_and_positions():
    recs = support_dialogues(300, seed=4)
    out, canaries = insert_canaries(recs, repeats=(1, 10, 100), per_repeat=3, rng=np.random.default_rng(0))
    assert len(canaries) == 9 and [c.repeats for c in canaries] == [1] * 3 + [10] * 3 + [100] * 3
    assert len(out) == len(recs) + 3 * (1 + 10 + 100)
    texts = collections.Counter(r.text for r in out)
    for c in canaries:
        assert c.text == f"my pin is {c.secret}" and c.prefix == "my pin is " and re.fullmatch(r"\d{4}", c.secret)
        assert texts[c.text] == c.repeats
    assert len({c.secret for c in canaries}) == 9
    # every copy marks its secret as a "secret" span; the originals keep their order
    copies = [r for r in out if r.text.startswith("my pin is ")]
    assert all(r.values() == [r.text[10:]] and r.spans[0].type == "secret" for r in copies)
    assert [r for r in out if not r.text.startswith("my pin is ")] == recs
    # the copies are spread out, not appended
    where = [i for i, r in enumerate(out) if r.text.startswith("my pin is ")]
    assert where[0] < len(out) // 4 and where[-1] > 3 * len(out) // 4
    # the same public seed gives the same canaries; another seed others
    again, same = insert_canaries(recs, repeats=(1, 10, 100), per_repeat=3, rng=np.random.default_rng(0))
    assert same == canaries and again == out
    assert insert_canaries(recs, per_repeat=3, rng=np.random.default_rng(1))[1] != canaries


def test_canary_secret_is_hidden_by_a_psi_that_declares_it():
    out, canaries = insert_canaries([], repeats=(2,), per_repeat=2, rng=np.random.default_rng(3),
                                    template="the code {secret} opens it", digits=6)  # fmt: skip
    ds = TextDataset(out, TextSpans(("secret",)), max_len=40)
    pub = ds.batch()["x_pub"]
    assert (pub == TOK.placeholder_id("secret")).sum(1).tolist() == [1] * 4
    for r, text in zip(out, ds.public_texts()):
        assert text == "the code [SECRET] opens it" and r.values()[0] not in text
    assert sorted({r.values()[0] for r in out}) == sorted(c.secret for c in canaries)
    assert all(len(c.secret) == 6 and c.prefix == "the code " for c in canaries)


def test_canary_arguments_are_checked():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="template must contain"):
        insert_canaries([], rng=rng, template="no secret here")
    with pytest.raises(ValueError, match="per_repeat"):
        insert_canaries([], rng=rng, digits=1, per_repeat=4)  # 12 distinct 1-digit secrets do not exist
    with pytest.raises(TypeError, match="rng must be"):
        insert_canaries([], rng=0)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ datasets


def test_rows_on_a_hand_case():
    rec = TextRecord("Hi Ann, ok", [Span(3, 6, "name")])
    b = TextDataset([rec], PSI, max_len=14).batch()
    bos, eos, pad, name, ig = TOK.bos_id, TOK.eos_id, TOK.pad_id, TOK.placeholder_id("name"), IGNORE_INDEX
    text = list(b"Hi Ann, ok")
    assert b["x"].tolist() == [[bos, *text, pad, pad, pad]]
    assert b["y"].tolist() == [[*text, eos, ig, ig, ig]]
    pub = [*b"Hi ", name, *b", ok"]
    assert b["x_pub"].tolist() == [[bos, *pub, *[pad] * 5]]
    # the placeholder is an input of the public view, never a target (real text never holds it)
    assert b["y_pub"].tolist() == [[*b"Hi ", ig, *b", ok", eos, *[ig] * 5]]
    assert all(v.dtype == torch.int64 for v in b.values())
    kept = TextDataset([rec], PSI, max_len=14, placeholder_targets=True).batch()
    assert kept["y_pub"].tolist() == [[*pub, eos, *[ig] * 5]]


def test_truncation_at_max_len_drops_the_end_and_eos():
    ds = TextDataset([TextRecord("abcdef", []), TextRecord("ab", [])], PSI, max_len=4)
    b = ds.batch()
    assert b["x"][0].tolist() == [TOK.bos_id, *b"abc"] and b["y"][0].tolist() == list(b"abcd")
    assert b["y"][1].tolist() == [*b"ab", TOK.eos_id, IGNORE_INDEX]
    assert ds.truncated == 1 and ds.subset([1]).truncated == 0


def test_length_is_fixed_whatever_the_batch():
    ds = TextDataset(support_dialogues(20, seed=7), PSI, max_len=128)
    for idx in ([0], [3, 4], list(range(20)), []):
        assert {tuple(v.shape) for v in ds.batch(idx).values()} == {(len(idx), 128)}
    short = TextDataset([TextRecord("a", [])], PSI, max_len=128)
    assert short.batch()["x"].shape == (1, 128)


def test_batches_are_deterministic_and_subsets_agree():
    recs = support_dialogues(30, seed=8)
    a, b = TextDataset(recs, PSI), TextDataset(recs, PSI)
    for k, v in a.batch().items():
        assert torch.equal(v, b.batch()[k])
    sub = a.subset([5, 2, 9], name="sub")
    assert sub.name == "sub" and len(sub) == 3 and sub.records == [recs[5], recs[2], recs[9]]
    for k, v in sub.batch().items():
        assert torch.equal(v, a.batch([5, 2, 9])[k])


def _rewrite_spans(record: TextRecord, rng: np.random.Generator) -> TextRecord:
    """The same record with every span's contents replaced by other characters (lengths change too)."""
    parts, spans, at, new_at = [], [], 0, 0
    alphabet = list("abcdefXYZ0123456789@.-é東 ")
    for s in record.spans:
        parts.append(record.text[at : s.start])
        new_at += s.start - at
        value = "".join(rng.choice(alphabet, size=int(rng.integers(1, 30))))
        parts.append(value)
        spans.append(Span(new_at, new_at + len(value), s.type))
        new_at += len(value)
        at = s.end
    parts.append(record.text[at:])
    return TextRecord("".join(parts), spans)


def test_changing_only_span_contents_leaves_the_public_tokens_bitwise_unchanged():
    """The attack: two datasets that differ only inside the private spans must give the same x_pub/y_pub."""
    recs = support_dialogues(200, seed=9)
    rng = np.random.default_rng(0)
    other = [_rewrite_spans(r, rng) for r in recs]
    a, b = TextDataset(recs, PSI).batch(), TextDataset(other, PSI).batch()
    assert torch.equal(a["x_pub"], b["x_pub"]) and torch.equal(a["y_pub"], b["y_pub"])
    changed = (a["x"] != b["x"]).any(1)
    assert bool(changed.all())  # every record had a span, and the full text shows it
    # and no private value's bytes appear in any public row
    tok_rows = TextDataset(recs, PSI).public_texts()
    for r, pub in zip(recs, tok_rows):
        for v in r.values():
            assert v not in pub


def test_a_span_of_an_undeclared_type_stays_public():
    rec = TextRecord("pin 1234 for Ann", [Span(4, 8, "secret"), Span(13, 16, "name")])
    ds = TextDataset([rec], TextSpans(("name",)))
    assert ds.public_texts() == ["pin 1234 for [NAME]"]


def test_detectors_run_on_top_of_annotations():
    psi = TextSpans(("email", "name"), detect=("email",))
    ds = TextDataset([TextRecord("Ann: ann@ex.org", [Span(0, 3, "name")])], psi)
    assert ds.public_texts() == ["[NAME]: [EMAIL]"]


def test_dataset_arguments_are_checked():
    with pytest.raises(ValueError, match="max_len must be >= 2"):
        TextDataset([], PSI, max_len=1)
    with pytest.raises(TypeError, match="psi must be a TextSpans"):
        TextDataset([], lambda t, s: t)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"records\[0\] must be a TextRecord"):
        TextDataset([("text", [])], PSI)  # type: ignore[list-item]
    ds = TextDataset([], PSI)
    assert len(ds) == 0 and ds.batch()["x"].shape == (0, 128) and ds.classes == []
    assert "placeholders" in ds.description and ds.name == "text"


# ------------------------------------------------------------------------------------------------ files and splits


def test_load_text_jsonl_keeps_the_private_spans(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [{"text": "Ann: ann@ex.org, 555-123-4567", "spans": [{"start": 0, "end": 3, "type": "name"},
                                                                   {"start": 17, "end": 29, "type": "phone"}]},
            {"text": "nothing private"}]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    recs = load_text_jsonl(path, spans=("name", "email"), detect=("email",))
    assert [(s.type, recs[0].text[s.start : s.end]) for s in recs[0].spans] == [("name", "Ann"),
                                                                                  ("email", "ann@ex.org")]
    assert recs[1] == TextRecord("nothing private", [])  # the phone annotation was not declared private


def test_load_text_jsonl_refuses_an_empty_file_and_bad_types(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataValidationError, match="holds no records"):
        load_text_jsonl(empty, spans=("email",))
    with pytest.raises(ValueError, match="no built-in detector"):
        load_text_jsonl(empty, spans=("passport",), detect=("passport",))


def test_split_is_reproducible_disjoint_and_checked():
    recs = support_dialogues(100, seed=10)
    train, test = split_records(recs, test_fraction=0.2, split_seed=1)
    assert (len(train), len(test)) == (80, 20) and split_records(recs, test_fraction=0.2, split_seed=1) == (train,
                                                                                                         test)
    assert sorted(r.text for r in train + test) == sorted(r.text for r in recs)
    assert split_records(recs, test_fraction=0.2, split_seed=2)[1] != test
    with pytest.raises(ValueError, match="test_fraction"):
        split_records(recs[:3], test_fraction=0.1)
    with pytest.raises(ValueError, match="test_fraction must be in"):
        split_records(recs, test_fraction=1.0)
    tr, te = text_datasets_from_records(recs, PSI, test_fraction=0.2, split_seed=1, max_len=64, name="chats")
    assert (tr.name, te.name, len(tr), len(te), tr.max_len) == ("chats-train", "chats-test", 80, 20, 64)
    assert tr.records == train


def test_placeholder_strings_match_the_string_psi():
    assert [placeholder(t) for t in PLACEHOLDER_TYPES] == [TOK.decode([TOK.placeholder_id(t)])
                                                           for t in PLACEHOLDER_TYPES]  # fmt: skip
