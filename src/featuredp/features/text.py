"""Ψ for text: private spans (names, emails, phone numbers, ...) replaced by typed placeholders.

Feature DP for text (issue 26) protects the *contents* of declared spans of a record's text, and lets the rest —
the text with each span replaced by its type's placeholder — train freely. This module is that Ψ on strings,
before any tokenisation:

* :class:`Span` — a character range ``[start, end)`` of a text and its type (``"email"``, ``"name"``, ...);
* :func:`detect_spans` — built-in detectors: emails, phone numbers, card numbers (Luhn-checked), other long
  numbers, dates, and names from a list the user gives;
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

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from featuredp.plan import Disclosure

__all__ = [
    "DETECTORS",
    "Span",
    "TextSpans",
    "detect_spans",
    "load_annotated_jsonl",
    "merge_spans",
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


# ----------------------------------------------------------------------------- detectors

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
_PHONE = re.compile(
    r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?|\d{2,4}[\s.-])\d{3,4}[\s.-]?\d{3,4}(?![\w])"
)
_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
           "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")  # fmt: skip
_DATE = re.compile(
    r"\b(?:\d{4}-\d{1,2}-\d{1,2}|\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}"
    rf"|(?:{_MONTHS})\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}|\d{{1,2}}(?:st|nd|rd|th)? (?:{_MONTHS})\.?,? \d{{4}})\b"
)
# not part of a word or a decimal (19.99, v1.2.3); a full stop that ends a sentence may follow
_NUMBER = re.compile(r"(?<![\w.])\d{6,}(?!\w|\.\d)")


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _cards(text: str) -> Iterable[Span]:
    for m in _CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and _luhn(digits):
            yield Span(m.start(), m.end(), "card")


Detector = Callable[[str], Iterable[Span]]


def _regex(pattern: re.Pattern[str], kind: str) -> Detector:
    def find(text: str) -> Iterable[Span]:
        return (Span(m.start(), m.end(), kind) for m in pattern.finditer(text))

    return find


#: the built-in detectors, in priority order (an overlap keeps the earlier type's span)
DETECTORS: dict[str, Detector] = {
    "card": _cards,
    "email": _regex(_EMAIL, "email"),
    "phone": _regex(_PHONE, "phone"),
    "date": _regex(_DATE, "date"),
    "number": _regex(_NUMBER, "number"),
}


def _names(text: str, names: Sequence[str]) -> Iterable[Span]:
    # longest names first, so "Ann Lee" wins over "Ann"
    for name in sorted({n.strip() for n in names if n.strip()}, key=len, reverse=True):
        for m in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", text):
            yield Span(m.start(), m.end(), "name")


def merge_spans(spans: Iterable[Span], priority: Sequence[str] = ()) -> list[Span]:
    """Non-overlapping spans, sorted: of overlapping spans the earlier one in ``priority`` (then the longer, then
    the first) is kept whole, and any other span that overlaps a kept one is dropped."""
    rank = {t: i for i, t in enumerate(priority)}
    ordered = sorted(spans, key=lambda s: (rank.get(s.type, len(rank)), -(s.end - s.start), s.start))
    kept: list[Span] = []
    for s in ordered:
        if all(s.end <= k.start or s.start >= k.end for k in kept):
            kept.append(s)
    return sorted(kept)


def detect_spans(text: str, types: Sequence[str] = ("email", "phone", "card", "number", "date"),
                 names: Sequence[str] = ()) -> list[Span]:  # fmt: skip
    """The spans of ``types`` the built-in detectors find in ``text`` (``"name"``: the strings in ``names``).

    >>> [(s.type, "x: ann@ex.org, 555-123-4567"[s.start:s.end]) for s in detect_spans("x: ann@ex.org, 555-123-4567")]
    [('email', 'ann@ex.org'), ('phone', '555-123-4567')]
    """
    unknown = sorted(set(types) - set(DETECTORS) - {"name"})
    if unknown:
        raise ValueError(f"--spans: no built-in detector for {', '.join(unknown)}; built in: "
                         f"{', '.join([*DETECTORS, 'name'])} (other types come from your annotations)")
    if "name" in types and not names:
        raise ValueError("--spans name needs the list of names to find (a file with one name per line)")
    found: list[Span] = []
    for kind in types:
        if kind == "name":
            found.extend(_names(text, names))
        else:
            found.extend(DETECTORS[kind](text))
    return merge_spans(found, priority=[*DETECTORS, "name"])


# ----------------------------------------------------------------------------- annotations


def load_annotated_jsonl(path: str | Path) -> list[tuple[str, list[Span]]]:
    """``(text, spans)`` per line of a JSONL file of ``{"text": ..., "spans": [{"start", "end", "type"}]}``.

    Every line is checked before any is returned: valid JSON, a string ``text``, offsets inside it; spans that
    overlap are merged into one span of the first one's type (an overlap would leave a piece of one of them in
    the public text otherwise). A bad line is a one-line error naming the file, the line and the problem.
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
            out.append((text, _union(spans)))
    return out


def _union(spans: Sequence[Span]) -> list[Span]:
    """Overlapping spans joined into one (the type of the first that starts)."""
    merged: list[Span] = []
    for s in sorted(spans):
        if merged and s.start < merged[-1].end:
            last = merged.pop()
            merged.append(Span(last.start, max(last.end, s.end), last.type))
        else:
            merged.append(s)
    return merged


# ----------------------------------------------------------------------------- Ψ


@dataclass(frozen=True)
class TextSpans:
    """Ψ(x) for text: ``x`` with each private span replaced by its type's placeholder.

    ``types``: the span types that are private (annotated spans of other types are left public, and said so by
    :meth:`describe`); ``detect``: the built-in detectors to run on every text in addition to its annotations
    (``names``: the list for ``"name"``). Overlaps between annotations and detections are joined, so no piece of a
    private span stays in the public text.

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
        """The private spans of ``text``: its annotations of a private type and what the detectors find, joined."""
        found = [s for s in annotated if s.type in self.types]
        if self.detect:
            # Detectors read the text with the annotated spans blanked out: otherwise a detection overlapping an
            # annotation would make the joined span's extent (and Ψ) depend on the hidden characters. No detector
            # matches NUL, so a blank acts as the same non-word boundary whatever the span held.
            masked = list(text)
            for s in found:
                masked[s.start:s.end] = "\0" * (s.end - s.start)
            found.extend(detect_spans("".join(masked), self.detect, self.names))
        return _union(found)

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
