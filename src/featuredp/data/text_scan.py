"""What the text boundary Ψ does on a user's annotated JSONL file (``featuredp data scan``), before training.

:func:`scan_text_file` reads ``{"text": ..., "spans": [{"start", "end", "type"}]}`` per line and reports, as
counts and Ψ(x) only (never a private value):

* ``records``, ``annotated`` (annotated spans per type) and ``detected`` (spans the detectors add to Ψ per type:
  the private spans of :meth:`~featuredp.features.text.TextSpans.spans` that are not annotations; the detectors
  read the text with the private annotations blanked, so these counts are a function of Ψ(x) and the
  annotations' places — two files that differ only inside a private span give the same ``records``,
  ``annotated`` and ``detected``);
* ``recall`` — per type both annotated and detected: the share of annotated spans that the detector of that type
  hides completely (every character covered by a detection of the same type, run on the raw text), with a 95 %
  Clopper–Pearson interval: a statistic **of the private values** (how well the detector would have done where
  nobody annotated), for the data owner's eyes;
* ``repeated`` — per private type: in how many distinct records the most repeated values appear (case- and
  whitespace-normalised), top 10 as numbers, and ``max``: also a statistic of the private values. A value held by
  k records is a *group* of k records, protected at the group ε
  (:func:`featuredp.accounting.group.group_epsilon`), not the per-record one;
* ``sample`` — a few Ψ(x) lines drawn with OS entropy (not a fixed function of the file's order).

No torch import (``featuredp data scan`` starts fast and runs where torch is absent).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from featuredp.features.text import DETECTORS, Span, TextSpans, detect_spans, load_annotated_jsonl
from featuredp.users import read_user_field

__all__ = ["SAMPLE_CHARS", "TOP_REPEATS", "boundary_counts", "clopper_pearson", "default_detectors", "normalise_value",
           "scan_text_file"]  # fmt: skip

#: the most characters of one sampled Ψ(x) line
SAMPLE_CHARS = 160
#: how many of the most repeated values' record counts are reported per type
TOP_REPEATS = 10


def default_detectors(names_given: bool) -> list[str]:
    """Every built-in detector of :data:`~featuredp.features.text.DETECTORS`, and ``name`` when names are given."""
    return [*DETECTORS, *(["name"] if names_given else [])]


def normalise_value(value: str) -> str:
    """A span's value compared across records: case-folded, runs of whitespace as one space, trimmed."""
    return " ".join(value.casefold().split())


def clopper_pearson(found: int, of: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper–Pearson) ``level`` interval of a binomial proportion ``found``/``of`` (``of`` >= 1).

    >>> [round(v, 3) for v in clopper_pearson(9, 10)]
    [0.555, 0.997]
    """
    a = (1 - level) / 2
    lower = 0.0 if found == 0 else float(stats.beta.ppf(a, found, of - found + 1))
    upper = 1.0 if found == of else float(stats.beta.ppf(1 - a, found + 1, of - found))
    return lower, upper


def _covered(span: Span, found: Sequence[Span]) -> bool:
    """Whether ``found`` (spans of ``span``'s type) covers every character of ``span``."""
    at = span.start
    for s in sorted(found):
        if s.start > at:
            break
        at = max(at, s.end)
        if at >= span.end:
            return True
    return at >= span.end


def _check_types(spans: Sequence[str] | None, detect: Sequence[str] | None, names: Sequence[str],
                 annotated: set[str]) -> tuple[list[str], list[str]]:  # fmt: skip
    known = [*DETECTORS, "name"]
    if detect is None:
        detect = default_detectors(bool(names))
    for d in detect:
        if d not in known:
            raise ValueError(f"--detect: no built-in detector {d!r}; built in: {', '.join(known)}")
    if "name" in detect and not names:
        raise ValueError("--detect name needs --names-file FILE (one name per line)")
    if spans is None:
        spans = sorted(annotated)
    for t in spans:
        if t not in annotated and t not in known:
            raise ValueError(f"--spans: type {t!r} is neither annotated in the file (types: "
                             f"{', '.join(sorted(annotated)) or 'none'}) nor a built-in detector ({', '.join(known)})")
    return list(dict.fromkeys(spans)), list(dict.fromkeys(detect))


def _tally(rows: Sequence[tuple[str, Sequence[Span]]], psi: TextSpans, repeat_types: Sequence[str],
           ) -> tuple[dict[str, int], dict[str, int], dict[str, list[int]]]:  # fmt: skip
    """(annotated spans per type, spans the detectors add per detector type, per type of ``repeat_types`` the
    number of records holding each distinct value, largest first)."""
    annotated: dict[str, int] = {}
    detected: dict[str, int] = dict.fromkeys(psi.detect, 0)
    holders: dict[str, dict[str, set[int]]] = {t: {} for t in repeat_types}
    for i, (text, ann) in enumerate(rows):
        for s in ann:
            annotated[s.type] = annotated.get(s.type, 0) + 1
        private_ann = {s for s in ann if s.type in psi.types}
        for s in psi.spans(text, ann):
            if s not in private_ann:
                detected[s.type] = detected.get(s.type, 0) + 1
            if s.type in holders:
                holders[s.type].setdefault(normalise_value(text[s.start:s.end]), set()).add(i)
    counts = {t: sorted((len(r) for r in by_value.values()), reverse=True) for t, by_value in holders.items()}
    return dict(sorted(annotated.items())), detected, counts


def boundary_counts(rows: Sequence[tuple[str, Sequence[Span]]], psi: TextSpans,
                    repeat_types: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """What ``train --task text`` reports of its training texts: ``annotated`` and ``detected`` spans per type
    (functions of Ψ(x) and the annotations' places), and only when ``repeat_types`` are given, ``largest_repeat``:
    per type of ``repeat_types``, the most records that hold one value (0: no value).

    ``rows``: (text, annotated spans) per training record. The repeat count is a statistic of the private values
    (which of them are equal), not covered by ε: ``train --task text`` computes it only with ``--group-stats``.
    """
    annotated, detected, counts = _tally(rows, psi, repeat_types)
    out: dict[str, Any] = {"annotated": annotated, "detected": detected}
    if repeat_types:
        out["largest_repeat"] = {t: (c[0] if c else 0) for t, c in counts.items()}
    return out


def records_per_user(path: str | Path, field: str) -> dict[str, Any]:
    """How many records each user holds, by the JSONL field ``field`` (``--user-field``): the number of users and
    the records per user (largest, 99th percentile, median), never the users' values. A record without the field
    is a ValueError naming its line."""
    counts: dict[str, int] = {}
    for value in read_user_field(path, field):
        counts[value] = counts.get(value, 0) + 1
    per = np.sort(np.fromiter(counts.values(), dtype=np.int64))[::-1]
    return {"field": field, "users": int(per.size), "largest": int(per[0]),
            "p99": float(np.percentile(per, 99)), "median": float(np.median(per)),
            "top": [int(c) for c in per[:TOP_REPEATS]]}  # fmt: skip


def scan_text_file(path: str | Path, *, spans: Sequence[str] | None = None, detect: Sequence[str] | None = None,
                   names: Sequence[str] = (), sample: int = 5, user_field: str | None = None
                   ) -> dict[str, Any]:  # fmt: skip
    """What Ψ does on an annotated JSONL file: the counts of the module docstring and ``sample`` Ψ(x) lines.

    ``spans``: the private types (default: every annotated type); ``detect``: built-in detectors to run (default:
    all but ``name``, and ``name`` too when ``names`` are given); Ψ hides ``spans`` and ``detect`` types. Returns
    ``records``, ``annotated``, ``detected``, ``recall`` (type → ``found``, ``of``, ``rate``, ``lower``,
    ``upper``), ``repeated`` (type → ``top``: record counts, largest first; ``max``), ``sample``, ``spans``,
    ``detect``; with ``user_field``, ``users`` (:func:`records_per_user`). A bad flag or file is a ValueError naming
    it (before any work).
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"FILE {str(path)!r}: no such file")
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise ValueError(f"--sample must be a non-negative integer, got {sample!r}")
    rows = load_annotated_jsonl(p)
    if not rows:
        raise ValueError(f"FILE {str(path)!r} holds no records (expected one JSON object per line)")
    users = None if user_field is None else records_per_user(p, user_field)
    annotated_types = {s.type for _, ann in rows for s in ann}
    spans_, detect_ = _check_types(spans, detect, names, annotated_types)
    psi = TextSpans(tuple(dict.fromkeys([*spans_, *detect_])), tuple(detect_), tuple(names))
    annotated, detected, holders = _tally(rows, psi, spans_)
    hits: dict[str, list[int]] = {}  # type -> [found, of]
    recall_types = [t for t in detect_ if t in annotated_types]
    for text, ann in rows:
        for t in recall_types:
            mine = [s for s in ann if s.type == t]
            if not mine:
                continue
            found = [s for s in detect_spans(text, (t,), names) if s.type == t]
            h = hits.setdefault(t, [0, 0])
            h[0] += sum(_covered(s, found) for s in mine)
            h[1] += len(mine)
    recall: dict[str, dict[str, Any]] = {}
    for t, (found_n, of) in sorted(hits.items()):
        lower, upper = clopper_pearson(found_n, of)
        recall[t] = {"found": found_n, "of": of, "rate": found_n / of, "lower": lower, "upper": upper}
    repeated: dict[str, dict[str, Any]] = {}
    for t, counts in holders.items():
        repeated[t] = {"top": counts[:TOP_REPEATS], "max": counts[0] if counts else 0}
    picks = random.SystemRandom().sample(range(len(rows)), min(sample, len(rows)))
    lines = []
    for i in picks:
        public = psi(*rows[i])
        lines.append(public if len(public) <= SAMPLE_CHARS else public[: SAMPLE_CHARS - 1] + "…")
    return {"records": len(rows), "annotated": dict(sorted(annotated.items())), "detected": detected,
            "recall": recall, "repeated": repeated, "sample": lines, "spans": spans_, "detect": detect_,
            **({} if users is None else {"users": users})}  # fmt: skip
