"""The text task's data: a user's annotated JSONL or the generated support corpus, split, with canaries planted.

:func:`load_text_data` builds the :class:`TextData` of one text task (train and held-out token datasets, the
canaries, Ψ, where the held-out texts come from and whether ε covers metrics on them, and what the boundary does on
the training texts). :mod:`featuredp.experiments.text_lm` trains and compares on it; :mod:`featuredp.experiments
.text_audits` attacks the models trained on it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from featuredp._validate import check_int
from featuredp.data.text import (
    ByteTokenizer,
    Canary,
    TextDataset,
    TextRecord,
    insert_canaries,
    load_text_jsonl,
    split_records,
)
from featuredp.data.text_corpus import support_dialogues
from featuredp.data.text_scan import boundary_counts
from featuredp.errors import PrivacyLeakWarning
from featuredp.features.text import TextSpans, load_annotated_jsonl

__all__ = ["CANARY_TYPE", "CORPUS_SPANS", "TextData", "load_text_data", "text_model_spec"]

#: the private span types of the generated support corpus (all of its PII)
CORPUS_SPANS = ("name", "email", "phone", "card", "address", "date", "number")
#: the span type of the audit's canaries: always private, so Ψ hides them
CANARY_TYPE = "secret"


@dataclass
class TextData:
    """The data of one text task: train (canaries inserted) and test records as token datasets, and the audit's."""

    train: TextDataset
    test: TextDataset
    canaries: list[Canary]
    psi: TextSpans
    source: str
    options: dict[str, Any] = field(default_factory=dict)
    #: what Ψ does on the training texts (canaries aside): :func:`featuredp.data.text_scan.boundary_counts`;
    #: ``largest_repeat`` (which private values are equal) only when :func:`load_text_data` was asked for it
    boundary: dict[str, Any] = field(default_factory=dict)

    @property
    def heldout(self) -> dict[str, Any]:
        """Where the held-out texts come from, and whether metrics on them are covered by ε (``source``,
        ``covered``, ``note``): a split of the user's file is private data trained on by no one, and a metric on
        it (perplexity, accuracy) is a noiseless function of its texts' private spans."""
        if self.options.get("path") is None:
            return {"source": "generated", "covered": True,
                    "note": "held-out texts: a split of the public generated corpus (no private data)"}
        if self.options.get("test"):
            return {"source": "test_data", "covered": False,
                    "note": f"held-out metrics from --test-data {Path(self.options['test']).name}, outside the "
                    "training data; not covered by ε if that file is private itself"}  # fmt: skip
        return {"source": "split", "covered": False,
                "note": "held-out metrics not covered by ε: computed on a split of the private --data file, each a "
                "noiseless function of those texts' private spans (use --test-data FILE to keep them off it)"}

    @property
    def users(self) -> list[Any] | None:
        """Each training record's user (``user_field``), canaries included; None for a record-level task."""
        if self.options.get("user_field") is None:
            return None
        return [r.user for r in self.train.records]

    @property
    def originals(self) -> list[TextRecord]:
        """The training records that are not canaries (the audits' targets)."""
        return [r for r in self.train.records if not any(s.type == CANARY_TYPE for s in r.spans)]


def load_text_data(
    *,
    path: str | Path | None = None,
    test: str | Path | None = None,
    spans: Sequence[str] | None = None,
    detect: Sequence[str] = (),
    names: Sequence[str] = (),
    n_train: int | None = None,
    n_test: int | None = None,
    test_fraction: float = 0.1,
    max_len: int = 128,
    canary_repeats: Sequence[int] = (1, 10, 100),
    canaries_per_repeat: int = 2,
    canary_digits: int = 4,
    corpus_seed: int = 0,
    canary_seed: int = 0,
    group_stats: bool = False,
    user_field: str | None = None,
) -> TextData:
    """The generated support corpus (``path=None``) or a user's annotated JSONL, split, with canaries planted.

    ``test``: a second JSONL file read as the held-out texts (same spans and detectors); ``path`` is then used
    whole for training, so held-out metrics are computed off the training file (else on a split of it, and
    then not covered by ε: :attr:`TextData.heldout`).
    ``spans``: the private span types (default: every type of the corpus; required for a file); ``detect`` /
    ``names``: built-in detectors run on a file's texts as well. ``canary_repeats`` (empty: none),
    ``canaries_per_repeat`` and ``canary_digits``: the exposure audit's canaries (secrets of ``canary_digits``
    digits), drawn from the public ``canary_seed`` (they are the auditor's, not users' data) and always private
    (type ``secret``). The test split is never trained on. ``options`` holds these arguments (``n_train``: the
    training texts before the canaries; ``names``: how many, not which), so these options with ``names`` given
    again rebuild the same data. ``group_stats``: also count, per private type, the most training records that
    hold one value (``boundary["largest_repeat"]``), a statistic of the private values that ε does not cover
    (``train --task text --group-stats``); never in ``options``. ``user_field``: the JSON field naming each record's
    user (``--user-field``; a file only): the privacy unit of a user-level run (:attr:`TextData.users`); each
    canary's copies are then one user's records.
    """
    max_len = check_int("max_len", max_len, minimum=16)
    if test is not None and path is None:
        raise ValueError("--test-data: give --data FILE.jsonl too (the generated corpus has its own held-out split)")
    if user_field is not None and path is None:
        raise ValueError("--user-field: give --data FILE.jsonl whose records name their users (the generated corpus "
                         "has none)")  # fmt: skip
    if path is None:
        types = tuple(spans) if spans else CORPUS_SPANS
        unknown = [t for t in types if t not in (*CORPUS_SPANS, CANARY_TYPE)]
        if unknown:  # a typo must not train with the span it meant left public
            raise ValueError(f"--spans: unknown span type {', '.join(unknown)}: the generated corpus has "
                             f"{', '.join(CORPUS_SPANS)}")  # fmt: skip
        n_tr = check_int("n_train", n_train if n_train is not None else 4000, minimum=10)
        n_te = check_int("n_test", n_test if n_test is not None else 500, minimum=10)
        records = support_dialogues(n_tr + n_te, seed=corpus_seed, max_bytes=min(120, max_len - 2))
        train_recs, test_recs = records[:n_tr], records[n_tr:]
        source = (f"generated support messages (featuredp.data.text_corpus.support_dialogues, public seed "
                  f"{corpus_seed}): {n_tr:,} train / {n_te:,} test")  # fmt: skip
        psi = TextSpans(_with_canaries(types, canary_repeats))
        train_recs = [TextRecord(r.text, [s for s in r.spans if s.type in types]) for r in train_recs]
        test_recs = [TextRecord(r.text, [s for s in r.spans if s.type in types]) for r in test_recs]
        # the generated corpus's spans are its annotations (no detector runs on it)
        boundary = boundary_counts([(r.text, r.spans) for r in train_recs], TextSpans(types),
                                   types if group_stats else ())  # fmt: skip
    else:
        if not spans:
            raise ValueError("--spans: name the private span types of --data FILE.jsonl (e.g. email,phone,name)")
        records = load_text_jsonl(path, spans=spans, detect=detect, names=names, user_field=user_field)
        if user_field is not None:
            warn_private_user_keys(records, user_field)
        raw = [TextRecord(text, ann) for text, ann in load_annotated_jsonl(path)]
        if test is not None:
            train_recs, test_recs = records, load_text_jsonl(test, spans=spans, detect=detect, names=names,
                                                             user_field=user_field)  # fmt: skip
            raw_train = raw
        else:
            train_recs, test_recs = split_records(records, test_fraction=test_fraction, split_seed=corpus_seed)
            # the same split of the raw annotations (it depends on the number of records and the seed only), so
            # that the boundary report tells annotated spans from detected ones
            raw_train, _ = split_records(raw, test_fraction=test_fraction, split_seed=corpus_seed)
        if n_train is not None:
            train_recs = train_recs[: check_int("n_train", n_train, minimum=10)]
            raw_train = raw_train[: len(train_recs)]
        boundary = boundary_counts([(r.text, r.spans) for r in raw_train],
                                   TextSpans(tuple(spans), tuple(detect), tuple(names)),
                                   spans if group_stats else ())  # fmt: skip
        if n_test is not None:
            test_recs = test_recs[: check_int("n_test", n_test, minimum=1)]
        source = (f"{Path(path).name}: {len(train_recs):,} train / {len(test_recs):,} test (split seed {corpus_seed})"
                  if test is None else f"{Path(path).name}: {len(train_recs):,} train (the whole file); "
                  f"{Path(test).name} (--test-data): {len(test_recs):,} test")  # fmt: skip
        detect_ = tuple(d for d in detect if d in spans)
        psi = TextSpans(_with_canaries(spans, canary_repeats), detect_, tuple(names))
    canaries: list[Canary] = []
    # the audit rebuilds the data from options: n_train must count the texts the canaries are added to
    n_originals = len(train_recs)
    if canary_repeats:
        train_recs, canaries = insert_canaries(train_recs, repeats=tuple(canary_repeats),
                                               per_repeat=canaries_per_repeat, digits=canary_digits,
                                               rng=np.random.default_rng(canary_seed))  # fmt: skip
    tok = ByteTokenizer()
    train = TextDataset(train_recs, psi, tokenizer=tok, max_len=max_len, name="text-train")
    test_set = TextDataset(test_recs, psi, tokenizer=tok, max_len=max_len, name="text-test")
    options = {"path": None if path is None else str(path), **({} if test is None else {"test": str(test)}),
               "spans": list(psi.types), "detect": list(detect),
               "names": len(names), "n_train": n_originals, "n_test": len(test_recs), "max_len": max_len,
               "canary_repeats": list(canary_repeats), "canaries_per_repeat": canaries_per_repeat,
               "canary_digits": canary_digits, "corpus_seed": corpus_seed, "canary_seed": canary_seed,
               **({} if user_field is None else {"user_field": user_field})}  # fmt: skip
    return TextData(train, test_set, canaries, psi, source, options, boundary)


def warn_private_user_keys(records: Sequence[TextRecord], field: str) -> None:
    """Warn (:class:`~featuredp.errors.PrivacyLeakWarning`) when a record's user key is the content of one of its
    own private spans (the author's email as the key): the grouping into users, and the number of users, are then
    functions of private values, and a user-level ε covers a change within a user's records, not a change of whom a
    record belongs to. No count is printed: it would be a statistic of the private values."""
    for r in records:
        key = str(r.user).casefold()
        if key and any(key == r.text[s.start:s.end].casefold() for s in r.spans):
            warnings.warn(f"--user-field {field!r}: user keys are the contents of private spans of their records; "
                          "the grouping into users then depends on private values, which ε does not cover: use a "
                          "public key (an account id) for a guarantee", PrivacyLeakWarning, stacklevel=3)  # fmt: skip
            return


def _with_canaries(types: Sequence[str], canary_repeats: Sequence[int]) -> tuple[str, ...]:
    """The private span types, with the canaries' type where canaries are planted (and only there: a type nobody's
    data holds would be listed in the guarantee)."""
    return tuple(dict.fromkeys((*types, CANARY_TYPE))) if canary_repeats else tuple(dict.fromkeys(types))


def text_model_spec(data: TextData, base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a ``{"kind": "causal_transformer", ...}`` spec) completed with the vocabulary and length."""
    return {**dict(base), "vocab_size": data.train.tokenizer.vocab_size, "max_len": data.train.max_len}
