"""Ψ for text: private spans (names, emails, phone numbers, ...) replaced by typed placeholders.

Feature DP for text (issue 26) protects the *contents* of declared spans of a record's text, and lets the rest —
the text with each span replaced by its type's placeholder — train freely. This module is that Ψ on strings,
before any tokenisation:

* :class:`Span` — a character range ``[start, end)`` of a text and its type (``"email"``, ``"name"``, ...);
* :func:`detect_spans` — built-in detectors (:data:`DETECTORS`): emails (also obfuscated, IDN and full-width),
  IBANs, card numbers (any 13-19 digits: no Luhn check), US SSNs, dates, phone numbers (international too), other
  numbers of 5+ digits, and names from a list the user gives; they read :func:`normalise` ``(text)`` (NFKD with
  combining marks dropped, look-alike digits, Unicode dashes) and hide the whole original extent of what they
  match, marks included;
* :func:`load_annotated_jsonl` — a user's annotations: one JSON object per line, ``{"text": ..., "spans":
  [{"start": s, "end": e, "type": t}, ...]}``, character offsets, checked up front;
* :class:`TextSpans` — Ψ itself: ``psi(text, spans)`` is the redacted text, deterministic and per example, and
  ``describe()`` says what is hidden and what is not.

What is protected is exactly the spans given (annotated, detected, or both): a span a detector misses, or that
the user did not annotate, is **public** under this Ψ, and so is everything the surrounding text says.
Placeholders keep the span's type (``[EMAIL]``), never its length or contents.

No torch import.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from featuredp.plan import Disclosure

__all__ = [
    "CANARY_SPAN_TYPE",
    "DETECTORS",
    "Span",
    "TextSpans",
    "check_span_types",
    "detect_spans",
    "join_spans",
    "load_annotated_jsonl",
    "merge_spans",
    "normalise",
    "placeholder",
]

_TYPE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True, order=True)
class Span:
    """Characters ``[start, end)`` of a text that are private, and their type (lower case, e.g. ``"email"``)."""

    start: int
    end: int
    type: str

    def __post_init__(self) -> None:
        if not isinstance(self.start, int) or not isinstance(self.end, int) or not 0 <= self.start < self.end:
            raise ValueError(f"span offsets must be integers with 0 <= start < end, got [{self.start}, {self.end})")
        if not isinstance(self.type, str) or not _TYPE.match(self.type):
            raise ValueError(f"span type must be a lower-case identifier (e.g. 'email'), got {self.type!r}")


def placeholder(span_type: str) -> str:
    """The public stand-in of a span of ``span_type``: ``[EMAIL]`` for ``"email"``."""
    return f"[{span_type.upper()}]"


# ----------------------------------------------------------------------------- normalisation

# Unicode dashes and hyphens (U+2011 is the non-breaking hyphen) read as "-" by the detectors
_DASHES = frozenset("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u2e3a\u2e3b\ufe58\ufe63\uff0d")


def _is_mark(ch: str) -> bool:
    """A combining mark (Unicode categories Mn, Mc, Me): it belongs to the character before it."""
    return unicodedata.category(ch) in ("Mn", "Mc", "Me")


def _attached(ch: str) -> bool:
    """Whether ``ch`` goes with the character before it: a combining mark or a format character (a zero-width
    joiner between a letter and its mark must not cut the mark off the letter's span)."""
    return _is_mark(ch) or unicodedata.category(ch) == "Cf"


def _normalise_piece(piece: str) -> str:
    out: list[str] = []
    # NFKD, then every mark dropped: a mark NFKC cannot merge (5 + U+0308) would split a run of digits, and one it
    # merges into a letter (A + U+0301 = Á) would take the letter out of [A-Z]; the detectors see the base
    # characters only, whatever marks a value carries. NFC then recomposes what needs no mark (Hangul jamo).
    base = "".join(ch for ch in unicodedata.normalize("NFKD", piece) if not _is_mark(ch))
    for ch in unicodedata.normalize("NFC", base):
        if ch.isascii():
            out.append(ch)
        elif unicodedata.category(ch) == "Nd":  # Arabic-Indic, Devanagari, ... digits: the digit they are
            out.append(str(unicodedata.decimal(ch)))
        elif ch in _DASHES:
            out.append("-")
        elif ch in "\uff20\ufe6b":
            out.append("@")
        elif unicodedata.category(ch) == "Zs":
            out.append(" ")
        elif unicodedata.category(ch) != "Cf":  # zero-width and other format characters are dropped
            out.append(ch)
    return "".join(out)


def normalise(text: str) -> tuple[str, list[int], list[int]]:
    """``text`` as the detectors read it, and for each of its characters the original ``[start, end)`` it comes from.

    NFKD compatibility forms (full-width letters and digits, ``＠``, mathematical digits, ligatures) with every
    combining mark dropped (categories Mn, Mc, Me: ``5̈`` reads as ``5``, ``é`` as ``e``), every decimal digit as
    its ASCII digit, Unicode dashes as ``-``, odd spaces as a space, format characters (zero-width space, soft
    hyphen) dropped. A base character and the marks and format characters after it are normalised together and
    map to their whole original extent, so a span found on the normalised text hides every original character it
    came from, the marks of its last character included.

    >>> normalise("\uff15\u2011x")
    ('5-x', [0, 1, 2], [1, 2, 3])
    """
    if text.isascii():
        return text, list(range(len(text))), list(range(1, len(text) + 1))
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    i, n = 0, len(text)
    while i < n:
        j = i + 1
        while j < n and _attached(text[j]):
            j += 1
        piece = _normalise_piece(text[i:j])
        chars.append(piece)
        starts.extend([i] * len(piece))
        ends.extend([j] * len(piece))
        i = j
    return "".join(chars), starts, ends


# ----------------------------------------------------------------------------- detectors

# The detectors read the normalised text. None of them matches NUL (the blank of an annotated span), and none
# checks a value (no Luhn, no IBAN checksum, no calendar): which characters are hidden never depends on a digit's
# value, only on the shape of the text.
# Every repetition below is bounded, so that no regex can take time quadratic in a long run of word characters
# (each start tries a bounded match); _emails extends a match left over the rest of an over-long local part.
_LOCAL_CHAR = re.compile(r"[\w.%+\-]")
_LOCAL = r"[\w.%+\-]{1,64}(?:\[[\w-]{1,32}\])?"  # 123+name[bot]@users.noreply.github.com
_LABEL = r"[\w-]{1,63}"
_EMAIL = re.compile(rf"{_LOCAL}@{_LABEL}(?:\.{_LABEL}){{0,8}}\.[^\W\d_]{{2,63}}")
_BR_AT = r"\s*[\[({<]\s*at\s*[\])}>]\s*"
_BR_DOT = r"\s*[\[({<]\s*dot\s*[\])}>]\s*"
# an obfuscated local part may spell its dots too: "ann dot lee at example dot com"
_OB_LOCAL = rf"{_LOCAL}(?:(?:{_BR_DOT}|\s+dot\s+){_LOCAL}){{0,3}}"
# "ann [at] example [dot] com", "ann(at)example(dot)com"
_ANY_DOT = rf"(?:{_BR_DOT}|\s+dot\s+|\.)"
_EMAIL_BRACKETS = re.compile(rf"{_OB_LOCAL}{_BR_AT}{_LABEL}(?:{_ANY_DOT}{_LABEL}){{0,8}}{_ANY_DOT}[^\W\d_]{{2,63}}",
                             re.IGNORECASE)  # fmt: skip
# "ann at example dot com": a spelled "dot" is required, so "meet at example.com" stays text
_EMAIL_WORDS = re.compile(rf"{_OB_LOCAL}\s+at\s+{_LABEL}(?:{_ANY_DOT}{_LABEL}){{0,8}}(?:{_BR_DOT}|\s+dot\s+)"
                          r"[^\W\d_]{2,63}", re.IGNORECASE)  # fmt: skip
_CARD = re.compile(r"(?<!\d)\d(?:[ -]?\d){12,18}(?!\d)")
_PHONE = re.compile(
    r"(?<![\w+])(?P<intl>\+\d{1,3}[ .-]?|00\d{1,3}[ .-])?(?P<area>\(\d{1,5}\)[ .-]?)?"
    r"\d{1,6}(?:[ .-]\d{1,6}){0,6}(?![\w]|[.-]\d)"
)
_SSN = re.compile(r"(?<![\w-])\d{3}[ -]\d{2}[ -]\d{4}(?![\w]|-\d)")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?(?![A-Za-z0-9])",
                   re.IGNORECASE)  # fmt: skip
_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
           "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec")  # fmt: skip
_DATE = re.compile(
    r"\b(?:\d{4}[/.-]\d{1,2}[/.-]\d{1,2}|\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}"
    rf"|(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?|(?:{_MONTHS})\.?,?\s+\d{{4}}"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\.?(?:,?\s+\d{{4}})?)\b",
    re.IGNORECASE,
)
# five or more digits, alone or in groups split by single spaces or dashes (94103, 12 345, 12-34-56); not part
# of a word or a decimal (v1.2.3, 19.99)
_NUMBER = re.compile(r"(?<![\w.])\d(?:[ -]?\d){4,}(?!\w|\.\d)")


Detector = Callable[[str], Iterable[Span]]


def _regex(*patterns: re.Pattern[str], kind: str) -> Detector:
    def find(text: str) -> Iterable[Span]:
        return (Span(m.start(), m.end(), kind) for p in patterns for m in p.finditer(text))

    return find


def _phones(text: str) -> Iterable[Span]:
    for m in _PHONE.finditer(text):
        groups = re.findall(r"\d+", m.group())
        digits = sum(map(len, groups))
        # without a country code or an area code in brackets: at least two groups, the last of 3+ digits, the
        # first of 2+ (555-123-4567, 07700 900123; not 2024-03-05 or 1 000 000)
        marked = bool(m.group("intl") or m.group("area"))
        if 7 <= digits <= 15 and (marked or (len(groups) >= 2 and len(groups[-1]) >= 3 and len(groups[0]) >= 2)):
            yield Span(m.start(), m.end(), "phone")


_HAS_AT = (re.compile("@"), re.compile(r"[\[({<]\s*at\s*[\])}>]", re.IGNORECASE), re.compile(r"\sat\s", re.IGNORECASE))


def _emails(text: str) -> Iterable[Span]:
    for pattern, has_at in zip((_EMAIL, _EMAIL_BRACKETS, _EMAIL_WORDS), _HAS_AT):
        if not has_at.search(text):  # no "at" of this form: the pattern cannot match (and would scan every word)
            continue
        for m in pattern.finditer(text):
            start = m.start()
            while start > 0 and _LOCAL_CHAR.match(text, start - 1):  # the rest of a local part over 64 characters
                start -= 1
            yield Span(start, m.end(), "email")


#: the built-in detectors, in priority order: spans they find that overlap are joined into one span of the
#: earliest type. ``card`` is every run of 13-19 digits (Luhn-valid or not: Ψ never depends on a checksum)
DETECTORS: dict[str, Detector] = {
    "email": _emails,
    "iban": _regex(_IBAN, kind="iban"),
    "card": _regex(_CARD, kind="card"),
    "ssn": _regex(_SSN, kind="ssn"),
    "date": _regex(_DATE, kind="date"),
    "phone": _phones,
    "number": _regex(_NUMBER, kind="number"),
}


@functools.lru_cache(maxsize=8)
def _names_pattern(names: tuple[str, ...]) -> re.Pattern[str] | None:
    # each name's parts joined by any run of whitespace (or a hyphen), case-insensitive; longest first ("Ann Lee"
    # before "Ann")
    parts = {tuple(_normalise_piece(n).split()) for n in names}
    by_length = sorted((p for p in parts if p), key=lambda p: -len(" ".join(p)))
    alternatives = [r"(?:\s+|\s*-\s*)".join(map(re.escape, p)) for p in by_length]  # "Ann  Lee", "ann-lee"
    if not alternatives:
        return None
    return re.compile(rf"(?<!\w)(?:{'|'.join(alternatives)})(?!\w)", re.IGNORECASE)


def _names(text: str, names: Sequence[str]) -> Iterable[Span]:
    pattern = _names_pattern(tuple(names))
    if pattern is not None:
        yield from (Span(m.start(), m.end(), "name") for m in pattern.finditer(text))


def merge_spans(spans: Iterable[Span], priority: Sequence[str] = ()) -> list[Span]:
    """Non-overlapping spans, sorted: of overlapping spans the earlier one in ``priority`` (then the longer, then
    the first) is kept whole, and any other span that overlaps a kept one is dropped (its characters outside the
    kept one stay public: use :func:`join_spans` to hide them)."""
    rank = {t: i for i, t in enumerate(priority)}
    ordered = sorted(spans, key=lambda s: (rank.get(s.type, len(rank)), -(s.end - s.start), s.start))
    kept: list[Span] = []
    for s in ordered:
        if all(s.end <= k.start or s.start >= k.end for k in kept):
            kept.append(s)
    return sorted(kept)


def join_spans(spans: Iterable[Span], priority: Sequence[str] = ()) -> list[Span]:
    """Overlapping spans joined into one that covers them all, sorted; its type is the earliest in ``priority`` of
    the joined spans' types (then the type of the first, in sort order). No character of any span is left out.

    >>> join_spans([Span(0, 5, "number"), Span(3, 9, "card")], priority=("card", "number"))
    [Span(start=0, end=9, type='card')]
    """
    rank = {t: i for i, t in enumerate(priority)}
    groups: list[list[Span]] = []
    for s in sorted(spans):
        if groups and s.start < max(g.end for g in groups[-1]):
            groups[-1].append(s)
        else:
            groups.append([s])
    out = []
    for g in groups:
        label = min(g, key=lambda s: (rank.get(s.type, len(rank)), s))
        out.append(Span(g[0].start, max(s.end for s in g), label.type))
    return out


def detect_spans(text: str, types: Sequence[str] = ("email", "phone", "card", "number", "date"),
                 names: Sequence[str] = ()) -> list[Span]:  # fmt: skip
    """The spans of ``types`` the built-in detectors find in ``text`` (``"name"``: the strings in ``names``).

    The detectors read :func:`normalise` ``(text)``; each span is mapped back to the whole original extent of the
    characters it matched. Overlapping detections are joined (:func:`join_spans`, in the order of
    :data:`DETECTORS`, then ``name``).

    >>> [(s.type, "x: ann@ex.org, 555-123-4567"[s.start:s.end]) for s in detect_spans("x: ann@ex.org, 555-123-4567")]
    [('email', 'ann@ex.org'), ('phone', '555-123-4567')]
    """
    unknown = sorted(set(types) - set(DETECTORS) - {"name"})
    if unknown:
        raise ValueError(f"--spans: no built-in detector for {', '.join(unknown)}; built in: "
                         f"{', '.join([*DETECTORS, 'name'])} (other types come from your annotations)")
    if "name" in types and not names:
        raise ValueError("--spans name needs the list of names to find (a file with one name per line)")
    norm, starts, ends = normalise(text)
    found: list[Span] = []
    for kind in types:
        for s in _names(norm, names) if kind == "name" else DETECTORS[kind](norm):
            found.append(Span(starts[s.start], ends[s.end - 1], s.type))
    return join_spans(found, priority=[*DETECTORS, "name"])


# ----------------------------------------------------------------------------- annotations


def load_annotated_jsonl(path: str | Path) -> list[tuple[str, list[Span]]]:
    """``(text, spans)`` per line of a JSONL file of ``{"text": ..., "spans": [{"start", "end", "type"}]}``.

    Every line is checked before any is returned: valid JSON, a string ``text``, offsets inside it. The spans are
    returned as annotated, overlaps included: which of them are private is for :class:`TextSpans` to say, and
    joining a public annotation with a private one here could hand the private characters the public type. A bad
    line is a one-line error naming the file, the line and the problem.
    """
    p = Path(path)
    out: list[tuple[str, list[Span]]] = []
    with p.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{p}:{i}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise ValueError(f"{where}: each line must be an object with a string \"text\"")
            text = obj["text"]
            spans = []
            for j, raw in enumerate(obj.get("spans") or []):
                try:
                    span = Span(int(raw["start"]), int(raw["end"]), str(raw["type"]))
                except (KeyError, TypeError, ValueError) as exc:
                    raise ValueError(f"{where}: span {j}: {exc}") from None
                if span.end > len(text):
                    raise ValueError(f"{where}: span {j} [{span.start}, {span.end}) ends after the text "
                                     f"({len(text)} characters)")
                spans.append(span)
            out.append((text, spans))
    return out


#: the type of the exposure audit's canaries (:mod:`featuredp.data.text`): always a known span type
CANARY_SPAN_TYPE = "secret"


def check_span_types(types: Sequence[str], present: Iterable[str], source: str) -> None:
    """Refuse a private type that nothing can find: one neither annotated in ``source`` (its types: ``present``) nor
    a built-in detector (nor the canaries' ``secret``), so that a typo (``--spans name,emial``) never trains with
    the span it meant left public. A one-line ValueError naming the unknown types and the types of ``source``."""
    present = sorted(set(present))
    unknown = [t for t in dict.fromkeys(types) if t not in {*present, *DETECTORS, "name", CANARY_SPAN_TYPE}]
    if unknown:
        raise ValueError(f"--spans: unknown span type{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: not "
                         f"annotated in {source} (its types: {', '.join(present) or 'none'}) and no built-in detector "
                         f"({', '.join([*DETECTORS, 'name'])})")  # fmt: skip


# ----------------------------------------------------------------------------- Ψ


def _with_trailing_marks(text: str, span: Span) -> Span:
    """``span`` extended over the combining marks (and format characters) right after it: they belong to its last
    character, and left public they would show what it carried. Reads only characters outside the span."""
    end = span.end
    while end < len(text) and _attached(text[end]):
        end += 1
    return span if end == span.end else Span(span.start, end, span.type)


@dataclass(frozen=True)
class TextSpans:
    """Ψ(x) for text: ``x`` with each private span replaced by its type's placeholder.

    ``types``: the span types that are private (annotated spans of other types are left public, and said so by
    :meth:`describe`); ``detect``: the built-in detectors to run on every text in addition to its annotations
    (``names``: the list for ``"name"``). Annotations of public types are dropped first; then the private
    annotations and the detections are joined where they overlap, so no piece of a private span stays in the public
    text.

    >>> psi = TextSpans(types=("email",), detect=("email",))
    >>> psi("write to ann@ex.org today")
    'write to [EMAIL] today'
    """

    types: tuple[str, ...]
    detect: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.types:
            raise ValueError("TextSpans needs at least one private span type (--spans)")
        for t in self.types:
            if not _TYPE.match(t):
                raise ValueError(f"--spans: span type must be a lower-case identifier, got {t!r}")
        stray = sorted(set(self.detect) - set(self.types))
        if stray:
            raise ValueError(f"detect={stray} are not among the private types {list(self.types)}")
        detect_spans("", self.detect, self.names)  # unknown detectors, a name detector without names: up front

    def spans(self, text: str, annotated: Sequence[Span] = ()) -> list[Span]:
        """The private spans of ``text``: its annotations of a private type and what the detectors find, joined.

        Annotations of other types are dropped *before* anything is joined, so a public annotation overlapping a
        private one (a ``url`` around an ``email``) can neither take a private character out of the hidden set
        nor give its type to the joined span: every character of every private annotation is hidden. A span is
        extended over the combining marks right after it (they belong to its last character)."""
        found = [s for s in annotated if s.type in self.types]
        if self.detect:
            # Detectors read the text with the annotated spans blanked out: otherwise a detection overlapping an
            # annotation would make the joined span's extent (and Ψ) depend on the hidden characters. No detector
            # matches NUL, so a blank acts as the same non-word boundary whatever the span held.
            masked = list(text)
            for s in found:
                masked[s.start:s.end] = "\0" * (s.end - s.start)
            found.extend(detect_spans("".join(masked), self.detect, self.names))
        return join_spans(_with_trailing_marks(text, s) for s in found)

    def __call__(self, text: str, annotated: Sequence[Span] = ()) -> str:
        """The public view of one text (deterministic; reads nothing but this text and its annotations)."""
        parts: list[str] = []
        at = 0
        for s in self.spans(text, annotated):
            parts.extend((text[at:s.start], placeholder(s.type)))
            at = s.end
        parts.append(text[at:])
        return "".join(parts)

    def describe(self) -> Disclosure:
        """What Ψ hides (the contents of the private spans) and what it does not (all else, and missed spans)."""
        detected = f"; detected by featuredp: {', '.join(self.detect)}" if self.detect else ""
        return Disclosure(
            "TextSpans",
            reveals=("the text with each private span replaced by its type's placeholder "
                     f"({', '.join(placeholder(t) for t in self.types)}): the number, types and places of the spans "
                     "and everything around them"),
            hides=f"the contents of spans of types {', '.join(self.types)}",
            details={"types": list(self.types), "detectors": list(self.detect), "names_listed": len(self.names),
                     "not_protected": "a span that is neither annotated nor found by a detector is public"
                                      + detected},
        )  # fmt: skip
