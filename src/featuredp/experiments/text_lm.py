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
from featuredp._validate import check_choice, check_int, check_open_unit
from featuredp.attacks.text import digit_candidates, exposure_report, extraction, span_inference
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
from featuredp.engine import Trainer, init_seed
from featuredp.experiments.grid_config import settings_hash
from featuredp.experiments.presets import TEXT_PRESET, trainer_arguments
from featuredp.experiments.text_report import render_text_summary, text_privacy_plot
from featuredp.features.text import Span, TextSpans, placeholder
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
    "TextCompareConfig",
    "TextData",
    "TrainedText",
    "audit_text_model",
    "cell_key",
    "data_options",
    "fit_batches",
    "load_text_data",
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

    @property
    def originals(self) -> list[TextRecord]:
        """The training records that are not canaries (the audits' targets)."""
        return [r for r in self.train.records if not any(s.type == CANARY_TYPE for s in r.spans)]


def load_text_data(
    *,
    path: str | Path | None = None,
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

    ``spans``: the private span types (default: every type of the corpus; required for a file); ``detect`` /
    ``names``: built-in detectors run on a file's texts as well. ``canary_repeats`` (empty: none),
    ``canaries_per_repeat`` and ``canary_digits``: the exposure audit's canaries (secrets of ``canary_digits``
    digits), drawn from the public ``canary_seed`` (they are the auditor's, not users' data) and always private
    (type ``secret``). The test split is never trained on. ``options`` holds these arguments (``n_train``: the
    training texts before the canaries; ``names``: how many, not which), so these options with ``names`` given
    again rebuild the same data.
    """
    max_len = check_int("max_len", max_len, minimum=16)
    if path is None:
        types = tuple(spans) if spans else CORPUS_SPANS
        n_tr = check_int("n_train", n_train if n_train is not None else 4000, minimum=10)
        n_te = check_int("n_test", n_test if n_test is not None else 500, minimum=10)
        records = support_dialogues(n_tr + n_te, seed=corpus_seed, max_bytes=min(120, max_len - 2))
        train_recs, test_recs = records[:n_tr], records[n_tr:]
        source = (f"generated support messages (featuredp.data.text_corpus.support_dialogues, public seed "
                  f"{corpus_seed}): {n_tr:,} train / {n_te:,} test")  # fmt: skip
        psi = TextSpans(tuple(dict.fromkeys((*types, CANARY_TYPE))))
        train_recs = [TextRecord(r.text, [s for s in r.spans if s.type in types]) for r in train_recs]
        test_recs = [TextRecord(r.text, [s for s in r.spans if s.type in types]) for r in test_recs]
    else:
        if not spans:
            raise ValueError("--spans: name the private span types of --data FILE.jsonl (e.g. email,phone,name)")
        records = load_text_jsonl(path, spans=spans, detect=detect, names=names)
        train_recs, test_recs = split_records(records, test_fraction=test_fraction, split_seed=corpus_seed)
        if n_train is not None:
            train_recs = train_recs[: check_int("n_train", n_train, minimum=10)]
        if n_test is not None:
            test_recs = test_recs[: check_int("n_test", n_test, minimum=1)]
        source = f"{Path(path).name}: {len(train_recs):,} train / {len(test_recs):,} test (split seed {corpus_seed})"
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
    test = TextDataset(test_recs, psi, tokenizer=tok, max_len=max_len, name="text-test")
    options = {"path": None if path is None else str(path), "spans": list(psi.types), "detect": list(detect),
               "names": len(names), "n_train": n_originals, "n_test": len(test_recs), "max_len": max_len,
               "canary_repeats": list(canary_repeats), "canaries_per_repeat": canaries_per_repeat,
               "canary_digits": canary_digits, "corpus_seed": corpus_seed, "canary_seed": canary_seed}  # fmt: skip
    return TextData(train, test, canaries, psi, source, options)


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


def span_targets(records: Sequence[TextRecord], *, k: int = 10, n: int = 200, seed: int = 0,
                 min_distinct: float = 0.95) -> list[tuple[str, Span, list[str]]]:  # fmt: skip
    """Span-inference targets from ``records``: Ψ(x) with one span filled in, and k candidates for that span.

    Each target is one record's text with its other spans replaced by their placeholders (so the attacker
    knows exactly Ψ(x)), one of its spans, and k distinct candidates: the true value and the values of that
    type in k − 1 other records drawn uniformly (public ``seed``). For the prior of the true value to be 1/k the
    candidates must be exchangeable with it, which holds when a type's values are (nearly) all distinct: only
    types with at least ``min_distinct`` distinct values among their occurrences (and k of them) are targeted.
    A type with frequent repeats (first names alone) would make the commonest values likelier than 1/k, and a
    model that merely prefers them would seem to beat the prior.
    """
    rng = np.random.default_rng(seed)
    values: dict[str, list[str]] = {}
    for r in records:
        for s in r.spans:
            values.setdefault(s.type, []).append(r.text[s.start:s.end])
    pools = {t: v for t, v in values.items() if len(set(v)) >= max(k, min_distinct * len(v))}
    out: list[tuple[str, Span, list[str]]] = []
    for i in rng.permutation(len(records)):
        r = records[int(i)]
        span = next((s for s in sorted(r.spans) if s.type in pools), None)
        if span is None:
            continue
        true = r.text[span.start:span.end]
        cands = [true]
        for j in rng.permutation(len(pools[span.type])):
            v = pools[span.type][int(j)]
            if v not in cands:
                cands.append(v)
                if len(cands) == k:
                    break
        rng.shuffle(cands)
        text, moved = _placeholdered(r, span)
        out.append((text, moved, cands))
        if len(out) >= n:
            break
    return out


#: the audits of a text model (``featuredp audit RUN --attack ...``)
TEXT_ATTACKS = ("exposure", "extraction", "span")


def audit_text_model(model: torch.nn.Module, data: TextData, *, epsilon: float | None, delta: float | None,
                     audit: Mapping[str, Any], attacks: Sequence[str] = TEXT_ATTACKS) -> dict[str, Any]:  # fmt: skip
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
    out: dict[str, Any] = {"perplexity": perplexity(model, data.test.batch())}
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
        n_ex = int(audit.get("extraction", 100))
        types = [t for t in data.psi.types if t != CANARY_TYPE]
        rec = [(r.text, r.spans) for r in data.originals[:n_ex]]
        held = [(r.text, r.spans) for r in data.test.records[:n_ex]]
        generate = lm_generator(model, tok, L)
        out["extraction"] = extraction(generate, rec, span_types=types, heldout=held)
        # the control: the planted secrets, whose repeats a non-private model memorises
        out["extraction"]["canaries"] = {
            str(r): extraction(generate, [(c.text, [_secret_span(c)]) for c in data.canaries if c.repeats == r]
                               )["rate"] for r in sorted({c.repeats for c in data.canaries})}  # fmt: skip
    if "span" in attacks:
        targets = span_targets(data.originals, k=k, n=int(audit.get("span_targets", 200)))
        out["span_inference"] = span_inference(score, targets, epsilon=epsilon, delta=delta) if targets else None
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
                    device: str | None = None) -> tuple[dict[str, Any], torch.nn.Module]:  # fmt: skip
    """Train ``method`` on the text task at ``epsilon``, audit it; returns (the cell's row, the model)."""
    done = train_text_model(data=data, method=method, epsilon=epsilon, delta=delta, seed=seed, model=model,
                            params=params, device=device)  # fmt: skip
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


def cell_key(grid: Mapping[str, Any], method: str, epsilon: float | None, seed: int) -> str:
    """The hash of everything that determines one cell's result: the data, model, audits, δ and this method's
    settings, never the rest of the grid (a ``--methods`` subset or more ε reuse the cells they share)."""
    own = {k: grid[k] for k in ("task", "load", "model", "audit", "delta")}
    return settings_hash({**own, "method": method, "params": grid["methods"][method], "cell": [method, epsilon, seed]})


def run_text_compare(cfg: TextCompareConfig) -> dict[str, Any]:
    """Run (or reuse) every cell; write results.json, summary.md and text_privacy.png; return the summary."""
    preset = text_preset(cfg.quick)
    delta = cfg.delta if cfg.delta is not None else preset["delta"]
    load = data_options(preset, cfg.data)
    grid = {"task": TASK, "load": load, "model": preset["model"], "audit": preset["audit"], "delta": delta,
            "methods": {m: preset["methods"][m] for m in cfg.methods}, "epsilons": cfg.epsilons,
            "seeds": cfg.seeds}  # fmt: skip
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
    t_data = time.perf_counter()
    data = load_text_data(**load)
    say(f"{data.source}; {data.train.truncated} training texts cut at {data.train.max_len} tokens "
        f"({time.perf_counter() - t_data:.1f} s)")
    cells = [(m, None if not get_method(m).private else e, s) for m in cfg.methods
             for e in ([None] if not get_method(m).private else cfg.epsilons) for s in cfg.seeds]  # fmt: skip
    (cfg.out / "cells").mkdir(exist_ok=True)
    rows: list[dict[str, Any]] = []
    reused = 0
    started = time.perf_counter()
    for i, (method, eps, seed) in enumerate(cells, 1):
        key = cell_key(grid, method, eps, seed)
        path = cfg.out / "cells" / f"{method}__eps{eps if eps is not None else 'none'}__seed{seed}__{key}.json"
        if path.exists():
            rows.append(json.loads(path.read_text()))
            reused += 1
            continue
        if cfg.report_only:
            continue
        say(f"cell {i} of {len(cells)}: {method}, ε = {eps if eps is not None else '—'}, seed {seed} "
            f"({time.perf_counter() - started:.0f} s so far)")
        row, _ = train_text_cell(data=data, method=method, epsilon=eps, delta=delta, seed=seed,
                                 model=preset["model"], params=preset["methods"][method], audit=preset["audit"],
                                 device=cfg.device)  # fmt: skip
        atomic_write_json(path, row)
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"no finished cells of this comparison in {str(cfg.out)!r}")
    summary = summarize_text(rows)
    meta = {"source": data.source, "disclosure": data.psi.describe().hides, "model": text_model_spec(data,
            preset["model"]), "delta": delta, "quick": cfg.quick, "command": cfg.command,
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


def summarize_text(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per method × target ε: means over seeds of perplexity, exposure, extraction, span inference."""
    groups: dict[tuple[str, float | None], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["target_epsilon"]), []).append(r)
    out = []
    for (method, eps), rs in groups.items():
        ppl = [float(r["perplexity"]) for r in rs]
        ext = [r["extraction"] for r in rs]
        spi = [r["span_inference"] for r in rs if r.get("span_inference")]
        out.append({
            "method": method, "epsilon": eps, "seeds": len(rs),
            "epsilon_spent": _mean([r["epsilon"] for r in rs]),
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
    order = {m: i for i, m in enumerate(TEXT_METHODS)}
    out.sort(key=lambda r: (order.get(str(r["method"]), 99), cast(float, r["epsilon"] or 0.0)))
    return out
