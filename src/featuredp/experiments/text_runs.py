"""One text model as a run (``featuredp train --task text``) and its audits (``featuredp audit RUN --attack ...``).

A text run directory holds run.json (``"task": "text"``, the Trainer's settings, plan and result, the model spec,
and how to rebuild the data: the JSONL path or the corpus's public seed, the private span types, the canaries'
public seed; never a private seed or RNG state) and model.pt. The SHA-256 of the data file is kept in the run's
private folder only, and the audit refuses a file whose bytes changed since training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from featuredp._io import atomic_write_json, atomic_write_text, inside
from featuredp._validate import check_choice
from featuredp.experiments.runs import (
    Run,
    check_data_fingerprint,
    data_files_fingerprint,
    load_run,
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
from featuredp.lm import perplexity

__all__ = ["TASK_KEY", "audit_text_run", "is_text_run", "train_text_run"]

#: run.json's key that marks a text run
TASK_KEY = "task"


def train_text_run(*, out: str | Path | None, method: str, epsilon: float | None, delta: float,
                   given: Mapping[str, Any], overrides: Mapping[str, Any], public_seed: int | None = None,
                   device: str | None = None, progress: bool = False, **settings: Any) -> dict[str, Any]:  # fmt: skip
    """Train ``method`` on a text task, evaluate held-out perplexity, and save the run in ``out`` (if given).

    ``given``: :func:`~featuredp.experiments.text_lm.load_text_data` arguments from the flags (none: the generated
    corpus of the full preset; no canaries unless asked; a file is used whole unless ``n_train`` says);
    ``overrides``: Trainer arguments that replace the text preset's for ``method`` (``epochs``, ``lr``, ...);
    ``settings`` go to the Trainer as they are (``secure_rng``, ``noise_multiplier``, ...). Returns the summary the
    CLI prints.
    """
    check_choice("method", method, TEXT_METHODS)
    preset = text_preset(False)
    opts = data_options(preset, {"canary_repeats": (), **dict(given)})
    data = load_text_data(**opts)
    params = {**preset["methods"][method], **{k: v for k, v in overrides.items() if v is not None}}
    done = train_text_model(data=data, method=method, epsilon=epsilon, delta=delta, seed=public_seed,
                            model=preset["model"], params=params, device=device, progress=progress,
                            **settings)  # fmt: skip
    result = done.result
    metrics = {"perplexity": perplexity(done.model, data.test.batch()),
               "public_perplexity": perplexity(done.model, data.test.batch(), key="x_pub")}  # fmt: skip
    summary = {
        "task": "text", "method": method, "epsilon": done.epsilon, "replacement_epsilon": done.replacement_epsilon,
        "relation": result.plan.relation, "delta": result.delta,
        "noise_multiplier": result.plan.noise_multiplier, "noise": result.plan.noise, "bands": result.plan.bands,
        "correlated_noise": result.privacy_report.get("correlated_noise"), "max_grad_norm": result.plan.max_grad_norm,
        "sampling_rate": result.plan.sampling_rate, "steps": result.steps, "pretrain_steps": result.pretrain_steps,
        "guarantee": result.guarantee, "data": data.source, "private": data.psi.describe().hides,
        "train_texts": len(data.train), "test_texts": len(data.test), "truncated": data.train.truncated,
        "canaries": len(data.canaries), **metrics, "train_wall_s": round(done.wall_s, 1), "out": None,
    }  # fmt: skip
    if out is not None:
        save_run(out, done.trainer, result, model_spec=done.spec,
                 dataset={"task": "text", "options": data.options}, metrics=metrics,
                 extra={TASK_KEY: "text", "audit": preset["audit"]})  # fmt: skip
        record_data_fingerprint(out, data_files_fingerprint(data.options))
        summary["out"] = str(out)
    return summary


def is_text_run(run: Run) -> bool:
    """Whether ``run`` was trained by :func:`train_text_run`."""
    return run.info.get(TASK_KEY) == "text"


def audit_text_run(run_dir: str | Path, attack: str, *, out: str | Path | None = None) -> dict[str, Any]:
    """Run one of :data:`~featuredp.experiments.text_lm.TEXT_ATTACKS` on a text run; write JSON and Markdown.

    The data is rebuilt from run.json (the JSONL file, whose bytes must be those the run was trained on, or the
    generated corpus from its public seed) and the canaries from their public seed.
    """
    attack = check_choice("--attack", attack, TEXT_ATTACKS)
    run = load_run(run_dir)
    if not is_text_run(run):
        raise ValueError(f"--attack {attack} audits a text run (featuredp train --task text); {run.path} is not one")
    check_data_fingerprint(run)
    options = dict(run.dataset.get("options") or {})
    # run.json counts the --names-file names but never keeps them (they may be users' names)
    if options.pop("names", 0) and "name" in (options.get("detect") or ()):
        raise ValueError(f"--attack {attack}: run {run.path} found names with --detect name, whose list run.json does "
                         "not keep, so its private spans cannot be rebuilt")  # fmt: skip
    if attack == "exposure" and not options.get("canary_repeats"):
        raise ValueError("--attack exposure: this run was trained without canaries; train it with --canaries 1,10,100")
    data = load_text_data(**options)
    eps = None if math.isinf(run.epsilon) else run.epsilon
    delta = float(run.plan.delta) if run.plan is not None and run.plan.delta else None
    res = audit_text_model(run.model, data, epsilon=eps, delta=delta if eps is not None else None,
                           audit=run.info.get("audit") or text_preset(False)["audit"], attacks=(attack,))  # fmt: skip
    payload = {"attack": attack, "method": run.info.get("method"), "epsilon_claimed": eps, "delta": delta,
               "run_dir": str(run.path), **res}  # fmt: skip
    out_dir = Path(out) if out is not None else run.path / "audit"
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(inside(out_dir, f"text_{attack}.json"), payload)
    atomic_write_text(inside(out_dir, f"text_{attack}.md"), render_text_audit(payload))
    payload["report_files"] = [str(out_dir / f"text_{attack}.json"), str(out_dir / f"text_{attack}.md")]
    return payload


def render_text_audit(p: Mapping[str, Any]) -> str:
    """A short Markdown report of one text audit."""
    eps = p["epsilon_claimed"]
    head = [f"# Text audit: {p['attack']}", "",
            f"Run {p['run_dir']}: method {p['method']}, ε = {'∞' if eps is None else f'{eps:.3g}'}; held-out "
            f"perplexity {p['perplexity']:.3f}.", ""]  # fmt: skip
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
        return [f"extraction: {x['extracted']} of {x['tried']} private spans of training texts reproduced exactly "
                f"({pct['train']}); held-out texts {pct['held']} (guessable values)"]
    s = p["span_inference"]
    if s is None:
        return ["span inference: no span type with enough distinct values to draw candidates from"]
    bound = "no bound (not private)" if s["bound"] is None else f"Theorem 4's bound {100 * s['bound']:.1f}%"
    verdict = "" if s["violates"] is None else (" — EXCEEDS THE BOUND" if s["violates"] else " — within the bound")
    return [f"span inference: {100 * s['accuracy']:.1f}% of {s['n']} targets (95% CI lower "
            f"{100 * s['accuracy_lower']:.1f}%), prior {100 * s['prior_baseline']:.1f}%, {bound}{verdict}"]
