"""One text model as a run (``featuredp train --task text``) and its audits (``featuredp audit RUN --attack ...``).

A text run directory holds run.json (``"task": "text"``, the Trainer's settings, plan and result, the model spec,
and how to rebuild the data: the JSONL path or the corpus's public seed, the private span types, the canaries'
public seed; never a private seed or RNG state) and model.pt. The SHA-256 of the data file is kept in the run's
private folder only, and the audit refuses a file whose bytes changed since training.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from featuredp._io import atomic_write_json, atomic_write_text, inside
from featuredp._validate import check_choice, check_int
from featuredp.accounting.group import group_bound
from featuredp.data.text import ByteTokenizer
from featuredp.errors import PrivacyLeakWarning, PrivacyRiskWarning
from featuredp.experiments.runs import (
    DATA_FINGERPRINT_FILE,
    Run,
    check_data_fingerprint,
    data_files_fingerprint,
    load_run,
    private_checkpoint,
    record_data_fingerprint,
    save_run,
)
from featuredp.experiments.text_lm import (
    TEXT_ATTACKS,
    TEXT_METHODS,
    audit_text_model,
    data_options,
    load_text_data,
    text_preset,
    train_text_model,
)
from featuredp.experiments.train_one import record_summary
from featuredp.lm import lm_generator, perplexity
from featuredp.methods import get_method
from featuredp.plan import TrainResult

__all__ = ["GROUP_STATS_KEY", "GROUP_STATS_WARNING", "NAMES_KEY", "REPEAT_WARNING", "TASK_KEY", "audit_text_run",
           "check_names", "generate_text", "group_guarantee", "is_text_run", "names_digest", "train_text_run"]

#: run.json's key that marks a text run
TASK_KEY = "task"
#: a private value held by more training records than this is warned about (it is a group: group privacy)
REPEAT_WARNING = 10
#: a group ε at or above this (a likelihood ratio of e^100) is no guarantee at all, and is said so
VACUOUS_EPSILON = 100.0
#: run.json's key that says whether the run was asked for the group statistics (the setting, never the numbers)
GROUP_STATS_KEY = "group_stats"
#: what ``--group-stats`` prints (and warns) before its numbers
GROUP_STATS_WARNING = ("--group-stats: the largest repeat and the group ε are computed from which private values "
                       "are equal across training records: they read the hidden part, are NOT covered by ε, and are "
                       "for the data owner's eyes only (not written to the run folder)")


def train_text_run(*, out: str | Path | None, method: str, epsilon: float | None, delta: float,
                   given: Mapping[str, Any], overrides: Mapping[str, Any], public_seed: int | None = None,
                   device: str | None = None, progress: bool = False, group_stats: bool = False,
                   **settings: Any) -> dict[str, Any]:  # fmt: skip
    """Train ``method`` on a text task, evaluate held-out perplexity, and save the run in ``out`` (if given).

    ``given``: :func:`~featuredp.experiments.text_lm.load_text_data` arguments from the flags (none: the generated
    corpus of the full preset; no canaries unless asked; a file is used whole unless ``n_train`` says);
    ``overrides``: Trainer arguments that replace the text preset's for ``method`` (``epochs``, ``lr``, ...);
    ``settings`` go to the Trainer as they are (``secure_rng``, ``noise_multiplier``, ...). Returns the summary the
    CLI prints.

    ``group_stats`` (``--group-stats``): also count which private values repeat across training records and state
    the group bound (``boundary["largest_repeat"]``, ``group``, ``group_notes``), with a
    :class:`~featuredp.errors.PrivacyLeakWarning` (:data:`GROUP_STATS_WARNING`). These read the hidden part: without
    the flag they are not computed, and even with it they are in the returned summary only, never in the run folder
    (run.json keeps the setting, :data:`GROUP_STATS_KEY`).
    """
    check_choice("method", method, TEXT_METHODS)
    preset = text_preset(False)
    opts = data_options(preset, {"canary_repeats": (), **dict(given)})
    data = load_text_data(**opts, group_stats=bool(group_stats))
    params = {**preset["methods"][method], **{k: v for k, v in overrides.items() if v is not None}}
    if settings.get("sharding", "none") != "none":
        params["strategy"] = "ghost"  # the preset's vmap cannot run through FSDP's hooks; ghost gives the same sums
    done = train_text_model(data=data, method=method, epsilon=epsilon, delta=delta, seed=public_seed,
                            model=preset["model"], params=params, device=device, progress=progress,
                            **settings)  # fmt: skip
    result = done.result
    group: dict[str, Any] | None = None
    group_lines: list[str] = []
    if group_stats:
        warnings.warn(PrivacyLeakWarning(GROUP_STATS_WARNING), stacklevel=2)
        group, group_lines = group_guarantee(result, data.boundary.get("largest_repeat", {}))
    _warn_boundary(data.boundary, list(data.options.get("detect") or ()), group_lines)
    metrics = {"perplexity": perplexity(done.model, data.test.batch()),
               "public_perplexity": perplexity(done.model, data.test.batch(), key="x_pub")}  # fmt: skip
    held = data.heldout
    summary = {
        "task": "text", "method": method, "epsilon": done.epsilon, "replacement_epsilon": done.replacement_epsilon,
        "relation": result.plan.relation, "delta": result.delta,
        "noise_multiplier": result.plan.noise_multiplier, "noise": result.plan.noise.kind, "bands": result.plan.bands,
        "correlated_noise": result.privacy_report.get("correlated_noise"), "max_grad_norm": result.plan.max_grad_norm,
        "sampling_rate": result.plan.sampling_rate, "steps": result.steps, "pretrain_steps": result.pretrain_steps,
        "unit": result.plan.unit, "records_per_user": result.plan.records_per_user,
        **record_summary(result),
        "guarantee": result.guarantee, "data": data.source, "private": data.psi.describe().hides,
        "train_texts": len(data.train), "test_texts": len(data.test), "truncated": data.train.truncated,
        "canaries": len(data.canaries), **metrics, "heldout_source": held["source"],
        "heldout_covered": held["covered"], "heldout_note": held["note"], "train_wall_s": round(done.wall_s, 1),
        "out": None, "boundary": data.boundary, GROUP_STATS_KEY: bool(group_stats),
        # How it ran: the same keys as run.json's config (and as the tabular task's summary).
        "world_size": 1 if done.trainer.dist is None else done.trainer.dist.world_size,
        "sharding": "fsdp" if done.trainer.run.sharded else "none", "strategy": done.trainer.strategy.name,
    }  # fmt: skip
    if group_stats:
        # statistics of the private values, asked for: in the summary (stdout) only, not in model.pt or run.json
        summary.update(group=group, group_notes=group_lines, group_stats_warning=GROUP_STATS_WARNING)
    if out is not None:
        save_run(out, done.trainer, result, model_spec=done.spec,
                 dataset={"task": "text", "options": data.options}, metrics=metrics,
                 extra={TASK_KEY: "text", "audit": preset["audit"], GROUP_STATS_KEY: bool(group_stats)})  # fmt: skip
        names = list(given.get("names") or ())
        # the names' digest sits with the data's fingerprint, in the private folder: run.json keeps only their count
        record_data_fingerprint(out, {**data_files_fingerprint(data.options),
                                      **({NAMES_KEY: names_digest(names)} if names else {})})  # fmt: skip
        summary["out"] = str(out)
    return summary


#: the key of the names list's digest in the run's private data fingerprint
NAMES_KEY = "names_sha256"


def names_digest(names: Sequence[str]) -> str:
    """SHA-256 of a ``--names-file`` list, whatever its order (kept in the run's private folder only)."""
    return hashlib.sha256("\n".join(sorted(names)).encode("utf-8")).hexdigest()


def _kept_names_digest(run: Run) -> str | None:
    """The names digest training kept privately for ``run`` (None: none kept, or unreadable)."""
    try:
        kept = json.loads((private_checkpoint(run.path).parent / DATA_FINGERPRINT_FILE).read_text(encoding="utf-8"))
        value = kept["sha256"].get(NAMES_KEY)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def check_names(run: Run, names: Sequence[str] | None) -> list[str]:
    """The names to rebuild ``run``'s private spans with (``--names-file``), checked against what training kept.

    A run trained with ``--detect name`` needs the same list: its count must equal run.json's ``names`` and, when
    training kept a digest of it privately, its digest too; anything else is refused with one line (other names
    would mark other spans private, and the audit would attack the wrong spans). A run without names takes none.
    """
    options = run.dataset.get("options") or {}
    count = int(options.get("names") or 0)
    given = list(names or ())
    if not count or "name" not in (options.get("detect") or ()):
        if given:
            raise ValueError(f"--names-file: run {run.path} was not trained with --detect name and a names list")
        return []
    if not given:
        raise ValueError(f"--names-file: run {run.path} found names with --detect name ({count} names); give the "
                         "same --names-file FILE (run.json keeps only their count)")  # fmt: skip
    if len(given) != count:
        raise ValueError(f"--names-file: {len(given)} names, but run {run.path} was trained with {count}; give the "
                         "list it was trained with")  # fmt: skip
    kept = _kept_names_digest(run)
    if kept is not None and kept != names_digest(given):
        raise ValueError(f"--names-file: not the list run {run.path} was trained with (its digest differs); give "
                         "that list")  # fmt: skip
    return given


def _warn_boundary(boundary: Mapping[str, Any], detect: list[str], group_lines: list[str]) -> None:
    """A detector that found nothing (and whose type nobody annotated), and (with ``--group-stats`` only: the
    boundary then holds ``largest_repeat``) a value in more than :data:`REPEAT_WARNING` records, are warned about
    before the summary."""
    for d in detect:
        if not boundary.get("detected", {}).get(d) and not boundary.get("annotated", {}).get(d):
            warnings.warn(PrivacyLeakWarning(
                f"--detect {d} found nothing in the training texts and no span of type {d} is annotated: if they "
                f"hold {d} values in a format the detector misses, those values are public under this Ψ "
                "(featuredp data scan FILE shows what it finds)"), stacklevel=3)  # fmt: skip
    for t, k in boundary.get("largest_repeat", {}).items():
        if k > REPEAT_WARNING:
            line = next((g for g in group_lines if g.startswith(f"values of type {t} ")), "")
            warnings.warn(PrivacyRiskWarning(
                f"a {t} value appears in {k} training records (more than {REPEAT_WARNING}): the guarantee's ε is "
                f"for one record, and those {k} records are a group. {line}".rstrip()), stacklevel=3)  # fmt: skip


def group_guarantee(result: TrainResult, largest_repeat: Mapping[str, int]) -> tuple[dict[str, Any] | None,
                                                                                     list[str]]:  # fmt: skip
    """The group bound of a run for each private type whose values repeat (k > 1 records), and the largest group.

    Returns (``{"type", "size", "epsilon", "delta", "accounting"}`` of the type with the largest k, or None when no
    value repeats; one sentence per repeating type). ε_k is :func:`featuredp.accounting.group.group_bound` of the
    plan's σ, rate and the private steps run, at the plan's δ plus the noise sampler's cut tail at ε_k (as for
    the run's own δ). Not computed (``epsilon`` None) for correlated noise (BandMF, BLT), for replace-one
    neighbours, or for non-private training; 0 for the public method (it reads Ψ(S) only).
    """
    groups = {t: int(k) for t, k in largest_repeat.items() if int(k) > 1}
    if not groups:
        return None, []
    plan = result.plan
    method = get_method(plan.method)
    eps_one = "∞" if math.isinf(result.epsilon) else f"{result.epsilon:.4g}"
    why_not = None
    if method.public_steps:
        why_not = ""
    elif not method.private or not plan.noise_multiplier or plan.delta is None:
        why_not = "non-private training: there is no ε, for one record or a group"
    elif plan.noise.correlated:
        why_not = f"the group bound is not computed for correlated noise ({plan.noise.kind})"
    elif plan.relation != "add-remove":
        why_not = "the group bound is computed for add/remove neighbours only"
    tail = float((result.privacy_report.get("noise_sampler") or {}).get("tail_mass") or 0.0)
    lines: list[str] = []
    found: dict[str, dict[str, Any]] = {}
    for t, k in sorted(groups.items(), key=lambda kv: -kv[1]):
        head = f"values of type {t} repeat in up to {k} records: such a value is a group of {k} records"
        if why_not == "":
            found[t] = {"type": t, "size": k, "epsilon": 0.0, "delta": 0.0, "accounting": "public: reads Ψ(S) only"}
            lines.append(f"{head}; the public method reads only Ψ(S), so the group is covered at (0, 0) too")
            continue
        if why_not is not None:
            found[t] = {"type": t, "size": k, "epsilon": None, "delta": None, "accounting": why_not}
            lines.append(f"{head}; {why_not}")
            continue
        # why_not is None: a private plan with σ > 0 and δ (checked above)
        bound = group_bound(float(plan.noise_multiplier or 0.0), plan.sampling_rate, result.steps,
                            float(plan.delta or 0.0), k, accountant=plan.accountant)  # fmt: skip
        delta = float(plan.delta or 0.0) + (math.inf if bound.epsilon > 700 else (1 + math.exp(bound.epsilon)) * tail)
        found[t] = {"type": t, "size": k, "epsilon": bound.epsilon, "delta": delta, "accounting": bound.method}
        if delta >= 1.0 or bound.epsilon >= VACUOUS_EPSILON:
            lines.append(f"{head}; ε = {eps_one} covers one record, and there is no meaningful guarantee for a "
                         f"group of {k} (ε_{k} = {bound.epsilon:.4g}, δ = {delta:.3g}): a person who wrote {k} "
                         "records is not protected as a person; train at user level with --user-field F (records "
                         "per person: featuredp data scan --user-field F)")  # fmt: skip
            continue
        lines.append(f"{head}; ε = {eps_one} covers one record, the group of {k} is covered at ε_{k} = "
                     f"{bound.epsilon:.4g} (δ = {delta:.3g}; {bound.method} accounting)")
    top = max(groups, key=lambda t: groups[t])
    return found[top], lines


def is_text_run(run: Run) -> bool:
    """Whether ``run`` was trained by :func:`train_text_run`."""
    return run.info.get(TASK_KEY) == "text"


def audit_text_run(run_dir: str | Path, attack: str, *, out: str | Path | None = None,
                   names: Sequence[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run one of :data:`~featuredp.experiments.text_lm.TEXT_ATTACKS` on a text run; write JSON and Markdown.

    The data is rebuilt from run.json (the JSONL file, whose bytes must be those the run was trained on, or the
    generated corpus from its public seed) and the canaries from their public seed; ``names``: the
    ``--names-file`` list of a run trained with ``--detect name`` (:func:`check_names`).
    """
    attack = check_choice("--attack", attack, TEXT_ATTACKS)
    run = load_run(run_dir)
    if not is_text_run(run):
        raise ValueError(f"--attack {attack} audits a text run (featuredp train --task text); {run.path} is not one")
    check_data_fingerprint(run)
    options = dict(run.dataset.get("options") or {})
    # run.json counts the --names-file names but never keeps them (they may be users' names)
    options["names"] = check_names(run, names)
    if attack == "exposure" and not options.get("canary_repeats"):
        raise ValueError("--attack exposure: this run was trained without canaries; train it with --canaries 1,10,100")
    data = load_text_data(**options)
    eps = None if math.isinf(run.epsilon) else run.epsilon
    delta = float(run.plan.delta) if run.plan is not None and run.plan.delta else None
    res = audit_text_model(run.model, data, epsilon=eps, delta=delta if eps is not None else None,
                           audit=run.info.get("audit") or text_preset(False)["audit"], attacks=(attack,))  # fmt: skip
    payload = {"attack": attack, "method": run.info.get("method"), "epsilon_claimed": eps, "delta": delta,
               "run_dir": str(run.path), **res, "heldout_covered": data.heldout["covered"]}  # fmt: skip
    out_dir = Path(out) if out is not None else run.path / "audit"
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(inside(out_dir, f"text_{attack}.json"), payload)
    atomic_write_text(inside(out_dir, f"text_{attack}.md"), render_text_audit(payload))
    payload["report_files"] = [str(out_dir / f"text_{attack}.json"), str(out_dir / f"text_{attack}.md")]
    return payload


def generate_text(run_dir: str | Path, prompts: Sequence[str], *, max_new_tokens: int = 60,
                  temperature: float = 0.0, samples: int = 1, seed: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """Continuations of each prompt by a trained text run's model (``featuredp generate``): greedy, or ``samples``
    draws at ``temperature`` from the public ``seed`` (the model is what the run released: generating from it reads
    no private data). Returns ``[{"prompt", "continuations": [...]}]``; the model's context is the run's max_len."""
    run = load_run(run_dir)
    if not is_text_run(run):
        raise ValueError(f"--run: {run.path} is not a text run (featuredp train --task text)")
    if not prompts:
        raise ValueError("--prompt: give at least one prompt")
    samples = check_int("--samples", samples, minimum=1)
    if temperature == 0.0 and samples > 1:
        raise ValueError(f"--samples {samples} with --temperature 0: greedy decoding has one continuation per "
                         "prompt; give --temperature > 0 to sample")  # fmt: skip
    max_len = int((run.dataset.get("options") or {}).get("max_len") or 128)
    generator = torch.Generator().manual_seed(int(seed))
    generate = lm_generator(run.model, ByteTokenizer(), max_len, temperature=temperature, generator=generator)
    return [{"prompt": p, "continuations": [generate(p, max_new_tokens) for _ in range(samples)]} for p in prompts]


def render_text_audit(p: Mapping[str, Any]) -> str:
    """A short Markdown report of one text audit."""
    eps = p["epsilon_claimed"]
    head = [f"# Text audit: {p['attack']}", "",
            f"Run {p['run_dir']}: method {p['method']}, ε = {'∞' if eps is None else f'{eps:.3g}'}; held-out "
            f"perplexity {p['perplexity']:.3f} ({(p.get('heldout') or {}).get('note', 'held-out texts')}).",
            ""]  # fmt: skip
    return "\n".join(head + text_audit_lines(p)) + "\n"


def text_audit_lines(p: Mapping[str, Any]) -> list[str]:
    """The lines that state one text audit's result (for the report and the CLI)."""
    if p["attack"] == "exposure":
        e = p["exposure"]
        by = ", ".join(f"{k}×: {v['mean_exposure']:.2f}" for k, v in e["by_repeats"].items())
        return [f"exposure (bits, mean per repeat count) {by}; maximum {e['max_exposure']:.2f}, a model that knows "
                f"nothing {e['chance_exposure']:.2f} (candidate space {e['space_size']:,})"]
    if p["attack"] == "extraction":
        x = p["extraction"]
        held = x.get("heldout") or {}
        # a rate is None when the texts tried hold no private span
        pct = {k: "—" if r is None else f"{100 * r:.1f}%"
               for k, r in (("train", x["rate"]), ("held", held.get("rate")))}  # fmt: skip
        drawn = x.get("targets") or {}
        lines = [f"extraction: {x['extracted']} of {x['tried']} private spans of training texts reproduced exactly "
                 f"({pct['train']}); held-out texts {pct['held']} (guessable values); "
                 f"{drawn.get('train', '?')} training and {drawn.get('heldout', '?')} held-out texts drawn at random"]
        for bucket, b in (x.get("by_user_records") or {}).items():  # user level (--user-field)
            lines.append(f"  texts of users with {bucket} training record(s): {b['extracted']} of {b['tried']} "
                         "spans reproduced")
        return lines
    s = p["span_inference"]
    skipped = "; ".join(f"{t}: {why}" for t, why in (p.get("span_skipped") or {}).items())
    if s is None:
        return [f"span inference: no span type with enough distinct values to draw candidates from ({skipped})"]
    bound = "no bound (not private)" if s["bound"] is None else f"Theorem 4's bound {100 * s['bound']:.1f}%"
    verdict = "" if s["violates"] is None else (" — EXCEEDS THE BOUND" if s["violates"] else " — within the bound")
    if s.get("no_power") and not s["violates"]:
        verdict = " — no power (no better than the prior without the model: it cannot show a leak)"
    lines = [f"span inference: {100 * s['accuracy']:.1f}% of {s['n']} targets drawn at random (95% CI lower "
             f"{100 * s['accuracy_lower']:.1f}%), prior (best guess without the model) "
             f"{100 * s['prior_baseline']:.1f}%, {bound}{verdict}"]
    for g, b in (s.get("by_group") or {}).items():
        lines.append(f"  true value held by {g} training record(s): {100 * b['accuracy']:.1f}% of {b['n']} "
                     f"(prior {100 * b['prior_baseline']:.1f}%)")
    for g, b in (s.get("by_user_records") or {}).items():  # user level (--user-field)
        lines.append(f"  texts of users with {g} training record(s): {100 * b['accuracy']:.1f}% of {b['n']} "
                     f"(prior {100 * b['prior_baseline']:.1f}%)")
    if skipped:
        lines.append(f"  not targeted: {skipped}")
    return lines
