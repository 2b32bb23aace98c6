"""The audits of a text model: canary exposure, extraction and span inference (``featuredp audit RUN --attack ...``).

Targets are drawn at random from OS entropy (never in file order); span inference handles recurring values with an
exact prior baseline; the scorer's length limit is respected for real records. The attacks themselves are
:mod:`featuredp.attacks.text`; this module picks their targets from a :class:`~featuredp.experiments.text_data
.TextData` and runs them on one model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from featuredp._validate import check_choice, check_int
from featuredp.attacks.text import digit_candidates, exposure_report, extraction, span_inference
from featuredp.data.text import Canary, TextRecord, Tokenizer
from featuredp.experiments.text_data import CANARY_TYPE, TextData
from featuredp.features.text import Span, placeholder
from featuredp.lm import lm_generator, lm_scorer, perplexity

__all__ = [
    "RANDOM_TARGETS",
    "TEXT_ATTACKS",
    "SpanTargets",
    "audit_text_model",
    "extraction_audit",
    "extraction_targets",
    "span_targets",
]


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
    #: per target, its record's user (None where the data names none)
    users: list[Any] = field(default_factory=list)


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
        out.users.append(r.user)
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
    users = data.users
    if users is not None:  # user level: the same targets by how many training records their user holds
        counts = Counter(users)
        own = {id(r): counts[u] for r, u in zip(data.train.records, users, strict=True)}
        out["by_user_records"] = {}
        for lo, hi in USER_BUCKETS:
            part = [r for r in train if lo <= own[id(r)] <= hi]
            if part:
                got = extraction(generate, [(r.text, r.spans) for r in part], span_types=types)
                out["by_user_records"][_bucket(lo, hi)] = {k: got[k] for k in ("tried", "extracted", "rate")}
    return out


#: the extraction audit's groups of users by their training records (user level: ``--user-field``)
USER_BUCKETS = ((1, 1), (2, 9), (10, 99), (100, 10**12))


def _bucket(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else (f"{lo}+" if hi >= 10**12 else f"{lo}-{hi}")


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
        users = data.users
        if out["span_inference"] is not None and users is not None:  # user level: by the target user's records
            counts = Counter(users)
            sizes = [counts[u] for u in drawn.users]
            by = span_inference(score, drawn.targets, priors=drawn.priors, groups=sizes, seed=None)["by_group"]
            out["span_inference"]["by_user_records"] = by
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
