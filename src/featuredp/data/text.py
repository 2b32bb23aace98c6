"""Text data for feature DP on language models: a byte tokenizer, a generated corpus with PII, canaries, datasets.

* :class:`ByteTokenizer` — UTF-8 bytes (ids 0..255), then BOS, EOS, PAD, then one id per known placeholder type
  (``[NAME]``, ``[EMAIL]``, ...). The vocabulary is fixed in code: nothing about it is read from the data.
* :class:`TextRecord` — a text and its private spans; :func:`write_jsonl` writes records in the annotated JSONL
  format (the generated corpus with PII is :mod:`featuredp.data.text_corpus`).
* :func:`insert_canaries` — Carlini et al. (2019) canaries ("my pin is 4821") repeated 1, 10, 100 times, their
  secrets marked as spans of type ``"secret"``.
* :class:`TextDataset` — records + Ψ (:class:`~featuredp.features.text.TextSpans`) → the token batch of
  the design of issue 26: ``"x"``, ``"y"`` (the full text) and ``"x_pub"``, ``"y_pub"`` (Ψ(text)), int64, a
  fixed length L per dataset, right-padded, ``BOS`` first, ``EOS`` as the last target, ``-100`` = ignored.
  :func:`load_text_jsonl`, :func:`split_records` and :func:`text_datasets_from_records` build train/test sets.

Right padding with a causal model means padding never reaches a real position, so each example's loss depends on
its own row only. Ψ is applied to each record's text with that record's spans, nothing else: ``x_pub`` and
``y_pub`` are the tokens of ``psi(text, spans)``, which contains no character of a private span.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from featuredp._io import atomic_write_text
from featuredp._validate import check_int, check_open_unit
from featuredp.errors import DataValidationError
from featuredp.features.text import Span, TextSpans, check_span_types, load_annotated_jsonl, placeholder
from featuredp.users import read_user_field

__all__ = [
    "IGNORE_INDEX",
    "PLACEHOLDER_TYPES",
    "ByteTokenizer",
    "Canary",
    "TextDataset",
    "TextRecord",
    "Tokenizer",
    "insert_canaries",
    "load_text_jsonl",
    "split_records",
    "text_datasets_from_records",
    "write_jsonl",
]

#: the span types that have their own token, in the order of their ids (after BOS, EOS, PAD). A new type goes at the
#: end (old ids keep their meaning) and changes ``vocab_size`` and so every model spec; the detectors' ``iban`` and
#: ``ssn`` are left out on purpose: their placeholders are bytes, and runs saved before them stay loadable
PLACEHOLDER_TYPES: tuple[str, ...] = ("name", "email", "phone", "card", "number", "date", "address", "secret")
#: the target that the loss ignores (``torch.nn.functional.cross_entropy``'s default ``ignore_index``)
IGNORE_INDEX = -100


# ============================================================================================ tokenizer


@runtime_checkable
class Tokenizer(Protocol):
    """What the LM helpers (:mod:`featuredp.lm`) need of a tokenizer: ids of text, text of ids, the specials."""

    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS or EOS)."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``."""


class ByteTokenizer:
    """UTF-8 bytes plus special tokens; a placeholder string ``[TYPE]`` of a known type is one token.

    Ids 0..255 are the bytes, then ``bos_id`` = 256, ``eos_id`` = 257, ``pad_id`` = 258, then one id per type of
    :data:`PLACEHOLDER_TYPES` in that order (``[NAME]`` = 259, ..., ``[SECRET]`` = 266): ``vocab_size`` = 267.
    The vocabulary is fixed here, never inferred from data, so it reveals nothing about a training set.
    A placeholder of another type (``[IBAN]``) is encoded as its bytes.

    >>> tok = ByteTokenizer()
    >>> ids = tok.encode("mail [EMAIL] é")
    >>> ids[5], tok.placeholder_id("email"), len(ids), tok.decode(ids)
    (260, 260, 9, 'mail [EMAIL] é')
    """

    def __init__(self) -> None:
        self.bos_id = 256
        self.eos_id = 257
        self.pad_id = 258
        self._placeholders = {t: 259 + i for i, t in enumerate(PLACEHOLDER_TYPES)}
        self._strings = {i: placeholder(t) for t, i in self._placeholders.items()}
        self.vocab_size = 259 + len(PLACEHOLDER_TYPES)
        self._pattern = re.compile("|".join(re.escape(placeholder(t)) for t in PLACEHOLDER_TYPES))
        self._by_string = {placeholder(t): i for t, i in self._placeholders.items()}

    def __eq__(self, other: object) -> bool:
        return type(other) is ByteTokenizer

    def __hash__(self) -> int:
        return hash(ByteTokenizer)

    def __repr__(self) -> str:
        return "ByteTokenizer()"

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text``, each known placeholder string as its one token (no BOS, no EOS)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        at = 0
        for m in self._pattern.finditer(text):
            ids.extend(text[at : m.start()].encode("utf-8"))
            ids.append(self._by_string[m.group()])
            at = m.end()
        ids.extend(text[at:].encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int] | Iterable[int]) -> str:
        """The text of ``ids``: bytes as UTF-8 (an incomplete character as U+FFFD), placeholder tokens as
        ``[TYPE]``; BOS, EOS and PAD are dropped. ``decode(encode(t)) == t`` for every string ``t``."""
        parts: list[str] = []
        pending = bytearray()
        for raw in ids:
            i = int(raw)
            if 0 <= i < 256:
                pending.append(i)
                continue
            if not 256 <= i < self.vocab_size:
                raise ValueError(f"ids: token id {i} is outside the vocabulary [0, {self.vocab_size})")
            if i in self._strings:
                parts.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
                parts.append(self._strings[i])
        parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def placeholder_id(self, span_type: str) -> int:
        """The token of ``[SPAN_TYPE]``; a type without its own token is a ValueError naming the known ones."""
        if span_type not in self._placeholders:
            raise ValueError(f"span_type must be one of {', '.join(PLACEHOLDER_TYPES)} (a type with its own "
                             f"token), got {span_type!r}")  # fmt: skip
        return self._placeholders[span_type]

    def describe(self) -> dict[str, Any]:
        """The vocabulary, for run.json (fixed in code: it depends on no data)."""
        return {"kind": "bytes", "vocab_size": self.vocab_size, "bos": self.bos_id, "eos": self.eos_id,
                "pad": self.pad_id, "placeholders": {placeholder(t): i for t, i in self._placeholders.items()}}


# ============================================================================================ records


@dataclass(frozen=True)
class TextRecord:
    """One text and its private spans (character offsets into ``text``; the ground truth where generated), and its
    user (``user_field``: who wrote it, the privacy unit of a user-level run; None where the data names none)."""

    text: str
    spans: list[Span]
    user: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"TextRecord.text must be a str, got {type(self.text).__name__}")
        for s in self.spans:
            if not isinstance(s, Span):
                raise TypeError(f"TextRecord.spans must hold Span objects, got {type(s).__name__}")
            if s.end > len(self.text):
                raise ValueError(f"TextRecord.spans: span [{s.start}, {s.end}) ends after the text "
                                 f"({len(self.text)} characters)")  # fmt: skip

    def values(self, span_type: str | None = None) -> list[str]:
        """The contents of the spans (of ``span_type`` only, when given), in order."""
        return [self.text[s.start : s.end] for s in self.spans if span_type is None or s.type == span_type]


def write_jsonl(records: Iterable[TextRecord], path: str | Path) -> None:
    """Write ``records`` atomically as annotated JSONL: ``{"text": ..., "spans": [{"start", "end", "type"}]}``
    per line, the format :func:`featuredp.features.text.load_annotated_jsonl` reads."""
    lines = [
        json.dumps({"text": r.text, "spans": [{"start": s.start, "end": s.end, "type": s.type} for s in r.spans]},
                   ensure_ascii=False)
        for r in records
    ]  # fmt: skip
    atomic_write_text(path, "".join(line + "\n" for line in lines))


# ============================================================================================ canaries


@dataclass(frozen=True)
class Canary:
    """One inserted canary (Carlini et al., 2019): ``text`` = ``prefix + secret + rest``, inserted ``repeats``
    times into the training records."""

    secret: str
    prefix: str
    text: str
    repeats: int


def insert_canaries(
    records: Sequence[TextRecord],
    *,
    repeats: Sequence[int] = (1, 10, 100),
    per_repeat: int = 4,
    rng: np.random.Generator,
    template: str = "my pin is {secret}",
    digits: int = 4,
    span_type: str | None = "secret",
) -> tuple[list[TextRecord], list[Canary]]:
    """``records`` with canaries inserted, and the canaries.

    For each count ``r`` in ``repeats``, ``per_repeat`` canaries ``template.format(secret=s)`` are made, each
    inserted ``r`` times; the secrets are distinct draws from all ``digits``-digit strings (the 10^digits
    candidates an exposure audit ranks), and each copy marks its secret as a span of type ``"secret"``, so a
    Ψ whose private types include ``"secret"`` hides it (one that does not leaves it public, like any span of a
    type it does not declare). ``span_type=None`` marks nothing: a "missed" canary, like PII that no annotation
    marks and no detector finds, public in Ψ whatever its types (what ``--record-epsilon`` bounds). The copies go to
    random positions; the original records keep their order.

    ``rng`` draws the secrets and the positions. The audit's canaries come from a *public* seed: they are not
    users' data, and the audit needs to know them; pass a secret generator only for canaries nobody may know.

    >>> recs, canaries = insert_canaries([TextRecord("hi", [])] * 3, repeats=(1, 2), per_repeat=1,
    ...                                  rng=np.random.default_rng(0))
    >>> len(recs), [c.repeats for c in canaries], canaries[0].prefix
    (6, [1, 2], 'my pin is ')
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    digits = check_int("digits", digits, minimum=1)
    per_repeat = check_int("per_repeat", per_repeat, minimum=1)
    counts = [check_int("repeats", r, minimum=1) for r in repeats]
    if template.count("{secret}") != 1:
        raise ValueError(f"template must contain '{{secret}}' exactly once, got {template!r}")
    n_canaries = len(counts) * per_repeat
    if n_canaries > 10**digits:
        raise ValueError(f"per_repeat: {n_canaries} distinct {digits}-digit secrets asked for, only "
                         f"{10**digits} exist")  # fmt: skip
    prefix, rest = template.split("{secret}")
    drawn = rng.choice(10**digits, size=n_canaries, replace=False)
    canaries = [Canary(f"{int(s):0{digits}d}", prefix, f"{prefix}{int(s):0{digits}d}{rest}", r)
                for s, r in zip(drawn, [r for r in counts for _ in range(per_repeat)])]  # fmt: skip
    marked = [] if span_type is None else [Span(len(prefix), len(prefix) + digits, span_type)]
    # Each canary's copies are one user's records: a user-level run protects the canary as one person's secret.
    copies = [TextRecord(c.text, list(marked), user=f"{CANARY_USER}{i}") for i, c in enumerate(canaries)
              for _ in range(c.repeats)]  # fmt: skip
    total = len(records) + len(copies)
    is_copy = np.zeros(total, bool)
    is_copy[rng.choice(total, size=len(copies), replace=False)] = True
    order = rng.permutation(len(copies))  # which copy goes to which of the chosen positions
    originals, inserted = iter(records), iter(copies[i] for i in order)
    out = [next(inserted) if c else next(originals) for c in is_copy]
    return out, canaries


# ============================================================================================ datasets


def _rows(ids: list[int], max_len: int, tok: Tokenizer) -> tuple[list[int], list[int], bool]:
    """The input row [BOS, t_1, ...] and target row [t_1, ..., EOS] of length ``max_len``, and whether cut."""
    x = [tok.bos_id, *ids][:max_len]
    y = [*ids, tok.eos_id][:max_len]
    cut = len(ids) + 1 > max_len
    return x + [tok.pad_id] * (max_len - len(x)), y + [IGNORE_INDEX] * (max_len - len(y)), cut


def _placeholder_ids(tok: Tokenizer, types: Sequence[str]) -> list[int]:
    """The token ids of the placeholders of ``types`` that are one token each in ``tok`` (others: none)."""
    ids = []
    for t in types:
        try:
            ids.append(int(tok.placeholder_id(t)))  # type: ignore[attr-defined]
        except (AttributeError, ValueError):
            continue
    return ids


class TextDataset:
    """Texts with their private spans, as the token batch of a causal LM with feature DP.

    ``batch()`` returns ``"x"``/``"y"`` (inputs ``[BOS, t_1, ..., t_{L-1}]`` and targets ``[t_1, ..., t_k,
    EOS]`` of the full text) and ``"x_pub"``/``"y_pub"`` (the same for Ψ(text) = ``psi(text, record.spans)``),
    int64 of shape (N, ``max_len``): right-padded with PAD (inputs) and ``-100`` (targets), cut at ``max_len``.
    The length is fixed per dataset, never trimmed to a batch. Ψ reads each record's text and spans only.
    The placeholder tokens are inputs of the public view but not its targets (``placeholder_targets=False``, the
    default): real text never holds them, so ℓ_pub teaches what follows a span and leaves what a span holds to
    the private part.

    >>> ds = TextDataset([TextRecord("hi ann@ex.org", [Span(3, 13, "email")])], TextSpans(("email",)), max_len=6)
    >>> ds.batch()["x_pub"].tolist(), ds.batch()["y_pub"].tolist()
    ([[256, 104, 105, 32, 260, 258]], [[104, 105, 32, -100, 257, -100]])
    """

    def __init__(
        self,
        records: Sequence[TextRecord],
        psi: TextSpans,
        *,
        tokenizer: Tokenizer | None = None,
        max_len: int = 128,
        name: str = "text",
        description: str = "",
        placeholder_targets: bool = False,
    ) -> None:
        if not isinstance(psi, TextSpans):
            raise TypeError(f"psi must be a TextSpans (featuredp.features.text), got {type(psi).__name__}")
        self.max_len = check_int("max_len", max_len, minimum=2)
        self.tokenizer: Tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.psi = psi
        self.name = name
        self.records = list(records)
        for i, r in enumerate(self.records):
            if not isinstance(r, TextRecord):
                raise TypeError(f"records[{i}] must be a TextRecord, got {type(r).__name__}")
        n, L = len(self.records), self.max_len
        # int16 holds every id and -100; batch() widens to int64
        arrays = {k: np.empty((n, L), np.int16) for k in ("x", "y", "x_pub", "y_pub")}
        self._cut = np.zeros(n, bool)
        for i, r in enumerate(self.records):
            arrays["x"][i], arrays["y"][i], _ = _rows(self.tokenizer.encode(r.text), L, self.tokenizer)
            # cut is counted on Ψ(x) only: two neighbours (same Ψ, spans of other lengths) must print the same count
            arrays["x_pub"][i], arrays["y_pub"][i], self._cut[i] = _rows(self.tokenizer.encode(psi(r.text, r.spans)),
                                                                         L, self.tokenizer)  # fmt: skip
        #: whether ℓ_pub is trained to predict the placeholder tokens themselves
        self.placeholder_targets = bool(placeholder_targets)
        ids = _placeholder_ids(self.tokenizer, psi.types)
        if not self.placeholder_targets and ids:
            # A real text never holds a placeholder: a model taught to predict one where a span starts puts
            # its probability on a token that never comes (the public loss would fight the span contents).
            arrays["y_pub"][np.isin(arrays["y_pub"], ids)] = IGNORE_INDEX
        self._arrays = arrays
        #: how many texts' public view Ψ(x) was longer than ``max_len - 1`` tokens and lost its end (and EOS). Counted
        #: on Ψ(x), never on the full text: it is printed, and must not depend on what the private spans hold
        self.truncated = int(self._cut.sum())
        self.description = description or (
            f"texts as UTF-8 byte tokens (vocabulary {self.tokenizer.vocab_size}), {L} tokens per row; "
            f"public view: {psi.describe().hides} replaced by placeholders"
        )
        self.classes: list[str] = []

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        return f"TextDataset({self.name!r}, {len(self)} texts, max_len={self.max_len})"

    def subset(self, indices: Sequence[int] | np.ndarray, name: str | None = None) -> TextDataset:
        """The records at ``indices`` (same Ψ, tokenizer and length)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        out = object.__new__(TextDataset)
        out.__dict__.update(self.__dict__)
        out.name = name or self.name
        out.records = [self.records[int(i)] for i in idx]
        out._arrays = {k: v[idx] for k, v in self._arrays.items()}
        out._cut = self._cut[idx]
        out.truncated = int(out._cut.sum())
        return out

    def batch(self, indices: Sequence[int] | np.ndarray | None = None) -> dict[str, torch.Tensor]:
        """``{"x", "y", "x_pub", "y_pub"}``: int64 tensors of shape (len(indices), max_len) (all records if None)."""
        if indices is None:
            return {k: torch.from_numpy(v.astype(np.int64)) for k, v in self._arrays.items()}
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return {k: torch.from_numpy(v[idx].astype(np.int64)) for k, v in self._arrays.items()}

    def public_texts(self) -> list[str]:
        """Ψ of every record's text (what the public view tokenises)."""
        return [self.psi(r.text, r.spans) for r in self.records]


def load_text_jsonl(path: str | Path, *, spans: Sequence[str], detect: Sequence[str] = (),
                    names: Sequence[str] = (), user_field: str | None = None) -> list[TextRecord]:  # fmt: skip
    """The records of an annotated JSONL file, each with the private spans Ψ will hide.

    ``spans``: the private span types (``--spans``); ``detect``: built-in detectors to run as well; ``names``: the
    list for a ``"name"`` detector. Each record's ``spans`` are its annotations of a private type joined with what
    the detectors find (:meth:`~featuredp.features.text.TextSpans.spans`); annotations of other types are public
    and dropped. A file without a record is an error naming it; so is a private type that is neither annotated in
    the file nor a built-in detector (a typo such as ``emial`` would otherwise leave the emails public).
    ``user_field``: the JSON field that names each record's user (``--user-field``; every record needs one).
    """
    psi = TextSpans(tuple(spans), tuple(detect), tuple(names))
    rows = load_annotated_jsonl(path)
    if not rows:
        raise DataValidationError(f"path: {str(path)!r} holds no records (expected one JSON object per line)")
    try:
        check_span_types(spans, {s.type for _, annotated in rows for s in annotated}, Path(path).name)
    except ValueError as exc:
        raise DataValidationError(str(exc)) from None
    users = [None] * len(rows) if user_field is None else read_user_field(path, user_field)
    return [TextRecord(text, psi.spans(text, annotated), user) for (text, annotated), user in zip(rows, users,
                                                                                                   strict=True)]


#: the user key of a planted canary's copies (``{CANARY_USER}{i}``): one user per canary
CANARY_USER = "\0canary:"



def split_records(records: Sequence[TextRecord], *, test_fraction: float = 0.1,
                  split_seed: int = 0) -> tuple[list[TextRecord], list[TextRecord]]:  # fmt: skip
    """A random (train, test) split from the public ``split_seed``; both parts non-empty, each in input order."""
    test_fraction = check_open_unit("test_fraction", test_fraction)
    n = len(records)
    n_test = round(test_fraction * n)
    if n_test < 1 or n_test >= n:
        raise ValueError(f"test_fraction={test_fraction} of {n} records leaves an empty train or test set")
    test = np.zeros(n, bool)
    test[np.random.default_rng(split_seed).permutation(n)[:n_test]] = True
    return [r for r, t in zip(records, test) if not t], [r for r, t in zip(records, test) if t]


def text_datasets_from_records(
    records: Sequence[TextRecord],
    psi: TextSpans,
    *,
    test_fraction: float = 0.1,
    split_seed: int = 0,
    tokenizer: Tokenizer | None = None,
    max_len: int = 128,
    name: str = "text",
    description: str = "",
) -> tuple[TextDataset, TextDataset]:
    """(train, test) :class:`TextDataset`s of a :func:`split_records` split (names ``<name>-train``/``-test``)."""
    train, test = split_records(records, test_fraction=test_fraction, split_seed=split_seed)
    common: dict[str, Any] = {"tokenizer": tokenizer, "max_len": max_len, "description": description}
    return (TextDataset(train, psi, name=f"{name}-train", **common),
            TextDataset(test, psi, name=f"{name}-test", **common))  # fmt: skip
