"""Feature DP for text: a causal LM whose training texts' private spans are protected, the redacted text used freely.

The task (``featuredp compare --task text``, ``featuredp train --task text``; docs/text.md). A record is a text
with private spans (names, emails, phone numbers, ...); Ψ(x) is the text with each span replaced by its type's
placeholder (:class:`~featuredp.features.text.TextSpans`). With the per-example mean token NLL ℓ,

* ℓ(θ; x) = NLL of the full text x (its own tokenisation);
* ℓ_pub(θ; Ψ(x)) = NLL of the redacted text, a function of the public view only
  (:class:`~featuredp.losses.CausalLMSplit` through :class:`~featuredp.features.tokens.TokenView`);
* ℓ_priv = ℓ − ℓ_pub: what the span contents change. Algorithm 1 clips and noises ∇ℓ_priv; the public batch
  and public pre-training read Ψ(S) only. FDP (DP-SGD) pre-trains on Ψ(S) and then runs DP-SGD on ℓ.

Neighbours (add/remove, the default accounting): the run with a record and the run with only Ψ of that record
(its text with the spans replaced); the guarantee hides what the spans hold, never where they are, how many there
are, or the text around them. Telling two values of one span apart is the replace-one question
(``replacement_epsilon``).

The data is :mod:`featuredp.experiments.text_data` (:func:`load_text_data`); every trained model is audited by
:mod:`featuredp.experiments.text_audits` (canary exposure, extraction, span inference; targets drawn at random).
This module trains one model (:func:`train_text_model`, :func:`train_text_cell`) and runs the comparison.

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
from featuredp._validate import check_choice, check_open_unit, check_positive
from featuredp.engine import Trainer, init_seed
from featuredp.experiments.grid_config import settings_hash
from featuredp.experiments.presets import TEXT_PRESET, trainer_arguments, unit_settings
from featuredp.experiments.text_audits import (
    TEXT_ATTACKS,
    SpanTargets,
    audit_text_model,
    extraction_audit,
    extraction_targets,
    span_targets,
)
from featuredp.experiments.text_data import CANARY_TYPE, CORPUS_SPANS, TextData, load_text_data, text_model_spec
from featuredp.experiments.text_report import render_text_summary, text_privacy_plot
from featuredp.features.tokens import TokenView
from featuredp.losses import CausalLMSplit
from featuredp.methods import get_method
from featuredp.models import build_model

__all__ = [
    "CANARY_TYPE",
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
    users = data.users if record.private else None  # the unit of a private run: a user (--user-field) or a record
    units = len(data.train) if users is None else len(set(users))
    kwargs = trainer_arguments(record, {**fit_batches(params, units), **unit_settings(settings, users)},
                               epsilon=epsilon, delta=delta, device=device)  # fmt: skip
    t0 = time.perf_counter()
    trainer = Trainer(net, record.name, loss_split=split, public_seed=seed, progress=progress, user_key=users,
                      **kwargs)  # fmt: skip
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
                "no_power": all(bool(s.get("no_power")) for s in spi),
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
