"""Feature DP for text: a causal LM whose training texts' private spans are protected, the redacted text used freely.

The task (``featuredp compare --task text``, ``featuredp train --task text``; docs/text.md). A record is a text
with private spans (names, emails, phone numbers, ...); Ψ(x) is the text with each span replaced by its type's
placeholder (:class:`~featuredp.features.text.TextSpans`). With the per-example mean token NLL ℓ,

* ℓ(θ; x) = NLL of the full text x (its own tokenisation);
* ℓ_pub(θ; Ψ(x)) = NLL of the redacted text, a function of the public view only
  (:class:`~featuredp.losses.CausalLMSplit` through :class:`~featuredp.features.tokens.TokenView`);
* ℓ_priv = ℓ − ℓ_pub: what the span contents change. Algorithm 1 clips and noises ∇ℓ_priv; the public batch
  and public pre-training read Ψ(S) only. FDP (DP-SGD) pre-trains on Ψ(S) and then runs DP-SGD on ℓ.

Neighbouring datasets differ in the contents of one record's spans (Ψ(x') = Ψ(x)): the guarantee hides what
the spans hold, never where they are, how many there are, or the text around them.

Every trained model is audited here (:mod:`featuredp.attacks.text`): canary exposure (secrets of type
``secret`` planted 1, 10 and 100 times, ranked among all 4-digit strings), extraction (greedy decoding after
the text before each private span, training records against held-out ones) and span inference (given Ψ(x)
of a training record with one span filled by each of k candidates, pick the likeliest; against the prior 1/k
and Theorem 4's bound at the run's ε).

:func:`run_text_compare` runs method × ε × seed, one cell at a time, each cell a JSON file named by the hash
of its settings (a rerun reuses finished cells; an interrupted cell leaves nothing), and writes
``results.json``, ``summary.md`` and ``text_privacy.png``.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from featuredp._io import atomic_write_json, atomic_write_text
from featuredp._validate import check_choice, check_int, check_open_unit, check_positive
from featuredp.attacks.text import digit_candidates, exposure_report, extraction, span_inference
from featuredp.data.text import (
    ByteTokenizer,
    Canary,
    TextDataset,
    TextRecord,
    Tokenizer,
    insert_canaries,
    load_text_jsonl,
    split_records,
)
from featuredp.data.text_corpus import support_dialogues
from featuredp.data.text_scan import boundary_counts
from featuredp.engine import Trainer, init_seed
from featuredp.experiments.grid_config import settings_hash
from featuredp.experiments.presets import TEXT_PRESET, trainer_arguments
from featuredp.experiments.text_report import render_text_summary, text_privacy_plot
from featuredp.features.text import Span, TextSpans, load_annotated_jsonl, placeholder
from featuredp.features.tokens import TokenView
from featuredp.lm import lm_generator, lm_scorer, perplexity
from featuredp.losses import CausalLMSplit
from featuredp.methods import get_method
from featuredp.models import build_model

__all__ = [
    "CORPUS_SPANS",
    "TASK",
    "TEXT_ATTACKS",
    "TEXT_METHODS",
    "SpanTargets",
    "TextCompareConfig",
    "TextData",
    "TrainedText",
    "audit_text_model",
    "cell_key",
    "data_options",
    "extraction_audit",
    "extraction_targets",
    "fit_batches",
    "load_text_data",
    "mark_exposure_power",
    "run_text_compare",
    "span_targets",
    "text_model_spec",
    "train_text_cell",
    "train_text_model",
]

TASK = "text"
#: the methods of a text comparison: non-private, scrubbed only (public), DP-SGD, FDP (DP-SGD), FDP (Alg. 1)
TEXT_METHODS = ("nonprivate", "public", "dpsgd", "fdp_dpsgd", "fdp")
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
    #: what Ψ does on the training texts (canaries aside): :func:`featuredp.data.text_scan.boundary_counts`
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
    again rebuild the same data.
    """
    max_len = check_int("max_len", max_len, minimum=16)
    if test is not None and path is None:
        raise ValueError("--test-data: give --data FILE.jsonl too (the generated corpus has its own held-out split)")
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
        psi = TextSpans(tuple(dict.fromkeys((*types, CANARY_TYPE))))
        train_recs = [TextRecord(r.text, [s for s in r.spans if s.type in types]) for r in train_recs]
        test_recs = [TextRecord(r.text, [s for s in r.spans if s.type in types]) for r in test_recs]
        # the generated corpus's spans are its annotations (no detector runs on it)
        boundary = boundary_counts([(r.text, r.spans) for r in train_recs], TextSpans(types), types)
    else:
        if not spans:
            raise ValueError("--spans: name the private span types of --data FILE.jsonl (e.g. email,phone,name)")
        records = load_text_jsonl(path, spans=spans, detect=detect, names=names)
        raw = [TextRecord(text, ann) for text, ann in load_annotated_jsonl(path)]
        if test is not None:
            train_recs, test_recs = records, load_text_jsonl(test, spans=spans, detect=detect, names=names)
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
                                   TextSpans(tuple(spans), tuple(detect), tuple(names)), spans)  # fmt: skip
        if n_test is not None:
            test_recs = test_recs[: check_int("n_test", n_test, minimum=1)]
        source = (f"{Path(path).name}: {len(train_recs):,} train / {len(test_recs):,} test (split seed {corpus_seed})"
                  if test is None else f"{Path(path).name}: {len(train_recs):,} train (the whole file); "
                  f"{Path(test).name} (--test-data): {len(test_recs):,} test")  # fmt: skip
        detect_ = tuple(d for d in detect if d in spans)
        psi = TextSpans(tuple(dict.fromkeys((*spans, CANARY_TYPE))), detect_, tuple(names))
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
               "canary_digits": canary_digits, "corpus_seed": corpus_seed, "canary_seed": canary_seed}  # fmt: skip
    return TextData(train, test_set, canaries, psi, source, options, boundary)


def text_model_spec(data: TextData, base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` (a ``{"kind": "causal_transformer", ...}`` spec) completed with the vocabulary and length."""
    return {**dict(base), "vocab_size": data.train.tokenizer.vocab_size, "max_len": data.train.max_len}


# -- audits -------------------------------------------------------------------------------------------------
def _placeholdered(record: TextRecord, keep: Span) -> tuple[str, Span]:
    """``record``'s text with every private span but ``keep`` replaced by its placeholder, and ``keep`` moved."""
    parts: list[str] = []
    at = 0
    start = -1
    for s in sorted(record.spans):
        parts.append(record.text[at:s.start])
        if s == keep:
            start = sum(len(p) for p in parts)
            parts.append(record.text[s.start:s.end])
        else:
            parts.append(placeholder(s.type))
        at = s.end
    parts.append(record.text[at:])
    return "".join(parts), Span(start, start + keep.end - keep.start, keep.type)


@dataclass
class SpanTargets:
    """Span-inference targets (:func:`span_targets`) with each candidate's prior weight and each target's group."""

    #: (Ψ(x) with one span filled in, that span, its k distinct candidates)
    targets: list[tuple[str, Span, list[str]]]
    #: per target, each candidate's prior weight (how many target records hold it; the posterior is proportional)
    priors: list[list[float]]
    #: per target, how many training records hold its true value (among spans of its type)
    groups: list[int]
    #: the span types not targeted, and why
    skipped: dict[str, str]


def span_targets(records: Sequence[TextRecord], *, k: int = 10, n: int = 200,
                 rng: np.random.Generator | None = None, tokenizer: Tokenizer | None = None,
                 max_len: int | None = None) -> SpanTargets:  # fmt: skip
    """Span-inference targets from ``records``: Ψ(x) with one span filled in, and k candidates for that span.

    Each target is one record, drawn at random (``rng``; default OS entropy — the draw is a function of the
    private records, so never from a public seed), with its other spans replaced by their placeholders (the
    attacker knows exactly Ψ(x)), its first span of a targeted type, and k distinct candidates: the true value
    and k − 1 others drawn uniformly without replacement from the type's other *distinct* values. Types with
    fewer than k distinct values are skipped (``skipped`` says why).

    Values may recur (first names). The baseline that follows is exact: with the candidate set drawn this way,
    P(set | truth = v) = 1 / C(|D| − 1, k − 1) is the same for every v in the set, so the posterior of candidate
    c given the set is p(c) / Σ p(c′) over the set, where p is the empirical distribution of the targeted values.
    The best guess without the model is the likeliest candidate, and its success — the prior baseline of
    :func:`~featuredp.attacks.text.span_inference` given ``priors`` — is the mean of max p(c) / Σ p(c′). (Drawing
    the others from p instead would make the posterior depend on the order of the draws; 1/k, the old
    baseline, is right only when every value is distinct and lets a model that merely prefers frequent values
    seem to beat the prior.) ``groups``: how many training records hold each target's true value.

    With ``tokenizer`` and ``max_len`` (the scorer's), the text after the span is cut, the same for every
    candidate, so that prefix + longest candidate + continuation fits in ``max_len`` tokens: a real record near the
    length limit with a longer candidate would otherwise overflow the scorer. A target whose prefix and longest
    candidate alone do not fit is dropped.
    """
    k = check_int("k", k, minimum=2)
    rng = rng if rng is not None else np.random.default_rng()
    distinct: dict[str, set[str]] = {}
    holders: dict[str, dict[str, int]] = {}
    for r in records:
        seen: set[tuple[str, str]] = set()
        for s in r.spans:
            v = r.text[s.start:s.end]
            distinct.setdefault(s.type, set()).add(v)
            if (s.type, v) not in seen:
                seen.add((s.type, v))
                holders.setdefault(s.type, {}).setdefault(v, 0)
                holders[s.type][v] += 1
    pools = {t: sorted(v) for t, v in distinct.items() if len(v) >= k}
    skipped = {t: f"{len(v)} distinct values, fewer than k = {k} candidates" for t, v in sorted(distinct.items())
               if t not in pools}  # fmt: skip
    eligible: list[tuple[TextRecord, Span]] = []
    weight: dict[str, dict[str, int]] = {}
    for r in records:
        span = next((s for s in sorted(r.spans) if s.type in pools), None)
        if span is not None:
            eligible.append((r, span))
            w = weight.setdefault(span.type, {})
            w[r.text[span.start:span.end]] = w.get(r.text[span.start:span.end], 0) + 1
    out = SpanTargets([], [], [], skipped)
    for i in rng.permutation(len(eligible))[:n]:
        r, span = eligible[int(i)]
        true = r.text[span.start:span.end]
        others = [v for v in pools[span.type] if v != true]
        cands = [true, *(others[int(j)] for j in rng.choice(len(others), k - 1, replace=False))]
        rng.shuffle(cands)
        text, moved = _placeholdered(r, span)
        if tokenizer is not None and max_len is not None:
            cut = _fit_continuation(text, moved, cands, tokenizer, max_len)
            if cut is None:
                continue
            text = cut
        out.targets.append((text, moved, cands))
        out.priors.append([float(weight[span.type].get(c, 0)) for c in cands])
        out.groups.append(holders[span.type][true])
    return out


def _fit_continuation(text: str, span: Span, cands: Sequence[str], tokenizer: Tokenizer, max_len: int) -> str | None:
    """``text`` with the part after ``span`` cut (from its end) until the prefix plus any candidate plus that part
    fit in ``max_len`` tokens; None when even the prefix and the longest candidate do not."""
    prefix = len(tokenizer.encode(text[:span.start]))
    longest = max(len(tokenizer.encode(c)) for c in cands)
    rest = text[span.end:]
    if prefix + longest > max_len:
        return None
    while rest and prefix + max(len(tokenizer.encode(c + rest)) for c in cands) > max_len:
        rest = rest[: max(0, len(rest) - max(1, (prefix + longest + len(tokenizer.encode(rest)) - max_len)))]
    return text[:span.end] + rest


def extraction_targets(data: TextData, n: int, *, rng: np.random.Generator | None = None
                       ) -> tuple[list[TextRecord], list[TextRecord]]:  # fmt: skip
    """The extraction audit's records: the same number drawn at random from the training texts and the held-out ones.

    min(n, training texts, held-out texts) of each, uniformly without replacement (``rng``; default OS entropy,
    a secret draw: the records' order may be a function of private data, e.g. a newest-first log, so the first
    records are never taken). Drawn alike, the two sets come from the same population and the excess rate
    compares like with like. The draw is not kept: a new audit draws again.
    """
    rng = rng if rng is not None else np.random.default_rng()
    train, held = data.originals, list(data.test.records)
    m = min(int(n), len(train), len(held))
    return ([train[int(i)] for i in rng.choice(len(train), m, replace=False)],
            [held[int(i)] for i in rng.choice(len(held), m, replace=False)])  # fmt: skip


#: how the audits draw their targets (recorded in each report)
RANDOM_TARGETS = "drawn uniformly at random without replacement from OS entropy (never in file order); not kept"


#: the audits of a text model (``featuredp audit RUN --attack ...``)
TEXT_ATTACKS = ("exposure", "extraction", "span")


def extraction_audit(generate: Any, data: TextData, n: int, *, rng: np.random.Generator | None = None
                     ) -> dict[str, Any]:  # fmt: skip
    """:func:`~featuredp.attacks.text.extraction` on :func:`extraction_targets` (n of each, drawn at random)."""
    types = [t for t in data.psi.types if t != CANARY_TYPE]
    train, held = extraction_targets(data, n, rng=rng)
    out = extraction(generate, [(r.text, r.spans) for r in train], span_types=types,
                     heldout=[(r.text, r.spans) for r in held])  # fmt: skip
    out["targets"] = {"train": len(train), "heldout": len(held), "drawn": RANDOM_TARGETS}
    return out


def audit_text_model(model: torch.nn.Module, data: TextData, *, epsilon: float | None, delta: float | None,
                     audit: Mapping[str, Any], attacks: Sequence[str] = TEXT_ATTACKS,
                     rng: np.random.Generator | None = None) -> dict[str, Any]:  # fmt: skip
    """Perplexity on the held-out texts and the audits of :mod:`featuredp.attacks.text` for one model.

    ``audit``: ``extraction`` (records tried, train and held-out each), ``span_targets`` and ``span_k``; the
    canaries are ranked among all strings of their secrets' length (``digits`` sets that length when the data
    is loaded: ``canary_digits``). ``epsilon=None``: no Theorem 4 bound. Returns ``perplexity`` and, per attack
    asked for, ``canary_exposure`` (mean bits of the 10× canaries; without them, of the fewest-repeated ones) and
    ``exposure`` (the whole report), ``extraction``, ``span_inference``.
    """
    for a in attacks:
        check_choice("attack", a, TEXT_ATTACKS)
    tok, L = data.train.tokenizer, data.train.max_len
    score = lm_scorer(model, tok, L)
    rng = rng if rng is not None else np.random.default_rng()  # the targets' draw: secret (OS entropy)
    out: dict[str, Any] = {"perplexity": perplexity(model, data.test.batch()), "heldout": data.heldout}
    if "exposure" in attacks:
        if not data.canaries:
            raise ValueError("attack exposure: this model was trained without canaries (train with --canaries "
                             "1,10,100)")
        # the space the secrets were drawn from, whatever ``audit`` says (another space would not hold them)
        report = exposure_report(score, data.canaries, digit_candidates(len(data.canaries[0].secret)))
        by = report["by_repeats"]
        out["canary_exposure"] = (by["10"] if "10" in by else next(iter(by.values())))["mean_exposure"]
        out["exposure"] = report
    k = int(audit.get("span_k", 10))
    if "extraction" in attacks:
        generate = lm_generator(model, tok, L)
        out["extraction"] = extraction_audit(generate, data, int(audit.get("extraction", 100)), rng=rng)
        # the control: the planted secrets, whose repeats a non-private model memorises
        out["extraction"]["canaries"] = {
            str(r): extraction(generate, [(c.text, [_secret_span(c)]) for c in data.canaries if c.repeats == r]
                               )["rate"] for r in sorted({c.repeats for c in data.canaries})}  # fmt: skip
    if "span" in attacks:
        drawn = span_targets(data.originals, k=k, n=int(audit.get("span_targets", 200)), rng=rng, tokenizer=tok,
                             max_len=L)  # fmt: skip
        out["span_inference"] = None if not drawn.targets else {
            **span_inference(score, drawn.targets, epsilon=epsilon, delta=delta, priors=drawn.priors,
                             groups=drawn.groups, seed=None),
            "groups": drawn.groups, "targets_drawn": RANDOM_TARGETS}  # fmt: skip
        out["span_skipped"] = drawn.skipped
        if out["span_inference"] is not None and data.canaries:
            digits = len(data.canaries[0].secret)
            rng = np.random.default_rng(1)
            inferred: dict[str, float] = {}
            for r in sorted({c.repeats for c in data.canaries}):
                group = [(c.text, _secret_span(c), _digit_candidates(c.secret, k, digits, rng))
                         for c in data.canaries if c.repeats == r]  # fmt: skip
                inferred[str(r)] = span_inference(score, group)["accuracy"]
            out["span_inference"]["canaries"] = inferred
    return out


def _secret_span(canary: Canary) -> Span:
    """Where a canary's secret sits in its text."""
    return Span(len(canary.prefix), len(canary.prefix) + len(canary.secret), CANARY_TYPE)


def _digit_candidates(secret: str, k: int, digits: int, rng: np.random.Generator) -> list[str]:
    """``secret`` and k − 1 other ``digits``-digit strings drawn uniformly (the canaries' own space)."""
    out = [secret]
    while len(out) < min(k, 10**digits):
        v = f"{int(rng.integers(0, 10**digits)):0{digits}d}"
        if v not in out:
            out.append(v)
    rng.shuffle(out)
    return out


# -- one model ----------------------------------------------------------------------------------------------
@dataclass
class TrainedText:
    """A trained text model and how it was made (for run.json and the audits)."""

    trainer: Trainer
    result: Any
    model: torch.nn.Module
    spec: dict[str, Any]
    wall_s: float

    @property
    def epsilon(self) -> float | None:
        """ε spent (None without DP; 0 for the public-only model, which reads Ψ(S) only)."""
        return None if math.isinf(self.result.epsilon) else float(self.result.epsilon)

    @property
    def replacement_epsilon(self) -> float | None:
        """The replace-one ε of the same steps (telling two values of a private span apart; None without DP)."""
        r = self.result.replacement_epsilon
        return None if r is None or math.isinf(r) else float(r)


def fit_batches(params: Mapping[str, Any], n: int) -> dict[str, Any]:
    """``params`` with every batch size above a quarter of the ``n`` training texts cut to n // 8 (at least 8).

    The presets' batches suit thousands of texts; a small file would otherwise be refused (a batch larger than the
    data) or get a handful of steps. The number of texts is no secret under feature DP: neighbouring datasets
    differ in span contents only.

    >>> fit_batches({"batch_size": 256, "lr": 0.1}, 400)
    {'batch_size': 50, 'lr': 0.1}
    """
    out = dict(params)
    for key in ("batch_size", "public_batch_size", "pretrain_batch_size"):
        if key in out and out[key] is not None and out[key] > n // 4:
            out[key] = max(8, n // 8)
    return out


def train_text_model(*, data: TextData, method: str, epsilon: float | None, delta: float, seed: int | None,
                     model: Mapping[str, Any], params: Mapping[str, Any], device: str | None = None,
                     progress: bool = False, **settings: Any) -> TrainedText:  # fmt: skip
    """Train ``method`` on ``data`` (Ψ = its TokenView, ℓ = mean token NLL) at ``epsilon``.

    ``seed`` is the public seed (initialisation, public batches); the private randomness is OS entropy unless
    ``settings`` say otherwise (they go to the Trainer, e.g. ``secure_rng``).
    """
    record = get_method(method)
    split = CausalLMSplit(TokenView(data.psi))
    spec = text_model_spec(data, model)
    net = build_model(spec, seed=None if seed is None else init_seed(seed))
    kwargs = trainer_arguments(record, {**fit_batches(params, len(data.train)), **settings}, epsilon=epsilon,
                               delta=delta, device=device)  # fmt: skip
    t0 = time.perf_counter()
    trainer = Trainer(net, record.name, loss_split=split, public_seed=seed, progress=progress, **kwargs)
    result = trainer.fit(data.train.batch())
    return TrainedText(trainer, result, trainer.model.to("cpu"), spec, time.perf_counter() - t0)


def train_text_cell(*, data: TextData, method: str, epsilon: float | None, delta: float, seed: int,
                    model: Mapping[str, Any], params: Mapping[str, Any], audit: Mapping[str, Any],
                    device: str | None = None, record_epsilon: float | None = None,
                    ) -> tuple[dict[str, Any], torch.nn.Module]:  # fmt: skip
    """Train ``method`` on the text task at ``epsilon`` (with the record-level backstop ``record_epsilon``, if
    given), audit it; returns (the cell's row, the model)."""
    extra: dict[str, Any] = {} if record_epsilon is None else {"record_epsilon": record_epsilon}
    done = train_text_model(data=data, method=method, epsilon=epsilon, delta=delta, seed=seed, model=model,
                            params=params, device=device, **extra)  # fmt: skip
    spent = done.epsilon
    # Theorem 4's bound at the run's ε (0 for the public-only model; none without DP)
    audits = audit_text_model(done.model, data, epsilon=spent, delta=None if spent is None else delta, audit=audit,
                              attacks=TEXT_ATTACKS if data.canaries else ("extraction", "span"))  # fmt: skip
    audits.setdefault("canary_exposure", None)
    plan, result = done.result.plan, done.result
    row = {
        "method": method, "target_epsilon": epsilon, "seed": seed, "epsilon": spent,
        "replacement_epsilon": done.replacement_epsilon, "delta": result.delta,
        "noise_multiplier": plan.noise_multiplier, "max_grad_norm": plan.max_grad_norm,
        "batch_size": plan.expected_batch_size, "steps": result.steps, "pretrain_steps": result.pretrain_steps,
        "train_wall_s": round(done.wall_s, 1), "guarantee": result.guarantee, **audits,
        "backstop": record_epsilon, "record_epsilon": result.record_epsilon,
        "record_noise_multiplier": plan.record_noise_multiplier,
    }  # fmt: skip
    return row, done.model


# -- the comparison -----------------------------------------------------------------------------------------
@dataclass
class TextCompareConfig:
    """One ``featuredp compare --task text``: methods × ε × seeds on the corpus or a user's JSONL."""

    out: Path
    methods: list[str] = field(default_factory=lambda: list(TEXT_METHODS))
    epsilons: list[float] = field(default_factory=lambda: [1.0, 3.0, 8.0])
    seeds: list[int] = field(default_factory=lambda: [0])
    quick: bool = False
    data: dict[str, Any] = field(default_factory=dict)
    delta: float | None = None
    device: str | None = None
    progress: bool = True
    overwrite: bool = False
    report_only: bool = False
    command: str = "featuredp compare --task text"
    #: the record-level backstop E: each of public, fdp_dpsgd, fdp also runs with it (its own arm); None: none
    record_epsilon: float | None = None

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        for m in self.methods:
            check_choice("methods", m, TEXT_METHODS)
        if not self.methods:
            raise ValueError("methods: give at least one method")
        for e in self.epsilons:
            if not (isinstance(e, (int, float)) and e > 0 and math.isfinite(e)):
                raise ValueError(f"epsilons: each target must be a positive finite number, got {e!r}")
        if self.delta is not None:
            check_open_unit("delta", self.delta)
        if self.record_epsilon is not None:
            self.record_epsilon = check_positive("record_epsilon", self.record_epsilon)


#: the methods that take a backstop arm in the text comparison (dpsgd already is record-level DP)
BACKSTOP_METHODS = ("public", "fdp_dpsgd", "fdp")


def text_preset(quick: bool) -> dict[str, Any]:
    """A deep copy of the text preset (its ``quick`` variant merged in with ``quick``)."""
    preset = copy.deepcopy(TEXT_PRESET)
    quick_part = preset.pop("quick")
    if quick:
        for key, value in quick_part.items():
            if key == "methods":
                for m, p in value.items():
                    preset["methods"][m].update(p)
            elif isinstance(value, dict):
                preset[key].update(value)
            else:
                preset[key] = value
    return preset


def data_options(preset: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`load_text_data` arguments: the preset's, then ``given``. The preset's corpus sizes (``n_train``,
    ``n_test``) are for the generated corpus only: a user's file (``path``) is used whole unless ``given`` says."""
    out = {"canary_digits": int(preset["audit"].get("digits", 4)), **preset["load"]}
    if given.get("path"):
        out.pop("n_train", None)
        out.pop("n_test", None)
    return {**out, **dict(given)}


#: the audits' design (2: random targets, recurring values' prior, held-out labels); a cell audited by another is
#: not reused
AUDIT_VERSION = 2


def cell_key(grid: Mapping[str, Any], method: str, epsilon: float | None, seed: int,
             record_epsilon: float | None = None) -> str:  # fmt: skip
    """The hash of everything that determines one cell's result: the data, model, audits, δ and this method's
    settings (its backstop E included, when it has one), never the rest of the grid (a ``--methods`` subset or more
    ε reuse the cells they share)."""
    own = {k: grid[k] for k in ("task", "load", "model", "audit", "delta")}
    backstop = {} if record_epsilon is None else {"record_epsilon": record_epsilon}
    return settings_hash({**own, "audit_version": AUDIT_VERSION, "method": method, "params": grid["methods"][method],
                          "cell": [method, epsilon, seed], **backstop})  # fmt: skip


def run_text_compare(cfg: TextCompareConfig) -> dict[str, Any]:
    """Run (or reuse) every cell; write results.json, summary.md and text_privacy.png; return the summary."""
    preset = text_preset(cfg.quick)
    delta = cfg.delta if cfg.delta is not None else preset["delta"]
    load = data_options(preset, cfg.data)
    grid = {"task": TASK, "load": load, "model": preset["model"], "audit": preset["audit"], "delta": delta,
            "methods": {m: preset["methods"][m] for m in cfg.methods}, "epsilons": cfg.epsilons,
            "seeds": cfg.seeds,
            **({} if cfg.record_epsilon is None else {"record_epsilon": cfg.record_epsilon})}  # fmt: skip
    cfg.out.mkdir(parents=True, exist_ok=True)
    grid_file = cfg.out / "grid.json"
    if grid_file.exists() and not cfg.overwrite:
        theirs = json.loads(grid_file.read_text()).get("hash")
        if theirs != settings_hash(grid):
            raise ValueError(f"--out {str(cfg.out)!r} holds a different text comparison (grid.json); choose another "
                             "folder or pass --overwrite")  # fmt: skip
    atomic_write_json(grid_file, {"hash": settings_hash(grid), **grid})
    say = (lambda msg: print(f"compare text: {msg}", file=sys.stderr, flush=True)) if cfg.progress else (
        lambda msg: None)  # fmt: skip
    data = load_text_data(**load)
    # no load time here: the detectors' time depends on the full texts, span contents included
    say(f"{data.source}; {data.train.truncated} redacted training texts cut at {data.train.max_len} tokens")
    arms: list[tuple[str, float | None]] = [(m, None) for m in cfg.methods]
    if cfg.record_epsilon is not None:
        arms += [(m, cfg.record_epsilon) for m in cfg.methods if m in BACKSTOP_METHODS]
    cells = [(m, None if not get_method(m).private else e, s, b) for m, b in arms
             for e in ([None] if not get_method(m).private else cfg.epsilons) for s in cfg.seeds]  # fmt: skip
    (cfg.out / "cells").mkdir(exist_ok=True)
    rows: list[dict[str, Any]] = []
    reused = 0
    started = time.perf_counter()
    for i, (method, eps, seed, backstop) in enumerate(cells, 1):
        key = cell_key(grid, method, eps, seed, backstop)
        arm = method if backstop is None else f"{method}__backstop{backstop:g}"
        path = cfg.out / "cells" / f"{arm}__eps{eps if eps is not None else 'none'}__seed{seed}__{key}.json"
        if path.exists():
            rows.append(json.loads(path.read_text()))
            reused += 1
            continue
        if cfg.report_only:
            continue
        say(f"cell {i} of {len(cells)}: {text_arm_label(method, backstop)}, ε = {eps if eps is not None else '—'}, "
            f"seed {seed} ({time.perf_counter() - started:.0f} s so far)")
        row, _ = train_text_cell(data=data, method=method, epsilon=eps, delta=delta, seed=seed,
                                 model=preset["model"], params=preset["methods"][method], audit=preset["audit"],
                                 device=cfg.device, record_epsilon=backstop)  # fmt: skip
        atomic_write_json(path, row)
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"no finished cells of this comparison in {str(cfg.out)!r}")
    summary = summarize_text(rows)
    meta = {"source": data.source, "heldout": data.heldout, "disclosure": data.psi.describe().hides,
            "model": text_model_spec(data, preset["model"]), "delta": delta, "quick": cfg.quick, "command": cfg.command,
            "methods": grid["methods"], "audit": preset["audit"], "canaries": [
                {"repeats": c.repeats, "secret": c.secret} for c in data.canaries],
            "wall_s": round(time.perf_counter() - started, 1), "cells_run": len(rows) - reused,
            "cells_reused": reused,
            "train_wall_s": round(sum(float(r.get("train_wall_s") or 0.0) for r in rows), 1)}  # fmt: skip
    result = {"task": TASK, "out": str(cfg.out), "rows": summary, "cells": rows, "meta": meta}
    atomic_write_json(cfg.out / "results.json", result)
    atomic_write_text(cfg.out / "summary.md", render_text_summary(summary, meta))
    text_privacy_plot(summary, cfg.out / "text_privacy.png")
    return result


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _mean_by_key(dicts: Sequence[Mapping[str, float]]) -> dict[str, float | None]:
    keys = sorted({k for d in dicts for k in d}, key=int)
    return {k: _mean([d.get(k) for d in dicts]) for k in keys}


#: the least gap (bits) between the non-private model's canary exposure and a private model's for the exposure audit
#: to have power: below it the canaries are not memorised enough for a low exposure to say anything
EXPOSURE_POWER_BITS = 3.0


def mark_exposure_power(rows: Sequence[dict[str, Any]]) -> None:
    """Add ``exposure_power_bits`` and ``exposure_no_power`` to each private row of a summary, in place.

    The gap is max over repeat counts (10×, 100×, ...) of the non-private model's mean exposure minus this row's;
    below :data:`EXPOSURE_POWER_BITS` the audit has no power (the non-private model did not memorise the canaries
    either, so a private model's low exposure is no evidence). Without a non-private row with exposures: None.
    """
    ref = next((r.get("exposure_by_repeats") or {} for r in rows if r["method"] == "nonprivate"), {})
    for r in rows:
        if r["method"] == "nonprivate":
            continue
        mine = r.get("exposure_by_repeats") or {}
        gaps = [float(ref[k]) - float(mine[k]) for k in ref if k in mine and k != "1"
                and ref[k] is not None and mine[k] is not None]  # fmt: skip
        r["exposure_power_bits"] = max(gaps) if gaps else None
        r["exposure_no_power"] = None if not gaps else bool(max(gaps) < EXPOSURE_POWER_BITS)


def summarize_text(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per method × target ε: means over seeds of perplexity, exposure, extraction, span inference."""
    groups: dict[tuple[str, float | None, float | None], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["target_epsilon"], r.get("backstop")), []).append(r)
    out = []
    for (method, eps, backstop), rs in groups.items():
        ppl = [float(r["perplexity"]) for r in rs]
        ext = [r["extraction"] for r in rs]
        spi = [r["span_inference"] for r in rs if r.get("span_inference")]
        out.append({
            "method": method, "epsilon": eps, "seeds": len(rs), "backstop": backstop,
            "label": text_arm_label(method, backstop),
            "epsilon_spent": _mean([r["epsilon"] for r in rs]),
            "record_epsilon": _mean([r.get("record_epsilon") for r in rs]),
            "replacement_epsilon_spent": _mean([r.get("replacement_epsilon") for r in rs]),
            "perplexity": float(np.mean(ppl)), "perplexity_std": float(np.std(ppl, ddof=1)) if len(ppl) > 1 else 0.0,
            "canary_exposure": _mean([r["canary_exposure"] for r in rs]),
            "exposure_by_repeats": {k: _mean([r["exposure"]["by_repeats"][k]["mean_exposure"] for r in rs
                                              if "exposure" in r])
                                    for k in (rs[0].get("exposure") or {}).get("by_repeats", {})},
            "extraction": {"rate": _mean([e["rate"] for e in ext]),
                           "heldout_rate": _mean([e.get("heldout", {}).get("rate") for e in ext]),
                           "excess_rate": _mean([(e.get("excess_rate") or {}).get("all") for e in ext]),
                           "tried": int(np.mean([e["tried"] for e in ext])),
                           "canaries": _mean_by_key([e.get("canaries") or {} for e in ext])},
            "span_inference": None if not spi else {
                "accuracy": _mean([s["accuracy"] for s in spi]), "prior": _mean([s["prior_baseline"] for s in spi]),
                "bound": _mean([s["bound"] for s in spi]), "violates": any(bool(s["violates"]) for s in spi),
                "n": int(np.mean([s["n"] for s in spi])),
                "canaries": _mean_by_key([s.get("canaries") or {} for s in spi])},
            "train_wall_s": _mean([r["train_wall_s"] for r in rs]),
        })  # fmt: skip
    mark_exposure_power(out)
    order = {m: i for i, m in enumerate(TEXT_METHODS)}
    out.sort(key=lambda r: (order.get(str(r["method"]), 99), r["backstop"] or 0.0, cast(float, r["epsilon"] or 0.0)))
    return out


def text_arm_label(method: str, backstop: float | None) -> str:
    """A row's name: the method's, with `` + backstop E=8`` for a backstop arm.

    >>> text_arm_label("fdp", 8.0), text_arm_label("public", None)
    ('fdp + backstop E=8', 'public')
    """
    return method if backstop is None else f"{method} + backstop E={backstop:g}"
