"""Audits of language models trained on text with private spans (numpy only; the model comes in as callables).

Three audits, each measuring what a trained model reveals about the *contents* of private spans:

* **canary exposure** (:func:`exposure`, :func:`exposure_report`; Carlini et al. 2019, "The Secret Sharer"):
  secrets planted in the training text (``prefix + secret``, repeated 1, 10, 100 times) are ranked by the
  model's NLL among every candidate of their space R (e.g. all 6-digit strings, :func:`digit_candidates`);
  exposure = log2|R| − log2 rank, from ≈ 1.44 bits (a model that knows nothing) to log2|R| (the secret
  ranks first).
* **extraction** (:func:`extraction`): prompt with the text before each private span, decode greedily, count
  the spans reproduced exactly; the same on held-out records separates memorisation from values that are
  simply guessable (a frequent name).
* **span inference** (:func:`span_inference`), feature DP's own threat model: the attacker knows a training
  record's whole text except one span's contents and a set of k candidates for it; it picks the candidate
  under which the model finds the full text likeliest. Its accuracy is compared with the prior (1/k) and with
  Theorem 4's bound for the training's (ε, δ).

The model enters only through two callables (``featuredp.lm.lm_scorer`` and ``featuredp.lm.lm_generator`` build
them from a torch model), so this module imports neither torch nor the model code:

* ``score(prefixes, suffixes) -> np.ndarray``: the NLL in nats of each suffix given its prefix;
* ``generate(prompt, max_new_tokens) -> str``: the greedy continuation of ``prompt`` (the new text only).

Ranks count ties as half (:data:`TIE_RULE`): a candidate scored equal to the true one is ranked above it with
probability ½, the expected rank when ties are broken at random. Every result is a plain JSON-able dict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from featuredp._validate import check_int, check_nonnegative, check_open_unit
from featuredp.accounting.tradeoff import attribute_inference_bound
from featuredp.attacks.bounds import clopper_pearson

if TYPE_CHECKING:  # featuredp.features imports torch (image maps): spans are only duck-typed at run time
    from featuredp.features.text import Span

__all__ = [
    "TIE_RULE",
    "GenerateFn",
    "ScoreFn",
    "TextCanary",
    "chance_exposure",
    "digit_candidates",
    "exposure",
    "exposure_report",
    "extraction",
    "span_inference",
]

#: NLL in nats of each suffix given its prefix (one value per pair).
ScoreFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]
#: Greedy continuation of a prompt (the new text only), at most ``max_new_tokens`` tokens.
GenerateFn = Callable[[str, int], str]

#: How ranks treat ties (recorded in every report).
TIE_RULE = "ties count half: rank = 1 + #lower + #tied/2 (the expected rank under random tie-breaking)"

_DEFAULT_CHUNK = 4096


# ----------------------------------------------------------------------------- scoring helpers


def _score_pairs(score: ScoreFn, pairs: Iterable[tuple[str, str]], chunk_size: int) -> np.ndarray:
    """NLL of every (prefix, suffix) pair, ``chunk_size`` pairs per call of ``score``."""
    out: list[np.ndarray] = []
    it: Iterator[tuple[str, str]] = iter(pairs)
    while True:
        chunk = list(islice(it, chunk_size))
        if not chunk:
            break
        prefixes = [p for p, _ in chunk]
        suffixes = [s for _, s in chunk]
        nll = np.asarray(score(prefixes, suffixes), dtype=float)
        if nll.shape != (len(chunk),):
            raise ValueError(f"score must return one NLL per (prefix, suffix) pair, shape ({len(chunk)},), "
                             f"got shape {nll.shape}")  # fmt: skip
        if np.any(np.isnan(nll)):
            raise ValueError("score returned NaN NLLs")
        out.append(nll)
    return np.concatenate(out) if out else np.zeros(0)


def _rank(values: np.ndarray, target: float) -> float:
    """Rank of ``target`` (one of ``values``, lower = better) with ties counted half."""
    lower = int(np.count_nonzero(values < target))
    tied = int(np.count_nonzero(values == target)) - 1  # the target itself is not a tie
    return 1.0 + lower + max(tied, 0) / 2.0


def _distinct(name: str, candidates: Sequence[str]) -> list[str]:
    cands = list(candidates)
    if not all(isinstance(c, str) for c in cands):
        raise ValueError(f"{name} must be strings")
    if len(set(cands)) != len(cands):
        raise ValueError(f"{name} must be distinct (a duplicate would tie with itself), got {len(cands)} "
                         f"with {len(cands) - len(set(cands))} duplicates")  # fmt: skip
    return cands


# ----------------------------------------------------------------------------- canary exposure


@dataclass(frozen=True)
class TextCanary:
    """A planted secret: the training text holds ``prefix + secret`` ``repeats`` times."""

    prefix: str
    secret: str
    repeats: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not isinstance(self.secret, str) or not self.secret:
            raise ValueError(f"canary prefix and secret must be strings (secret non-empty), got "
                             f"{self.prefix!r}, {self.secret!r}")  # fmt: skip
        check_int("repeats", self.repeats, minimum=0)


def _as_canary(c: Any) -> TextCanary:
    if isinstance(c, TextCanary):
        return c
    if isinstance(c, Mapping):
        return TextCanary(c["prefix"], c["secret"], int(c.get("repeats", 1)))
    return TextCanary(c.prefix, c.secret, int(getattr(c, "repeats", 1)))


def digit_candidates(digits: int) -> list[str]:
    """Every string of ``digits`` decimal digits, leading zeros included: the space R of a digit secret.

    >>> digit_candidates(2)[:3], len(digit_candidates(2))
    (['00', '01', '02'], 100)
    """
    d = check_int("digits", digits, minimum=1)
    if d > 8:
        raise ValueError(f"digits must be <= 8 (10^digits candidates are all scored), got {digits!r}")
    return [f"{i:0{d}d}" for i in range(10**d)]


def chance_exposure(space_size: int) -> float:
    """Expected exposure of a secret whose rank is uniform on 1..|R| (a model that knows nothing).

    E[log2|R| − log2 U] = log2|R| − log2(|R|!)/|R|, which tends to 1/ln 2 ≈ 1.4427 bits. (A scorer that ties
    every candidate gets log2(2|R|/(|R| + 1)) ≈ 1 bit under :data:`TIE_RULE`: less, by Jensen.)

    >>> round(chance_exposure(10**6), 3)
    1.443
    """
    n = check_int("space_size", space_size, minimum=1)
    return float(math.log2(n) - math.lgamma(n + 1) / math.log(2) / n)


def _exposures(score: ScoreFn, prefix: str, secrets: Sequence[str], cands: list[str],
               index: dict[str, int], chunk_size: int) -> list[tuple[float, float]]:  # fmt: skip
    """(rank, exposure) of each secret after prefix; candidates scored once for all of them."""
    for s in secrets:
        if s not in index:
            raise ValueError(f"secret {s!r} must be one of the candidates (the space R it is ranked in)")
    nll = _score_pairs(score, ((prefix, c) for c in cands), chunk_size)
    log_r = math.log2(len(cands))
    out = []
    for s in secrets:
        rank = _rank(nll, float(nll[index[s]]))
        out.append((rank, log_r - math.log2(rank)))
    return out


def exposure(score: ScoreFn, prefix: str, secret: str, candidates: Sequence[str], *,
             chunk_size: int = _DEFAULT_CHUNK) -> float:  # fmt: skip
    """Exposure of ``secret`` after ``prefix`` in bits: log2|R| − log2 rank (Carlini et al. 2019).

    ``candidates`` is the space R (distinct strings, ``secret`` among them); every candidate is scored as
    ``score([prefix], [candidate])`` in chunks of ``chunk_size``, and the rank is 1 + the number of candidates
    with a strictly lower NLL + half the number of other candidates with an equal NLL (:data:`TIE_RULE`).
    """
    cands = _distinct("candidates", candidates)
    chunk = check_int("chunk_size", chunk_size, minimum=1)
    index = {c: i for i, c in enumerate(cands)}
    return _exposures(score, prefix, [secret], cands, index, chunk)[0][1]


def exposure_report(score: ScoreFn, canaries: Sequence[Any], candidates: Sequence[str], *,
                    chunk_size: int = _DEFAULT_CHUNK) -> dict[str, Any]:  # fmt: skip
    """Exposure of every canary, and its mean per repeat count.

    ``canaries``: :class:`TextCanary` objects, or anything with ``prefix``, ``secret`` and ``repeats``
    (attributes or keys). ``candidates``: the space R all secrets are drawn from. Canaries that share a prefix
    share one scoring of R. The report holds the canaries' secrets: they are the auditor's own.

    Returns ``{"space_size", "max_exposure" (log2|R|), "chance_exposure" (:func:`chance_exposure`),
    "tie_rule", "mean_exposure", "canaries": [{"prefix", "secret", "repeats", "rank", "exposure"}],
    "by_repeats": {"<repeats>": {"n", "mean_exposure", "min_exposure", "max_exposure"}}}``.
    """
    items = [_as_canary(c) for c in canaries]
    if not items:
        raise ValueError("canaries must hold at least one canary, got 0")
    cands = _distinct("candidates", candidates)
    if not cands:
        raise ValueError("candidates must hold the secrets' space R, got 0 candidates")
    chunk = check_int("chunk_size", chunk_size, minimum=1)
    index = {c: i for i, c in enumerate(cands)}
    by_prefix: dict[str, list[int]] = {}
    for i, c in enumerate(items):
        by_prefix.setdefault(c.prefix, []).append(i)
    results: list[tuple[float, float]] = [(0.0, 0.0)] * len(items)
    for prefix, idx in by_prefix.items():
        for i, r in zip(idx, _exposures(score, prefix, [items[i].secret for i in idx], cands, index, chunk)):
            results[i] = r
    rows = [{"prefix": c.prefix, "secret": c.secret, "repeats": c.repeats, "rank": float(r), "exposure": float(e)}
            for c, (r, e) in zip(items, results)]  # fmt: skip
    by_repeats: dict[str, dict[str, Any]] = {}
    for reps in sorted({c.repeats for c in items}):
        ex = np.array([e for c, (_, e) in zip(items, results) if c.repeats == reps])
        by_repeats[str(reps)] = {"n": int(ex.size), "mean_exposure": float(ex.mean()),
                                 "min_exposure": float(ex.min()), "max_exposure": float(ex.max())}  # fmt: skip
    return {
        "space_size": len(cands),
        "max_exposure": float(math.log2(len(cands))),
        "chance_exposure": chance_exposure(len(cands)),
        "tie_rule": TIE_RULE,
        "mean_exposure": float(np.mean([e for _, e in results])),
        "canaries": rows,
        "by_repeats": by_repeats,
    }


# ----------------------------------------------------------------------------- extraction


def _check_span(text: str, span: Any, where: str) -> tuple[int, int, str]:
    start, end, kind = span.start, span.end, span.type
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(text)):
        raise ValueError(f"{where}: span [{start}, {end}) must lie inside its text ({len(text)} characters)")
    return start, end, str(kind)


def _rate_block(tried: int, hits: int) -> dict[str, Any]:
    if tried == 0:
        return {"tried": 0, "extracted": 0, "rate": None, "rate_ci": None}
    return {"tried": tried, "extracted": hits, "rate": hits / tried, "rate_ci": list(clopper_pearson(hits, tried))}


def _extract(generate: GenerateFn, records: Sequence[tuple[str, Sequence[Span]]], types: set[str] | None,
             max_new_tokens: int | None, show: bool, label: str) -> dict[str, Any]:  # fmt: skip
    counts: dict[str, list[int]] = {}
    examples: list[dict[str, Any]] = []
    cache: dict[tuple[str, int], str] = {}
    for r, rec in enumerate(records):
        try:
            text, spans = rec
        except (TypeError, ValueError):
            raise ValueError(f"{label}[{r}] must be a (text, spans) pair") from None
        for j, span in enumerate(spans):
            start, end, kind = _check_span(text, span, f"{label}[{r}] span {j}")
            if types is not None and kind not in types:
                continue
            secret = text[start:end]
            n = max_new_tokens if max_new_tokens is not None else len(secret.encode("utf-8"))
            key = (text[:start], n)
            if key not in cache:  # records that share the text before a span need one generation
                cache[key] = generate(key[0], n)
            cont = cache[key]
            if not isinstance(cont, str):
                raise ValueError(f"generate must return a string, got {type(cont).__name__}")
            hit = cont.startswith(secret)
            c = counts.setdefault(kind, [0, 0])
            c[0] += 1
            c[1] += int(hit)
            if show:
                examples.append({"record": r, "span": j, "type": kind, "value": secret,
                                 "continuation": cont[: max(len(secret), 1) * 2], "extracted": hit})  # fmt: skip
    tried = sum(c[0] for c in counts.values())
    hits = sum(c[1] for c in counts.values())
    out = _rate_block(tried, hits)
    out["by_type"] = {k: _rate_block(*counts[k]) for k in sorted(counts)}
    if show:
        out["examples"] = examples
    return out


def extraction(
    generate: GenerateFn,
    records: Sequence[tuple[str, Sequence[Span]]],
    *,
    span_types: Sequence[str] | None = None,
    max_new_tokens: int | None = None,
    heldout: Sequence[tuple[str, Sequence[Span]]] | None = None,
    show: bool = False,
) -> dict[str, Any]:
    """Greedy extraction of private spans from their left context.

    For every span of ``records`` (the training records, ``(text, spans)`` pairs; only types in
    ``span_types`` when given) the model continues ``text[:span.start]`` greedily for ``max_new_tokens``
    tokens (default: the span's length in UTF-8 bytes, enough for any tokenizer whose tokens cover at least a
    byte); a span is *extracted* when the continuation starts with its exact contents. ``heldout``: records
    not trained on, attacked the same way — a value the model produces for them too (a frequent name, a
    formulaic date) is guessable rather than memorised, so ``excess_rate`` (training − held-out) is the
    memorisation signal.

    Returns ``{"tried", "extracted", "rate", "rate_ci" (two-sided 95% Clopper–Pearson), "by_type": {type:
    {...the same}}, "heldout": {...} | None, "excess_rate": {"all" | type: float} | None, "max_new_tokens"}``;
    counts only — the spans' contents and the continuations are added (``"examples"``) only with ``show=True``,
    since they are real records' private data.
    """
    if max_new_tokens is not None:
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=1)
    types = None if span_types is None else {str(t) for t in span_types}
    out = _extract(generate, records, types, max_new_tokens, show, "records")
    out["max_new_tokens"] = max_new_tokens if max_new_tokens is not None else "span length in UTF-8 bytes"
    out["heldout"] = None
    out["excess_rate"] = None
    if heldout is not None:
        ho = _extract(generate, heldout, types, max_new_tokens, show, "heldout")
        out["heldout"] = ho
        excess: dict[str, float] = {}
        if out["rate"] is not None and ho["rate"] is not None:
            excess["all"] = out["rate"] - ho["rate"]
        for k, blk in out["by_type"].items():
            other = ho["by_type"].get(k)
            if blk["rate"] is not None and other is not None and other["rate"] is not None:
                excess[k] = blk["rate"] - other["rate"]
        out["excess_rate"] = excess
    return out


# ----------------------------------------------------------------------------- span inference


def _bound(epsilon: float | None, delta: float, ball: float) -> float | None:
    if epsilon is None:
        return None
    if math.isinf(epsilon):
        return 1.0
    return float(attribute_inference_bound({"epsilon": epsilon, "delta": delta}, ball))


def _inference_block(hits: np.ndarray, ranks: np.ndarray, best_prior: np.ndarray, ball: float | None,
                     epsilon: float | None, delta: float, confidence: float) -> dict[str, Any]:  # fmt: skip
    n = int(hits.size)
    h = int(hits.sum())
    # each end of the two-sided (2c − 1) interval is a one-sided c limit
    lo, hi = clopper_pearson(h, n, 2.0 * confidence - 1.0)
    prior = float(np.mean(best_prior))
    b = prior if ball is None else ball
    return {
        "n": n,
        "hits": h,
        "accuracy": h / n,
        "accuracy_lower": lo,
        "accuracy_upper": hi,
        "mean_rank": float(ranks.mean()),
        "prior_baseline": prior,
        "ball": b,
        "bound": _bound(epsilon, delta, b),
    }


def span_inference(
    score: ScoreFn,
    targets: Sequence[tuple[str, Span, Sequence[str]]],
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    ball: float | None = None,
    confidence: float = 0.95,
    seed: int | None = 0,
    chunk_size: int = _DEFAULT_CHUNK,
    priors: Sequence[Sequence[float]] | None = None,
    groups: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Infer one span's contents of training records from the model, against Theorem 4's bound.

    Threat model: for each target ``(text, span, candidates)`` the attacker knows the whole training text
    except the contents of ``span`` — the other spans' contents included — and a candidate set for it (the
    true value, which must be among the distinct ``candidates``, and k − 1 others drawn from the same
    distribution, e.g. other records' values of that type). It scores every candidate c as
    ``score([text[:span.start]], [c + text[span.end:]])`` (the full text's NLL up to the shared prefix) and
    guesses the lowest, ties broken at random (``seed``).

    Compared with (a) the prior-only baseline, the mean of 1/k, which is the best success without the model
    when the true value is uniform among its candidates given the known text; and (b) Theorem 4's bound
    1 − f_{ε,δ}(Ball) (:func:`featuredp.accounting.tradeoff.attribute_inference_bound`) with Ball = that prior
    (or ``ball``), for the feature-DP (ε, δ) of the training (``epsilon=None``: no bound, non-private). The
    bound holds for the success averaged over targets (Jensen). ``violates`` is True only when the accuracy's
    one-sided ``confidence`` lower limit (Clopper–Pearson) exceeds the bound; ``accuracy_upper`` is the
    matching upper limit. Hits of one model are treated as independent trials, as usual in audits.

    If the true value also occurs verbatim elsewhere in the known text, an attacker needs no model for it
    and Ball = 1/k understates the prior: such targets are counted in ``value_elsewhere`` (choose targets
    without them, or pass a larger ``ball``).

    ``priors``: when the true value is *not* uniform among its candidates (values that recur, e.g. first names),
    the prior probability of each candidate of each target (same order as its candidates; each row is normalised
    here). The prior-only baseline is then the mean over targets of the largest prior probability — the success
    of the best guess without the model (always the likeliest candidate) — and Ball defaults to it. ``groups``:
    per target, how many training records hold its true value; the result gets ``by_group`` (``"1"``,
    ``"2-10"``, ``">10"``), since a value many records share is learnt from all of them.

    Returns ``{"n", "hits", "accuracy", "accuracy_lower", "accuracy_upper", "mean_rank", "prior_baseline",
    "ball", "bound", "violates", "no_power", "epsilon", "delta", "confidence", "k": {"min", "max", "mean"},
    "value_elsewhere", "tie_rule", "by_type": {type: {n, hits, accuracy, accuracy_lower, accuracy_upper,
    mean_rank, prior_baseline, ball, bound}}, "by_group": {...the same} | None}`` (per-type and per-group limits
    are not corrected for the several types or groups).
    """
    conf = check_open_unit("confidence", confidence)
    if conf <= 0.5:
        raise ValueError(f"confidence must be in (0.5, 1) (a one-sided level), got {confidence!r}")
    chunk = check_int("chunk_size", chunk_size, minimum=1)
    eps = None if epsilon is None else check_nonnegative("epsilon", epsilon, allow_inf=True)
    d = 0.0 if delta is None else check_nonnegative("delta", delta)
    if d > 1:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    if ball is not None:
        ball = float(ball)
        if not 0.0 <= ball <= 1.0:
            raise ValueError(f"ball must be a probability in [0, 1], got {ball!r}")
    if not targets:
        raise ValueError("targets must hold at least one (text, span, candidates) triple, got 0")
    if priors is not None and len(priors) != len(targets):
        raise ValueError(f"priors must hold one row per target ({len(targets)}), got {len(priors)}")
    if groups is not None and len(groups) != len(targets):
        raise ValueError(f"groups must hold one group size per target ({len(targets)}), got {len(groups)}")
    parsed: list[tuple[str, str, list[str], int, str]] = []
    best_prior: list[float] = []
    elsewhere = 0
    for t, tgt in enumerate(targets):
        try:
            text, span, candidates = tgt
        except (TypeError, ValueError):
            raise ValueError(f"targets[{t}] must be a (text, span, candidates) triple") from None
        start, end, kind = _check_span(text, span, f"targets[{t}]")
        cands = _distinct(f"targets[{t}] candidates", candidates)
        truth = text[start:end]
        if len(cands) < 2 or truth not in cands:
            raise ValueError(f"targets[{t}] candidates must hold >= 2 values including the span's true contents, "
                             f"got {len(cands)} (true value {'in' if truth in cands else 'missing'})")  # fmt: skip
        elsewhere += int(truth in text[:start] or truth in text[end:])
        parsed.append((text[:start], text[end:], cands, cands.index(truth), kind))
        if priors is not None:
            row = np.asarray(priors[t], dtype=float)
            if row.shape != (len(cands),) or np.any(row < 0) or not row.sum() > 0:
                raise ValueError(f"priors[{t}] must hold {len(cands)} non-negative weights (one per candidate), "
                                 "not all zero")
            best_prior.append(float(row.max() / row.sum()))
        else:
            best_prior.append(1.0 / len(cands))
    nll = _score_pairs(score, ((p, c + rest) for p, rest, cands, _, _ in parsed for c in cands), chunk)
    rng = np.random.default_rng(seed)
    hits, ranks, ks, kinds = [], [], [], []
    pos = 0
    for _, _, cands, ti, kind in parsed:
        v = nll[pos : pos + len(cands)]
        pos += len(cands)
        best = np.flatnonzero(v == v.min())
        hits.append(bool(rng.choice(best) == ti))
        ranks.append(_rank(v, float(v[ti])))
        ks.append(len(cands))
        kinds.append(kind)
    h, r, k, bp = np.array(hits), np.array(ranks), np.array(ks, dtype=float), np.array(best_prior)
    out = _inference_block(h, r, bp, ball, eps, d, conf)
    out["violates"] = None if out["bound"] is None else bool(out["accuracy_lower"] > out["bound"])
    # An attack no better than guessing from the prior alone cannot show a leak: "within the bound" would say
    # nothing, as an exposure audit whose non-private model memorised nothing says nothing.
    out["no_power"] = bool(out["accuracy"] <= out["prior_baseline"])
    out.update(
        {
            "epsilon": eps,
            "delta": d,
            "confidence": conf,
            "k": {"min": int(k.min()), "max": int(k.max()), "mean": float(k.mean())},
            "value_elsewhere": elsewhere,
            "tie_rule": TIE_RULE,
        }
    )
    kind_arr = np.array(kinds)
    out["by_type"] = {
        kind: _inference_block(h[kind_arr == kind], r[kind_arr == kind], bp[kind_arr == kind], ball, eps, d, conf)
        for kind in sorted(set(kinds))
    }
    out["by_group"] = None
    if groups is not None:
        g = np.array([int(x) for x in groups])
        bins = {"1": g <= 1, "2-10": (g >= 2) & (g <= 10), ">10": g > 10}
        out["by_group"] = {name: _inference_block(h[m], r[m], bp[m], ball, eps, d, conf)
                           for name, m in bins.items() if m.any()}  # fmt: skip
    return out
